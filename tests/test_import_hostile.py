"""Hostile snapshot files and template names: an import trusts nothing (issue 9).

The files are crafted here, as an attacker would: a zstd tar of members and a manifest. Most
tests unpack them with the exchange module itself; the rest post them to a real engine (no
VM is started) to see the status, the message and that nothing stays behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import sqlite3
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import zstandard

from conftest import EngineProcess
from sandfork.backends.vm.images import Qcow2Images
from sandfork.engine.errors import BadRequest
from sandfork.engine.exchange import (
    FORMAT,
    MANIFEST,
    ImportLimits,
    check_layers,
    unpack,
)
from sandfork.engine.manifest import parse_manifest
from sandfork.protocol import MIN_MEMORY_MB
from sandfork.templates import BuiltTemplate, ensure_template

MIB = 2**20
IMAGES = Qcow2Images()  # what the VM backend uses
LIMITS = ImportLimits(max_memory_mb=1024, max_cpus=4, max_bytes=64 * MIB)
ORIGINAL_ID = "snap_0123456789abcdef"
Entries = list[tuple[str, bytes]]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def qcow2(path: Path, *options: str, size: str = "64M") -> bytes:
    """A fresh qcow2 image's bytes (``options`` go to ``qemu-img create``)."""
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", *options, str(path), size], check=True
    )
    return path.read_bytes()


def members(tmp_path: Path, layer: bytes | None = None) -> dict[str, bytes]:
    """The members of a well-formed snapshot file; the memory image mostly zeros."""
    return {
        "devices.state": b"QEVM" + os.urandom(4096),
        "memory.img": bytes(32 * MIB) + b"tail",
        "layer0.qcow2": layer if layer is not None else qcow2(tmp_path / "layer.qcow2"),
        "attachment.notebook.ipynb": b'{"cells": []}',
    }


def manifest(files: dict[str, bytes], keys: tuple[str, str] = ("b", "r")) -> dict[str, Any]:
    """The manifest an honest exporter writes for ``files``."""
    return {
        "format": FORMAT,
        "snapshot": {
            "id": ORIGINAL_ID,
            "name": "crafted",
            "created_at": "2026-01-01T00:00:00+00:00",
            "sandbox_id": "sbx_0123456789abcdef",
            "template": "code-interpreter",
            "parent_id": None,
            "vm": {
                "kernel": "/elsewhere/vmlinux",
                "initrd": "/elsewhere/initrd",
                "cmdline": "console=ttyS0",
                "memory_mb": 256,
                "cpus": 1,
                "accelerator": "kvm",
            },
            "size_bytes": 1,
            "paused_ms": 3,
            "contexts": ["0123abcd4567"],
            "metadata": {"notebook_path": "a.ipynb"},
            "attachments": ["notebook.ipynb"],
        },
        "boot_key": keys[0],
        "rootfs_key": keys[1],
        "layers": 1,
        "members": {name: {"size": len(d), "sha256": _sha256(d)} for name, d in files.items()},
    }


def entries(doc: dict[str, Any], files: dict[str, bytes]) -> Entries:
    """Manifest first, then the members."""
    return [(MANIFEST, json.dumps(doc).encode()), *files.items()]


