"""Memory layers written after their capture returned.

A capture with much memory to store (a sandbox that wrote a gigabyte since it started)
returns once the pages are copied into the engine's memory, the sandbox running again: its
snapshot is listed ``writing`` while its memory layer is written in the background, then
``local``. Whatever reads a memory chain waits for its layers first
(:meth:`~sandfork.engine.snapshot_store.SnapshotStore.written_chain`): a
restore, an export, an upload, the sandbox's next capture. An engine that stops gracefully
finishes the writes first; a write that fails drops its snapshot; an engine killed mid-write
drops, at its next start, the snapshots still ``writing`` (:func:`drop_unwritten`). A dropped
capture's sandbox goes back to the memory layer below it, which its VM's memory still
matches but for the pages written since (the next capture of a VM adopted by a new engine
compares every page anyway).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from pathlib import Path
from typing import Protocol

from sandfork.engine.db import Database, SandboxRecord, SnapshotRecord
from sandfork.protocol import SnapshotStorage

log = logging.getLogger(__name__)


class Store(Protocol):
    """What a write needs of the snapshot store that owns it
    (:class:`~sandfork.engine.snapshot_store.SnapshotStore`)."""

    db: Database

    def has(self, snapshot_id: str) -> bool: ...
    def forget(self, snapshot_id: str) -> None: ...
    def set_backing(self, layer: Path, backing: Path | None) -> None: ...
    def settle(self, *layers: Path) -> None: ...


class MemoryWrites:
    """The memory layers of one store being written in the background."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._done: dict[str, asyncio.Future[None]] = {}  # layer -> its write ended
        self._tasks: set[asyncio.Task[None]] = set()

    def start(
        self, snap: SnapshotRecord, sandbox: SandboxRecord, pending: Awaitable[Path | None]
    ) -> None:
        """Finish ``snap`` (listed ``writing``) once ``pending`` has written its memory layer
        (it returns what the layer lies over); ``sandbox``'s memory is that layer too."""
        self._done[snap.memory] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._finish(snap, sandbox, pending))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait(self, chain: list[Path]) -> bool:
        """Return once every layer of ``chain`` is completely written; True if some was not
        (the chain may have changed: a layer's writer decides what it lies over)."""
        waited = False
        for layer in chain:
            done = self._done.get(str(layer))
            if done is not None:
                await asyncio.shield(done)
                waited = True
        return waited

    async def drain(self) -> None:
        """Wait for every write under way (a graceful stop loses none)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def tracked(self) -> dict[str, int]:
        """Sizes of the tables (:mod:`sandfork.engine.stats`)."""
        return {"memory_writes": len(self._done)}

    async def _finish(
        self, snap: SnapshotRecord, sandbox: SandboxRecord, pending: Awaitable[Path | None]
    ) -> None:
        store, layer = self.store, Path(snap.memory)
        try:
            backing = await pending
        except Exception as e:
            log.error("snapshot %s is dropped: its memory could not be written: %s", snap.id, e)
            _step_back(store.db, sandbox, layer)
            if store.has(snap.id):
                store.forget(snap.id)
        else:
            store.set_backing(layer, backing)
            if store.has(snap.id):
                snap.storage = SnapshotStorage.LOCAL
                snap.size_bytes += layer.stat().st_blocks * 512
                store.db.put_snapshot(snap)
        finally:
            store.settle(layer)
            self._done.pop(str(layer)).set_result(None)


def drop_unwritten(db: Database, snapshots: list[SnapshotRecord]) -> list[SnapshotRecord]:
    """At start: delete the records of the ``snapshots`` an earlier engine left ``writing``
    (their memory layers are incomplete) and step their sandboxes back; returns the rest.
    Their files go with the next collection."""
    kept = []
    for snap in snapshots:
        if snap.storage != SnapshotStorage.WRITING:
            kept.append(snap)
            continue
        log.warning("snapshot %s is dropped: the engine stopped while writing it", snap.id)
        for sandbox in db.all():
            _step_back(db, sandbox, Path(snap.memory))
        db.delete_snapshot(snap.id)
    return kept


def _step_back(db: Database, sandbox: SandboxRecord, layer: Path) -> None:
    """If ``sandbox``'s memory is ``layer``, make it the layer below (recorded when the
    capture registered it) and save it, if the sandbox is still there."""
    if sandbox.memory != str(layer):
        return
    sandbox.memory = db.layers().get(str(layer), "")
    if any(s.id == sandbox.id for s in db.all()):
        db.put(sandbox)
