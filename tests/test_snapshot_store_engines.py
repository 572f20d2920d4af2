"""Snapshots in S3 between real engine processes (issue 24): two engines with their own
state folders share one bucket on a real S3 server (SeaweedFS); a snapshot taken on one
becomes ``durable`` and restores on the other with its files and its kernel's variables; an
upload cut off by the store resumes after an engine restart; a store the engine cannot use
stops it at its start with one clear line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import EngineProcess
from s3_server import BUCKET, SeaweedS3, new_prefix, s3_server
from sandfork.paths import cache_dir
from sandfork.sdk import Sandbox
from store_engines import HANG, containers, s3_args, storage, wait_for_storage

__all__ = ["containers", "s3_server"]


def s3_engine(home: Path, s3: SeaweedS3, prefix: str, bucket: str = BUCKET) -> EngineProcess:
    home.mkdir(mode=0o700)
    engine = EngineProcess(home, *s3_args(s3, prefix, bucket))
    engine.env = s3.env
    return engine


@pytest.fixture
def two_engines(
    containers: None, s3_server: SeaweedS3, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[EngineProcess, EngineProcess, str]]:
    prefix = new_prefix()
    # Short folders: a container's capture binds a socket there (at most 107 bytes).
    a = s3_engine(tmp_path_factory.mktemp("a") / "home", s3_server, prefix)
    b = s3_engine(tmp_path_factory.mktemp("b") / "home", s3_server, prefix)
    a.start()
    try:
        b.start()
        try:
            yield a, b, prefix
        finally:
            b.close()
    finally:
        a.close()


@pytest.mark.container
def test_a_snapshot_taken_on_one_engine_restores_on_another(
    two_engines: tuple[EngineProcess, EngineProcess, str], s3_server: SeaweedS3
) -> None:
    a, b, prefix = two_engines
    box = Sandbox.create(backend="container", client=a.client())
    try:
        box.filesystem.write("/root/note.txt", "written on A")
        box.create_code_context().run_code("answer = 6 * 7")
        snapshot_id = box.snapshot(name="travels").id
        wait_for_storage(a.client(), snapshot_id, "durable")
    finally:
        box.kill()
    assert f"{prefix}manifests/{snapshot_id}.json" in s3_server.keys(prefix)
    assert not (b.home / "snapshots" / snapshot_id).exists()
    copy = Sandbox.create(from_snapshot=snapshot_id, client=b.client())
    try:
        assert copy.filesystem.read_text("/root/note.txt") == "written on A"
        assert copy.create_code_context().run_code("answer").text == "42"
    finally:
        copy.kill()
    assert storage(b.client(), snapshot_id) == "durable"
    fetched = b.client().request("GET", f"/snapshots/{snapshot_id}")
    assert fetched["name"] == "travels" and fetched["parent_id"] is None


@pytest.mark.container
def test_an_upload_the_store_cut_off_resumes_after_an_engine_restart(
    two_engines: tuple[EngineProcess, EngineProcess, str], s3_server: SeaweedS3
) -> None:
    a, _, prefix = two_engines
    box = Sandbox.create(backend="container", client=a.client())
    try:
        box.filesystem.write("/root/note.txt", "kept")
        s3_server.kill()
        try:
            snapshot_id = box.snapshot().id
            assert storage(a.client(), snapshot_id) == "uploading"
            log = a.home / "engine.log"
            deadline = time.monotonic() + HANG
            while f"upload of snapshot {snapshot_id} failed" not in log.read_text():
                assert time.monotonic() < deadline, "the failed upload was not logged"
                time.sleep(0.1)
            assert storage(a.client(), snapshot_id) == "uploading"
            a.stop()  # the engine goes away with the upload not done
        finally:
            s3_server.start()
        assert not any("manifests/" in key for key in s3_server.keys(prefix))
        a.start()  # adopts the sandbox and resumes the upload
        wait_for_storage(a.client(), snapshot_id, "durable")
        assert f"resuming the upload of snapshot {snapshot_id}" in log.read_text()
    finally:
        a.client().request("DELETE", f"/sandboxes/{box.id}")  # the restarted engine's address


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("secret", "the S3 server refused this engine's credentials"),
        ("bucket", "the bucket 'no-such-bucket' does not exist"),
    ],
)
def test_a_store_the_engine_cannot_use_stops_its_start(
    s3_server: SeaweedS3, tmp_path: Path, setting: str, message: str
) -> None:
    bucket = "no-such-bucket" if setting == "bucket" else BUCKET
    engine = s3_engine(tmp_path / "engine", s3_server, new_prefix(), bucket)
    if setting == "secret":
        engine.env = {**s3_server.env, "AWS_SECRET_ACCESS_KEY": "wrong"}
    try:
        with pytest.raises(RuntimeError, match="engine exited") as e:
            engine.start()
    finally:
        engine.close()  # its RAM folder, made before it failed
    line = next(x for x in str(e.value).splitlines() if x.startswith("sandfork: error:"))
    assert line.startswith("sandfork: error: the snapshot store cannot be used: ")
    assert message in line
    assert not (tmp_path / "engine" / "run" / "engine.json").exists()


@pytest.mark.container
def test_a_host_without_the_template_gets_it_with_the_snapshot(
    two_engines: tuple[EngineProcess, EngineProcess, str], s3_server: SeaweedS3, tmp_path: Path
) -> None:
    a, _, prefix = two_engines
    # A new host: a cache of its own with nothing built (CRIU installed, as setup does), and
    # an apt mirror that refuses, so that a template build there fails at once.
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "criu").symlink_to(cache_dir() / "criu")
    fresh = s3_engine(tmp_path / "fresh", s3_server, prefix)
    fresh.env = {
        **s3_server.env,
        "SANDFORK_CACHE_DIR": str(cache),
        "SANDFORK_APT_MIRROR": "http://127.0.0.1:9",
    }
    box = Sandbox.create(backend="container", client=a.client())
    try:
        box.create_code_context().run_code("answer = 6 * 7")
        snapshot_id = box.snapshot().id
        wait_for_storage(a.client(), snapshot_id, "durable")
    finally:
        box.kill()
    assert any(key.startswith(f"{prefix}manifests/template-") for key in s3_server.keys(prefix))
    fresh.start()
    try:
        copy = Sandbox.create(from_snapshot=snapshot_id, client=fresh.client())
        assert copy.create_code_context().run_code("answer").text == "42"
        copy.kill()
        log = (fresh.home / "engine.log").read_text()
        assert "fetched template 'code-interpreter'" in log
        assert list((cache / "rootfs").iterdir())  # imported, not built
    finally:
        fresh.close()