def archive(path: Path, items: Entries) -> Path:
    """Write ``items`` as a zstd tar."""
    with (
        path.open("wb") as raw,
        zstandard.ZstdCompressor().stream_writer(raw) as compressed,
        tarfile.open(fileobj=compressed, mode="w|") as tar,
    ):
        for name, data in items:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def bomb(path: Path, doc: dict[str, Any], name: str, size: int) -> Path:
    """A small file whose member ``name`` expands to ``size`` bytes of 0x01 (which no sparse
    write could skip): one zstd frame of 64 MiB, repeated."""
    data = json.dumps(doc).encode()
    head = _tar_header(MANIFEST, len(data)) + data + bytes(-len(data) % tarfile.BLOCKSIZE)
    compress = zstandard.ZstdCompressor(level=3).compress
    chunk = compress(b"\x01" * (64 * MIB))
    with path.open("wb") as f:
        f.write(compress(head + _tar_header(name, size)))
        for _ in range(size // (64 * MIB)):
            f.write(chunk)
        f.write(compress(bytes(2 * tarfile.BLOCKSIZE)))
    return path


def disk_usage(path: Path) -> int:
    """Bytes actually allocated under ``path``."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


@pytest.fixture
def staging(tmp_path: Path) -> Path:
    path = tmp_path / "staging"
    path.mkdir()
    return path


def refused(file: Path, staging: Path, match: str) -> str:
    """Unpacking ``file`` must fail with a 400 matching ``match``; the message."""
    with pytest.raises(BadRequest, match=match) as info:
        unpack(file, staging, LIMITS)
    assert info.value.status == 400
    return info.value.message


# --- the exchange module alone -------------------------------------------------------------


def test_a_well_formed_file_unpacks_sparse(tmp_path: Path, staging: Path) -> None:
    files = members(tmp_path)
    got = unpack(archive(tmp_path / "f", entries(manifest(files), files)), staging, LIMITS)
    assert got.original_id == ORIGINAL_ID and got.layers == 1 and got.memory_mb == 256
    assert got.fields["parent_id"] is None and got.fields["attachments"] == ["notebook.ipynb"]
    assert sorted(p.name for p in staging.iterdir()) == sorted(files)
    memory = staging / "memory.img"
    assert memory.read_bytes() == files["memory.img"]
    assert memory.stat().st_blocks * 512 < MIB  # 32 MiB of zeros were skipped, not written


@pytest.mark.parametrize(
    "name",
    ["/etc/passwd", "../x", "./memory.img", "layer1.qcow2", "layer01.qcow2", "extra.bin",
     "attachment.../x", "attachment.other.txt", "memory.img/", "devices.state/../../x"],
)  # fmt: skip
def test_members_outside_the_manifest_are_refused_before_any_file(
    tmp_path: Path, staging: Path, name: str
) -> None:
    files = members(tmp_path)
    items = entries(manifest(files), {**files, name: b"planted"})
    refused(archive(tmp_path / "f", items), staging, r"unexpected entry")
    assert not (tmp_path / "x").exists() and not (staging / "planted").exists()
    assert not [p for p in staging.rglob("*") if p.name not in files]


def test_entries_other_than_regular_files_are_refused(tmp_path: Path, staging: Path) -> None:
    files = members(tmp_path)
    path = tmp_path / "f"
    with (
        path.open("wb") as raw,
        zstandard.ZstdCompressor().stream_writer(raw) as compressed,
        tarfile.open(fileobj=compressed, mode="w|") as tar,
    ):
        data = json.dumps(manifest(files)).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("memory.img")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    refused(path, staging, r"unexpected entry 'memory.img'")
    assert list(staging.iterdir()) == []


def test_a_member_twice_or_missing(tmp_path: Path, staging: Path) -> None:
    files = members(tmp_path)
    doc = manifest(files)
    twice = [*entries(doc, files), ("devices.state", files["devices.state"])]
    refused(archive(tmp_path / "a", twice), staging, r"unexpected entry 'devices.state'")
    missing = {k: v for k, v in files.items() if k != "layer0.qcow2"}
    (staging / "b").mkdir()
    refused(archive(tmp_path / "b", entries(doc, missing)), staging / "b", r"layer0.qcow2 is")


def test_a_manifest_that_comes_last_is_refused(tmp_path: Path, staging: Path) -> None:
    files = members(tmp_path)
    items = [*files.items(), (MANIFEST, json.dumps(manifest(files)).encode())]
    refused(archive(tmp_path / "f", items), staging, r"manifest must come first")
    assert list(staging.iterdir()) == []


PROBES = ("/etc/passwd", "/etc/no-such-file-here", "../../../../../../../etc/passwd", "../x")


def probe_answers(tmp_path: Path, keys: tuple[str, str], answer: Callable[[Path], str]) -> set[str]:
    """The answers to files whose manifests list a host path as a member (with the size of
    ``/etc/passwd``, so a lookup would tell existing from missing), the name blanked out."""
    files = members(tmp_path)
    answers = set()
    for name in PROBES:
        doc = manifest(files, keys)
        doc["members"][name] = {"size": Path("/etc/passwd").stat().st_size, "sha256": "0" * 64}
        text = answer(archive(tmp_path / "f", entries(doc, files)))
        answers.add(text.replace(repr(name), "NAME").replace(name, "NAME"))
    return answers


def test_listed_member_names_probe_no_host_file(tmp_path: Path, staging: Path) -> None:
    """Whether a listed name exists on the host changes nothing in the answer."""
    answers = probe_answers(tmp_path, ("b", "r"), lambda f: refused(f, staging, "unknown field"))
    assert len(answers) == 1, answers


def _mutate(doc: dict[str, Any], where: str, value: Any) -> dict[str, Any]:
    *path, last = where.split(".")
    target = doc
    for key in path:
        target = target[key]
    target[last] = value
    return doc


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("snapshot.id", "/tmp/sandfork-planted", r"snapshot.id is not a valid value"),
        ("snapshot.id", "../../sandfork-planted", r"snapshot.id is not a valid value"),
        ("snapshot.id", "snap_0123456789abcdef/..", r"snapshot.id is not a valid value"),
        ("snapshot.parent_id", "/etc", r"snapshot.parent_id"),
        ("snapshot.sandbox_id", "../x", r"snapshot.sandbox_id"),
        ("snapshot.template", "/etc/passwd", r"snapshot.template: bad template name"),
        ("snapshot.template", "../../x", r"snapshot.template: bad template name"),
        ("snapshot.attachments", ["../x"], r"snapshot.attachments\[0\]"),
        ("snapshot.contexts", ["a/b"], r"snapshot.contexts\[0\]"),
        (
            "snapshot.vm.memory_mb",
            10 * 2**20 * 1024,
            rf"memory_mb must be an integer from {MIN_MEMORY_MB} to 1024",
        ),
        ("snapshot.vm.memory_mb", "256", r"memory_mb must be an integer"),
        ("snapshot.vm.cpus", 4096, r"cpus must be an integer from 1 to 4"),
        ("snapshot.vm.cpus", True, r"cpus must be an integer"),
        ("snapshot.vm.accelerator", "xen", r"accelerator must be"),
        ("snapshot.created_at", "yesterday", r"created_at"),
        ("snapshot.metadata", {"k": 1}, r"metadata must map strings to strings"),
        ("layers", 0, r"layers must be an integer from 1"),
        ("layers", 10**9, r"layers must be an integer from 1"),
        ("boot_key", "../boot", r"boot_key"),
        ("format", "sandfork-snapshot/1", r"not a Sandfork snapshot file"),
        ("snapshot.surprise", 1, r"unknown field 'surprise' in snapshot$"),
        ("snapshot.vm.surprise", 1, r"unknown field 'surprise' in snapshot.vm$"),
        ("snapshot.hidden", True, r"unknown field 'hidden' in snapshot$"),
        ("snapshot.disk", "/etc/shadow", r"unknown field 'disk' in snapshot$"),
        ("surprise", 1, r"unknown field 'surprise' in the manifest$"),
        ("members.memory.img", {"size": 1, "sha256": "0" * 64, "x": 1}, r"unknown field 'x'"),
        ("snapshot", [], r"snapshot must be an object"),
    ],
)
def test_manifest_schema(
    tmp_path: Path, staging: Path, where: str, value: Any, message: str
) -> None:
    files = members(tmp_path)
    doc = manifest(files)
    if where.startswith("members."):
        doc["members"][where.removeprefix("members.")] = value
    else:
        _mutate(doc, where, value)
    refused(archive(tmp_path / "f", entries(doc, files)), staging, message)
    assert list(staging.iterdir()) == []  # refused before any member was written
    assert not Path("/tmp/sandfork-planted").exists()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", r"not valid JSON"),
        (b'{"format": 1, "format": 2}', r"the key 'format' appears twice"),
        (b'{"format": NaN}', r"NaN is not a JSON number"),
        (b"[" * 100_000, r"nests deeper than 32"),
        (b'{"a":' * 40 + b"1" + b"}" * 40, r"nests deeper than 32"),
        (b'{"format": "\\ud800"}', r"lone surrogates"),
        (b"[]", r"the manifest must be an object"),
        (b" " * (2 * MIB), r"manifest is too large"),
    ],
)
def test_manifest_that_is_no_manifest(
    tmp_path: Path, staging: Path, raw: bytes, message: str
) -> None:
    refused(archive(tmp_path / "f", [(MANIFEST, raw)]), staging, message)


def test_declared_sizes_within_the_limits(tmp_path: Path, staging: Path) -> None:
    files = members(tmp_path)
    doc = manifest(files)
    doc["members"]["memory.img"]["size"] = 512 * MIB  # more than the snapshot's 256 MiB
    refused(archive(tmp_path / "a", entries(doc, files)), staging, r"larger than the snapshot")
    doc = manifest(files)
    doc["members"]["layer0.qcow2"]["size"] = 60 * MIB  # with the rest, past the 64 MiB cap
    refused(archive(tmp_path / "b", entries(doc, files)), staging, r"add up to more than")


def test_the_other_engines_relations_are_dropped_on_import(tmp_path: Path) -> None:
    """They name its sandboxes; one claiming a hibernation would hide the snapshot here and
    have it deleted when a sandbox of that id ran."""
    doc = manifest(members(tmp_path))
    doc["snapshot"]["metadata"] |= {"hibernation_of": "sbx_0123456789abcdef", "fork_parent_id": "x"}
    parsed = parse_manifest(json.dumps(doc).encode(), LIMITS)
    assert parsed.fields["metadata"] == {"notebook_path": "a.ipynb"}


@pytest.mark.parametrize("declared", [MIB, 6 * 2**30])
def test_a_bomb_is_refused_before_it_is_written(
    tmp_path: Path, staging: Path, declared: int
) -> None:
    """A small file whose memory image expands to 6 GiB: refused at its tar header, whether
    the manifest declares 1 MiB (a lie) or 6 GiB (past this engine's limits)."""
    files = {**members(tmp_path), "memory.img": b"\x01" * MIB}
    doc = manifest(files)
    doc["members"]["memory.img"]["size"] = declared
    file = bomb(tmp_path / "bomb", doc, "memory.img", 6 * 2**30)
    assert file.stat().st_size < 2 * MIB
    refused(file, staging, r"memory.img is not of its listed size|memory.img'\]\.size must be")
    assert disk_usage(staging) == 0


def test_a_tampered_member_fails_its_checksum(tmp_path: Path, staging: Path) -> None:
    files = members(tmp_path)
    doc = manifest(files)
    state = bytearray(files["devices.state"])
    state[100] ^= 0xFF  # same size, validly recompressed: only the checksum can tell
    files["devices.state"] = bytes(state)
    refused(archive(tmp_path / "f", entries(doc, files)), staging, r"checksum mismatch in devices")


def test_a_truncated_file(tmp_path: Path, staging: Path) -> None:
    files = members(tmp_path)
    file = archive(tmp_path / "f", entries(manifest(files), files))
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    refused(file, staging, r"corrupted or truncated|incomplete")


# --- qcow2 layers --------------------------------------------------------------------------


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    path = tmp_path / "rootfs.qcow2"
    qcow2(path, size="128M")
    return path


def test_a_layer_with_an_external_data_file_is_refused(tmp_path: Path, rootfs: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    victim = tmp_path / "host-file"  # the host file the guest would read as its disk
    qcow2(staging / "layer0.qcow2", "-o", f"data_file={victim},data_file_raw=on")
    victim.write_bytes(b"host secret")
    with pytest.raises(BadRequest, match=r"layer0.qcow2 has an external data file"):
        check_layers(staging, 1, rootfs, IMAGES)


def _bad_cluster_bits(image: bytes) -> bytes:
    return image[:20] + (40).to_bytes(4, "big") + image[24:]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_text("root:x:0:0:root:/root:/bin/bash\n"), r"not a qcow2 image"),
        (lambda p: qcow2(p, size="1G"), r"larger than the disk"),
        (lambda p: p.write_bytes(_bad_cluster_bits(qcow2(p))), r"not a valid qcow2 image"),
    ],
)
def test_layers_that_are_not_plain_qcow2(
    tmp_path: Path, rootfs: Path, make: Any, message: str
) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    make(staging / "layer0.qcow2")
    with pytest.raises(BadRequest, match=message):
        check_layers(staging, 1, rootfs, IMAGES)


