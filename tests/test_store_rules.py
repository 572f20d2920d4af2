"""The engine's rules for the snapshot store (issue 24), in this process on the fake backend
(see ``tests/engine_fake.py``) with a folder as the bucket: what is uploaded and when it is
durable, what a fetch registers, and what a fetch refuses from a bucket others may write."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from engine_fake import Engines, FakeEngine
from s3_server import FLEET_KEY
from sandfork.backends.fake import FakeHost
from sandfork.engine.errors import ApiError, Conflict, NotFound
from sandfork.protocol import SnapshotStorage
from sandfork.store.cache import ChunkCache
from sandfork.store.chunks import ChunkStore, Uploaded, manifest_key, signed
from sandfork.store.objects import FolderObjects

HANG = 60.0  # seconds: a bound for a hang, not a speed


@pytest_asyncio.fixture
async def pair(tmp_path: Path, host: FakeHost) -> AsyncIterator[tuple[FakeEngine, FakeEngine]]:
    """Two engines, each with its own state folder, sharing one bucket."""
    bucket = FolderObjects(tmp_path / "bucket")
    runs = [Engines(tmp_path / name, host) for name in ("a", "b")]
    engines = [
        await run.start(
            chunks=ChunkStore(bucket, ChunkCache(tmp_path / f"cache-{i}", 2**24), FLEET_KEY)
        )
        for i, run in enumerate(runs)
    ]
    yield engines[0], engines[1]
    for run in runs:
        await run.close()


async def uploaded(engine: FakeEngine) -> None:
    uploads = engine.services.uploads
    assert uploads is not None
    await asyncio.wait_for(uploads.idle.wait(), HANG)


async def durable_snapshot(a: FakeEngine) -> str:
    box = await a.create()
    await a.write(box.id, "/root/note.txt", b"from A")
    snap = await a.services.snapshots.snapshot(box.id, "travels")
    assert snap.storage == SnapshotStorage.UPLOADING
    await uploaded(a)
    assert a.store.get(snap.id).storage == SnapshotStorage.DURABLE
    await a.services.sandboxes.kill(box.id)
    return snap.id


@pytest.mark.asyncio
async def test_a_durable_snapshot_restores_on_another_engine_as_its_own(
    pair: tuple[FakeEngine, FakeEngine],
) -> None:
    a, b = pair
    snapshot_id = await durable_snapshot(a)
    assert not b.store.has(snapshot_id)
    copy = await b.restore(snapshot_id)
    assert await b.read(copy.id, "/root/note.txt") == b"from A"
    fetched = b.store.get(snapshot_id)
    assert (fetched.name, fetched.storage) == ("travels", SnapshotStorage.DURABLE)
    layers = b.layers()  # every layer the database lists is on disk, and only those
    assert Path(fetched.disk) in layers and all(p.parent == b.store.layers_dir for p in layers)
    assert list((b.home / "tmp").iterdir()) == []
    await b.services.sandboxes.kill(copy.id)


async def logged(caplog: pytest.LogCaptureFixture, text: str) -> None:
    deadline = asyncio.get_running_loop().time() + HANG
    while not any(text in r.getMessage() for r in caplog.records):
        assert asyncio.get_running_loop().time() < deadline, f"never logged: {text}"
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_an_upload_the_store_refused_resumes_after_a_restart(
    tmp_path: Path, host: FakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    bucket = tmp_path / "bucket"
    bucket.write_text("not a folder: every write fails")
    runs = Engines(tmp_path / "a", host)
    try:
        a = await runs.start(
            chunks=ChunkStore(FolderObjects(bucket), ChunkCache(tmp_path / "c", 0), FLEET_KEY)
        )
        box = await a.create()
        snap = await a.services.snapshots.snapshot(box.id)
        await logged(caplog, f"upload of snapshot {snap.id} failed (attempt 1)")
        assert a.store.get(snap.id).storage == SnapshotStorage.UPLOADING
        await a.stop()  # an engine that stops with the upload not done
        bucket.unlink()  # the store is back
        again = await runs.restart(a)
        await uploaded(again)
        assert again.store.get(snap.id).storage == SnapshotStorage.DURABLE
        assert FolderObjects(bucket).keys("manifests/") == [manifest_key(snap.id)]
        await again.services.sandboxes.kill(box.id)
    finally:
        await runs.close()


class HeldObjects(FolderObjects):
    """A bucket whose first chunk write waits until the test lets it go on."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writing = threading.Event()
        self.go_on = threading.Event()
        self.chunk_writes = 0

    def put(self, key: str, data: bytes) -> None:
        self.chunk_writes += 1
        self.writing.set()
        assert self.go_on.wait(HANG)
        super().put(key, data)


class WatchedChunks(ChunkStore):
    """A chunk store that says when an upload's worker thread is done with it."""

    def __init__(self, objects: FolderObjects, cache: ChunkCache) -> None:
        super().__init__(objects, cache, FLEET_KEY)
        self.ended = threading.Event()

    def upload(self, *args: Any, **kwargs: Any) -> Uploaded:
        try:
            return super().upload(*args, **kwargs)
        finally:
            self.ended.set()


@pytest.mark.asyncio
async def test_a_stopping_engine_cuts_the_upload_in_flight_short(
    tmp_path: Path, host: FakeHost
) -> None:
    objects = HeldObjects(tmp_path / "bucket")
    runs = Engines(tmp_path / "a", host)
    try:
        chunks = WatchedChunks(objects, ChunkCache(tmp_path / "c", 0))
        a = await runs.start(chunks=chunks)
        box = await a.create()
        await a.write(box.id, "/root/big", os.urandom(12 * 2**20))  # several chunks
        await a.services.snapshots.snapshot(box.id)
        assert await asyncio.to_thread(objects.writing.wait, HANG)
        assert a.services.uploads is not None
        await a.services.uploads.stop()  # returns while the first chunk is being written
        objects.go_on.set()
        assert await asyncio.to_thread(chunks.ended.wait, HANG)
        assert objects.chunk_writes == 1 and objects.keys("manifests/") == []
        await a.services.sandboxes.kill(box.id)
    finally:
        await runs.close()


