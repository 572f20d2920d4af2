"""Restoring a container snapshot before its memory is all fetched (issue 24's lazy fetch):
real engine processes sharing a bucket of a real S3 server (SeaweedFS), a real FUSE mount,
the lazy-pages server reading the pages through it. The hold point ``lazy.fill`` parks
the lazy server's own fill, so everything the restored sandbox reads comes from its reads.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import EngineProcess
from s3_server import SeaweedS3, new_prefix, s3_server
from sandfork.sdk import Sandbox
from store_engines import HANG, containers, s3_args, wait_for_storage

__all__ = ["containers", "s3_server"]

HELD_MIB = 96
MAKE = (
    "import numpy as np\n"
    f"held = np.random.default_rng(5).integers(0, 256, {HELD_MIB} << 20, dtype=np.uint8)"
)
SUM = "int(held.sum()), int(held[::4097].sum())"


@pytest.fixture(autouse=True)
def fuse() -> None:
    from sandfork.engine.lazy_servers import unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no lazy fetch here: {reason}")


@pytest.fixture
def engines(
    containers: None,
    s3_server: SeaweedS3,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[tuple[EngineProcess, EngineProcess]]:
    """Engines A and B on one bucket (B's options and environment: the test's
    ``b_options`` mark, its arguments and its ``env``)."""
    mark = request.node.get_closest_marker("b_options")
    prefix = new_prefix()
    made = []
    for name in ("a", "b"):
        home = tmp_path_factory.mktemp(name) / "home"
        home.mkdir(mode=0o700)
        more = mark.args if mark is not None and name == "b" else ()
        engine = EngineProcess(home, *s3_args(s3_server, prefix), *more)
        engine.env = s3_server.env
        if mark is not None and name == "b":
            engine.env = {**engine.env, **mark.kwargs.get("env", {})}
        made.append(engine)
    a, b = made
    a.start()
    try:
        b.start()
        try:
            yield a, b
        finally:
            b.close()
    finally:
        a.close()


def snapshot_holding_data(a: EngineProcess) -> tuple[str, str]:
    """A durable snapshot of a container sandbox holding ``HELD_MIB`` MiB, and its sums."""
    box = Sandbox.create(backend="container", memory_mb=HELD_MIB + 512, client=a.client())
    try:
        ctx = box.create_code_context()
        ctx.run_code(MAKE)
        sums = ctx.run_code(SUM).text
        snapshot_id = box.snapshot().id
    finally:
        box.kill()
    wait_for_storage(a.client(), snapshot_id, "durable")
    return snapshot_id, sums


def restores_with(engine: EngineProcess, snapshot_id: str, sums: str) -> None:
    """A sandbox restored from ``snapshot_id`` on ``engine`` holds the data of ``sums``."""
    copy = Sandbox.create(from_snapshot=snapshot_id, client=engine.client())
    try:
        assert copy.create_code_context().run_code(SUM).text == sums
    finally:
        copy.kill()


def pages_file(engine: EngineProcess, snapshot_id: str) -> Path:
    return next((engine.home / "snapshots" / snapshot_id / "images").glob("pages-*.img"))


def wait_until(done: object, what: str) -> None:
    deadline = time.monotonic() + HANG
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def lazy_mounts(engine: EngineProcess) -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if f"{engine.home}/lazy/" in line]


@pytest.mark.container
def test_a_restore_runs_on_pages_read_through_the_mount_before_the_fill(
    engines: tuple[EngineProcess, EngineProcess],
) -> None:
    a, b = engines
    snapshot_id, sums = snapshot_holding_data(a)
    marker = b.home / "lazy" / f"{snapshot_id}.filling"
    with b.holding("lazy.fill") as parked:
        copy = Sandbox.create(from_snapshot=snapshot_id, client=b.client())
        try:
            parked()  # the server's fill has not placed a chunk
            assert copy.create_code_context().run_code(SUM).text == sums
            assert marker.exists() and lazy_mounts(b)
        finally:
            copy.kill()
    wait_until(lambda: not marker.exists(), "the fill never ended")
    assert pages_file(b, snapshot_id).read_bytes() == pages_file(a, snapshot_id).read_bytes()
    wait_until(lambda: not lazy_mounts(b), "the lazy server stayed mounted")
    restores_with(b, snapshot_id, sums)  # from the local files


@pytest.mark.container
def test_a_sandbox_restored_lazily_outlives_its_engine_killed_mid_fill(
    engines: tuple[EngineProcess, EngineProcess],
) -> None:
    a, b = engines
    snapshot_id, sums = snapshot_holding_data(a)
    with b.holding("lazy.fill") as parked:
        copy = Sandbox.create(from_snapshot=snapshot_id, client=b.client())
        parked()
        b.stop(signal.SIGKILL)
        assert os.path.exists(b.home / "lazy" / f"{snapshot_id}.filling")
        b.start()  # adopts the sandbox; drops the snapshot it never finished filling
    assert b.client().request("GET", f"/sandboxes/{copy.id}")["status"] == "running"
    ctx = Sandbox.get(copy.id, client=b.client()).create_code_context()
    assert ctx.run_code(SUM).text == sums  # its pages came through the old server
    snapshots = [s["id"] for s in b.client().request("GET", "/snapshots")["snapshots"]]
    assert snapshot_id not in snapshots
    assert not (b.home / "snapshots" / snapshot_id).exists()
    try:
        restores_with(b, snapshot_id, sums)  # fetched anew
    finally:
        b.client().request("DELETE", f"/sandboxes/{copy.id}")
    wait_until(lambda: not lazy_mounts(b), "a lazy server stayed mounted")


@pytest.mark.container
@pytest.mark.b_options("--EngineConfig.lazy_fetch=False")
def test_an_engine_told_not_to_fetch_lazily_fetches_the_whole_snapshot_first(
    engines: tuple[EngineProcess, EngineProcess],
) -> None:
    a, b = engines
    snapshot_id, sums = snapshot_holding_data(a)
    restores_with(b, snapshot_id, sums)
    assert not (b.home / "lazy").exists()  # no server, no marker: it was all here first
    assert pages_file(b, snapshot_id).read_bytes() == pages_file(a, snapshot_id).read_bytes()


@pytest.mark.container
def test_a_lazy_restore_rides_out_a_store_outage_before_its_pages_came(
    engines: tuple[EngineProcess, EngineProcess], s3_server: SeaweedS3
) -> None:
    a, b = engines
    snapshot_id, sums = snapshot_holding_data(a)
    log = b.home / "engine.log"
    with b.holding("lazy.fill"), ThreadPoolExecutor(1) as pool:
        with b.holding("restore.in_use") as at_restore:
            restored = pool.submit(Sandbox.create, from_snapshot=snapshot_id, client=b.client())
            at_restore()  # mounted; not a page of its memory fetched yet
            s3_server.kill()
            seen = len(log.read_bytes())
        try:  # the restore reads its pages from a store that is gone

            def outage_met() -> bool:
                return b"the store failed" in log.read_bytes()[seen:]

            wait_until(lambda: outage_met() or restored.done(), "the restore hung")
            assert outage_met(), "no read of the restore met the outage"
        finally:
            s3_server.start()
        copy = restored.result()
    try:
        assert copy.create_code_context().run_code(SUM).text == sums
    finally:
        copy.kill()
    wait_until(lambda: not (b.home / "lazy" / f"{snapshot_id}.filling").exists(), "no fill")
    assert pages_file(b, snapshot_id).read_bytes() == pages_file(a, snapshot_id).read_bytes()


@pytest.mark.container
def test_restores_at_once_of_a_snapshot_still_filling_share_one_fetch(
    engines: tuple[EngineProcess, EngineProcess],
) -> None:
    a, b = engines
    snapshot_id, sums = snapshot_holding_data(a)
    with b.holding("lazy.fill") as parked, ThreadPoolExecutor(3) as pool:
        restores = [
            pool.submit(Sandbox.create, from_snapshot=snapshot_id, client=b.client())
            for _ in range(3)
        ]
        try:
            copies = [restore.result() for restore in restores]
            parked()
            assert len(lazy_mounts(b)) == 1  # one fetch, one server, for all three
            answers = pool.map(lambda c: c.create_code_context().run_code(SUM).text, copies)
            assert list(answers) == [sums] * 3
        finally:
            for restore in restores:
                if restore.exception() is None:
                    restore.result().kill()
    wait_until(lambda: not lazy_mounts(b), "the lazy server stayed mounted")
    assert pages_file(b, snapshot_id).read_bytes() == pages_file(a, snapshot_id).read_bytes()


@pytest.mark.container
@pytest.mark.b_options(env={"SANDFORK_CRASH_AT": "lazy.mount"})
def test_a_lazy_server_that_dies_before_it_mounts_leaves_the_fetch_whole(
    engines: tuple[EngineProcess, EngineProcess],
) -> None:
    a, b = engines
    snapshot_id, sums = snapshot_holding_data(a)
    restores_with(b, snapshot_id, sums)
    assert b"did not mount" in (b.home / "engine.log").read_bytes()
    assert not lazy_mounts(b) and not list((b.home / "lazy").glob("*.filling"))
    assert pages_file(b, snapshot_id).read_bytes() == pages_file(a, snapshot_id).read_bytes()