def test_a_backing_file_naming_a_host_path_is_replaced(tmp_path: Path, rootfs: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    layer = staging / "layer0.qcow2"
    qcow2(layer, "-u", "-b", "/etc/passwd", "-F", "raw")
    check_layers(staging, 1, rootfs, IMAGES)  # the name is never opened ...
    IMAGES.rebase(layer, rootfs)  # ... and is replaced before anything could
    assert IMAGES.backing_chain(layer) == [layer, rootfs]


# --- through a real engine (no VM) ---------------------------------------------------------


@pytest.fixture(scope="module")
def bare_engine(
    tmp_path_factory: pytest.TempPathFactory, template: None
) -> Iterator[EngineProcess]:
    proc = EngineProcess(tmp_path_factory.mktemp("sandfork-hostile"))
    proc.start()
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def keys(template: None) -> tuple[str, str]:
    built: BuiltTemplate = ensure_template("code-interpreter", progress=False)
    return built.boot_key, built.rootfs.parent.name


def post_import(engine: EngineProcess, file: Path) -> requests.Response:
    with file.open("rb") as f:
        return requests.post(
            f"{engine.url}/v1/snapshots/import", data=f, headers=engine.auth, timeout=120
        )


def assert_nothing_left(engine: EngineProcess) -> None:
    """No snapshot listed and no file of one; a deleted one's ``.trash-*`` may take a moment."""
    assert engine.get("/v1/snapshots").json()["snapshots"] == []
    folders = [engine.home / name for name in ("snapshots", "layers", "tmp")]
    deadline = time.monotonic() + 300  # a hang, not a speed
    while any(p.name.startswith(".trash-") for f in folders for p in f.iterdir()):
        assert time.monotonic() < deadline, "a deleted snapshot's files stayed"
        time.sleep(0.02)
    for folder in folders:
        assert list(folder.iterdir()) == [], folder


def test_engine_imports_under_a_new_id(
    bare_engine: EngineProcess, keys: tuple[str, str], tmp_path: Path
) -> None:
    """The positive control, with a layer whose backing file names a host path."""
    layer = qcow2(tmp_path / "layer.qcow2", "-u", "-b", "/etc/passwd", "-F", "raw")
    files = members(tmp_path, layer)
    response = post_import(
        bare_engine, archive(tmp_path / "f", entries(manifest(files, keys), files))
    )
    assert response.status_code == 201, response.text
    snap = response.json()
    assert snap["id"] != ORIGINAL_ID and snap["parent_id"] is None
    assert (snap["memory_mb"], snap["cpu"], snap["name"]) == (256, 1, "crafted")
    with contextlib.closing(sqlite3.connect(bare_engine.home / "engine.sqlite")) as db:
        row = db.execute("select * from snapshots where id = ?", (snap["id"],)).fetchone()
    assert "/elsewhere" not in json.dumps(row)  # kernel and initrd are the local template's
    snap_dir = bare_engine.home / "snapshots" / snap["id"]
    assert (snap_dir / "attachments" / "notebook.ipynb").read_bytes() == b'{"cells": []}'
    (layer_path,) = (bare_engine.home / "layers").glob("*.qcow2")
    (memory,) = (bare_engine.home / "layers").glob("*.mem")  # a full image of the guest's RAM
    assert memory.stat().st_size == 256 * 2**20
    chain = IMAGES.backing_chain(layer_path)
    assert Path("/etc/passwd") not in chain and chain[-1].name == "rootfs.qcow2"
    assert list((bare_engine.home / "tmp").iterdir()) == []
    deleted = requests.delete(
        f"{bare_engine.url}/v1/snapshots/{snap['id']}", headers=bare_engine.auth, timeout=30
    )
    assert deleted.status_code == 204
    assert_nothing_left(bare_engine)


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("snapshot.id", "/tmp/sandfork-planted", r"snapshot.id"),
        ("snapshot.id", "../../../../../../tmp/sandfork-planted", r"snapshot.id"),
        (
            "snapshot.vm.memory_mb",
            10 * 2**20 * 1024,
            rf"memory_mb must be an integer from {MIN_MEMORY_MB}",
        ),
        ("snapshot.vm.cpus", 4096, r"cpus must be an integer from 1 to"),
        ("snapshot.surprise", 1, r"unknown field 'surprise' in snapshot"),
        ("snapshot.vm.surprise", 1, r"unknown field 'surprise' in snapshot.vm"),
        ("surprise", 1, r"unknown field 'surprise' in the manifest"),
        ("snapshot.template", "../../../../etc/passwd", r"bad template name"),
    ],
)
def test_engine_refuses_bad_manifests_with_400(
    bare_engine: EngineProcess,
    keys: tuple[str, str],
    tmp_path: Path,
    where: str,
    value: Any,
    message: str,
) -> None:
    files = members(tmp_path)
    doc = _mutate(manifest(files, keys), where, value)
    response = post_import(bare_engine, archive(tmp_path / "f", entries(doc, files)))
    assert response.status_code == 400, response.text
    assert re.search(message, response.json()["error"])
    assert not Path("/tmp/sandfork-planted").exists()
    assert_nothing_left(bare_engine)