@pytest.mark.asyncio
async def test_a_snapshot_that_cannot_be_stored_stays_local(
    pair: tuple[FakeEngine, FakeEngine], caplog: pytest.LogCaptureFixture
) -> None:
    a, _ = pair
    box = await a.create()
    snap = await a.services.snapshots.snapshot(box.id)
    # Before the upload task runs (nothing awaited yet): a device node in the snapshot.
    os.mknod(a.store.path(snap.id) / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    await uploaded(a)
    assert a.store.get(snap.id).storage == SnapshotStorage.LOCAL
    assert any("stays local" in r.getMessage() and "a device" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert a.chunks is not None and a.chunks.objects.keys("manifests/") == []
    await a.services.sandboxes.kill(box.id)


@pytest.mark.asyncio
async def test_two_restores_of_one_absent_snapshot_fetch_it_once(
    pair: tuple[FakeEngine, FakeEngine], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    a, b = pair
    snapshot_id = await durable_snapshot(a)
    copies = await asyncio.gather(b.restore(snapshot_id), b.restore(snapshot_id))
    fetched = [r for r in caplog.records if r.getMessage().startswith("fetched snapshot")]
    assert len(fetched) == 1
    for copy in copies:
        assert await b.read(copy.id, "/root/note.txt") == b"from A"
        await b.services.sandboxes.kill(copy.id)


@pytest.mark.asyncio
async def test_hidden_captures_stay_local(pair: tuple[FakeEngine, FakeEngine]) -> None:
    a, _ = pair
    box = await a.create()
    children = await a.services.snapshots.fork(box.id, 1, metadata={}, reseed_python=False)
    await uploaded(a)
    assert a.chunks is not None and a.chunks.objects.keys("manifests/") == []
    for sandbox in [box, *children]:
        await a.services.sandboxes.kill(sandbox.id)


@pytest.mark.asyncio
async def test_a_snapshot_in_neither_place_is_a_404(pair: tuple[FakeEngine, FakeEngine]) -> None:
    _, b = pair
    with pytest.raises(NotFound, match="not here, nor in the snapshot store"):
        await b.restore("snap_0123456789abcdef")


def tamper(
    engine: FakeEngine, snapshot_id: str, edit: dict[str, object], key: str | None = FLEET_KEY
) -> None:
    """Rewrite the bucket's manifest of ``snapshot_id`` as a hostile writer would: one with
    the fleet's key (an engine gone rogue), or (``key=None``) any other writer of the bucket."""
    assert engine.chunks is not None
    objects = engine.chunks.objects
    doc = json.loads(objects.get(manifest_key(snapshot_id)).partition(b"\n")[2])
    entries = edit.pop("entries", None)
    if callable(entries):
        doc["entries"] = entries(doc["entries"])
    doc["meta"] |= edit
    data = json.dumps(doc).encode()
    objects.put(manifest_key(snapshot_id), data if key is None else signed(key, data))


def link_state(entries: list[dict[str, object]]) -> list[dict[str, object]]:
    """The state file a link to a host file: the engine would read through it."""
    for entry in entries:
        if entry["name"] == "snapshot/state.json":
            entry.clear()
            entry |= {"name": "snapshot/state.json", "kind": "symlink", "mode": 0o777}
            entry["target"] = "/etc/shadow"
    return entries


@pytest.mark.asyncio
async def test_a_manifest_the_fleet_did_not_sign_is_never_restored(
    pair: tuple[FakeEngine, FakeEngine],
) -> None:
    """The bucket's other writers cannot make an engine restore a snapshot of their making,
    however well they craft it (here: the fleet's own manifest, unchanged but unsigned)."""
    a, b = pair
    snapshot_id = await durable_snapshot(a)
    tamper(a, snapshot_id, {}, key=None)
    with pytest.raises(ApiError, match="not signed with this fleet's key") as e:
        await b.restore(snapshot_id)
    assert e.value.status == 502
    assert not b.store.has(snapshot_id) and b.layers() == set()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("edit", "refusal", "status"),
    [
        ({"entries": link_state}, "a symlink may only be in a disk layer", 502),
        ({"disk_layers": 3}, "it lacks disk.", 502),
        ({"entries": lambda e: [*e, {"name": "x", "kind": "dir", "mode": 448}]}, "'x'", 502),
        ({"backend": "qemu"}, "meta.backend must be", 502),
        ({"memory_mb": 10**9}, "meta.memory_mb must be an integer", 502),
        ({"machine_key": "another-build"}, "taken on another build", 409),
        ({"base": "other-key/rootfs.fake"}, "taken on another build", 409),
    ],
)
async def test_a_tampered_manifest_is_refused_and_leaves_nothing(
    pair: tuple[FakeEngine, FakeEngine], edit: dict[str, object], refusal: str, status: int
) -> None:
    a, b = pair
    snapshot_id = await durable_snapshot(a)
    tamper(a, snapshot_id, edit)
    with pytest.raises(ApiError, match=refusal) as e:
        await b.restore(snapshot_id)
    assert e.value.status == status and (status != 409 or isinstance(e.value, Conflict))
    assert not b.store.has(snapshot_id)
    assert b.layers() == set()
    assert list((b.home / "tmp").iterdir()) == []
    assert [p.name for p in b.store.dir.iterdir()] == []