def test_engine_member_names_probe_nothing(
    bare_engine: EngineProcess, keys: tuple[str, str], tmp_path: Path
) -> None:
    def answer(file: Path) -> str:
        response = post_import(bare_engine, file)
        assert response.status_code == 400, response.text
        return str(response.json()["error"])

    answers = probe_answers(tmp_path, keys, answer)
    assert len(answers) == 1, answers
    assert_nothing_left(bare_engine)


def test_engine_refuses_an_external_data_file(
    bare_engine: EngineProcess, keys: tuple[str, str], tmp_path: Path
) -> None:
    victim = tmp_path / "host-file"
    layer = qcow2(tmp_path / "layer.qcow2", "-o", f"data_file={victim},data_file_raw=on")
    victim.write_bytes(b"host secret")
    files = members(tmp_path, layer)
    response = post_import(
        bare_engine, archive(tmp_path / "f", entries(manifest(files, keys), files))
    )
    assert response.status_code == 400
    assert "external data file" in response.json()["error"]
    assert_nothing_left(bare_engine)


def test_engine_refuses_a_bomb_without_writing_it(
    bare_engine: EngineProcess, keys: tuple[str, str], tmp_path: Path
) -> None:
    files = {**members(tmp_path), "memory.img": b"\x01" * MIB}
    doc = manifest(files, keys)
    before = disk_usage(bare_engine.home)
    response = post_import(bare_engine, bomb(tmp_path / "bomb", doc, "memory.img", 6 * 2**30))
    assert response.status_code == 400
    assert "memory.img is not of its listed size" in response.json()["error"]
    assert disk_usage(bare_engine.home) - before < 4 * MIB
    assert_nothing_left(bare_engine)


def test_an_import_past_the_snapshot_quota_writes_nothing(
    tmp_path: Path, keys: tuple[str, str]
) -> None:
    engine = EngineProcess(tmp_path / "home", "--EngineConfig.snapshot_quota_mb=16")
    (tmp_path / "home").mkdir()
    engine.start()
    try:
        files = members(tmp_path)  # 32 MiB of memory image
        response = post_import(
            engine, archive(tmp_path / "f", entries(manifest(files, keys), files))
        )
        assert response.status_code == 429
        assert "quota is 16 MiB" in response.json()["error"]
        assert_nothing_left(engine)
    finally:
        engine.close()


@pytest.mark.parametrize("name", ["/etc/passwd", "../../etc/passwd", "/etc/passwd.toml", "a\n"])
def test_a_template_is_named_never_pathed(bare_engine: EngineProcess, name: str) -> None:
    response = requests.post(
        f"{bare_engine.url}/v1/sandboxes",
        json={"template": name},
        headers=bare_engine.auth,
        timeout=60,
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert "bad template name" in error
    assert "root:" not in error and "line" not in error and "column" not in error


def test_the_tmp_folder_is_private_and_emptied_at_start(tmp_path: Path, template: None) -> None:
    engine = EngineProcess(tmp_path / "home")
    (tmp_path / "home").mkdir()
    engine.start()
    try:
        tmp = engine.home / "tmp"
        assert tmp.stat().st_mode & 0o777 == 0o700
        (tmp / "upload-left").mkdir()
        (tmp / "upload-left" / "import.sfsnap").write_bytes(b"x" * 1000)
        engine.stop()
        engine.start()
        assert list(tmp.iterdir()) == []
    finally:
        engine.close()
