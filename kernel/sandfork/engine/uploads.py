"""Uploading snapshots to the snapshot store in the background, after their capture.

A visible snapshot (checkpoints included) is ``uploading`` from its capture until its
manifest is in the store, then ``durable``; the state is saved in its record, so an engine
that restarts picks up every snapshot still ``uploading`` (chunks already sent are not sent
again). A store that cannot be reached is retried with a growing pause while the snapshot
stays ``uploading``; a snapshot that cannot be stored at all (a file it holds cannot be, its
files changed) goes back to ``local``, with the reason in the engine's log. One upload runs at
a time, in a worker thread: the event loop never waits for the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from sandfork.engine.backends import Backends
from sandfork.engine.db import SnapshotRecord
from sandfork.engine.snapshot_store import SnapshotStore
from sandfork.engine.stored import sources
from sandfork.engine.template_travel import TemplateTravel
from sandfork.protocol import SnapshotStorage
from sandfork.store.chunks import ChunkStore
from sandfork.store.objects import StoreError
from sandfork.store.pages import PageIndex

log = logging.getLogger(__name__)

RETRY_FIRST = 1.0  # seconds before the first retry of an unreachable store; doubling after
RETRY_MOST = 60.0
PROGRESS_STEP = 64 * 2**20  # bytes between two progress lines in the log
PAGE_INDEXES = 4  # sandboxes whose last upload's pages are kept (about 40 MB per GiB)


class _Stopped(Exception):
    """The engine is stopping: the upload in the worker thread gives up at its next chunk."""


class Uploads:
    """The queue of snapshots going to ``chunks``, and the task that uploads them."""

    def __init__(
        self,
        store: SnapshotStore,
        chunks: ChunkStore,
        backends: Backends,
        templates: TemplateTravel,
    ) -> None:
        self.store = store
        self.chunks = chunks
        self.backends = backends
        self.templates = templates
        # The pages of the last upload of each of the latest sandboxes: a checkpoint's
        # upload references what its predecessor stored (:mod:`sandfork.store.pages`).
        self._pages: OrderedDict[str, PageIndex] = OrderedDict()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.idle = asyncio.Event()  # set while nothing waits to be uploaded
        self.idle.set()
        self._stopping = threading.Event()

    def start(self) -> None:
        """Pick up what an earlier engine left ``uploading``, and start the uploads."""
        for snap in self.store.all():
            if snap.storage == SnapshotStorage.UPLOADING:
                log.info("resuming the upload of snapshot %s", snap.id)
                self._enqueue(snap.id)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop uploading (the one in flight at its next chunk, so a stop never waits for a
        large upload); what is left stays ``uploading`` for the next engine."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, snap: SnapshotRecord) -> None:
        """Upload ``snap`` (just captured) in the background, once its memory is written."""
        if snap.storage != SnapshotStorage.WRITING:
            snap.storage = SnapshotStorage.UPLOADING
            self.store.db.put_snapshot(snap)
        self._enqueue(snap.id)

    def _enqueue(self, snapshot_id: str) -> None:
        self.idle.clear()
        self._queue.put_nowait(snapshot_id)

    async def _run(self) -> None:
        while True:
            snapshot_id = await self._queue.get()
            await self._upload(snapshot_id)
            if self._queue.empty():
                self.idle.set()

    async def _upload(self, snapshot_id: str) -> None:
        pause = RETRY_FIRST
        attempt = 1
        while True:
            if not self.store.has(snapshot_id):
                return  # deleted meanwhile
            snap = self.store.get(snapshot_id)
            await self.store.written_chain(snap.memory)
            if not self.store.has(snapshot_id):
                return  # its memory could not be written: dropped
            if snap.storage != SnapshotStorage.UPLOADING:
                snap.storage = SnapshotStorage.UPLOADING
                self.store.db.put_snapshot(snap)
            try:
                backend = self.backends[snap.backend]
                files, meta = sources(snap, self.store, backend)
                # Its template first: a durable snapshot restores on a host without it.
                key = await asyncio.to_thread(
                    self.templates.upload, snap.template, meta["base"], backend
                )
                if key is not None:
                    meta["template_key"] = key
                await asyncio.to_thread(self._send, snap, files, meta)
                snap.storage = SnapshotStorage.DURABLE
                self.store.db.put_snapshot(snap)
                return
            except StoreError as e:
                log.warning(
                    "upload of snapshot %s failed (attempt %d), retrying in %.0f s: %s",
                    snapshot_id, attempt, pause, e,
                )  # fmt: skip
            except (OSError, ValueError) as e:
                if self.store.has(snapshot_id):
                    log.error("snapshot %s stays local: it cannot be stored: %s", snapshot_id, e)
                    snap.storage = SnapshotStorage.LOCAL
                    self.store.db.put_snapshot(snap)
                return
            await asyncio.sleep(pause)
            pause, attempt = min(pause * 2, RETRY_MOST), attempt + 1

    def _send(self, snap: SnapshotRecord, files: dict[str, Path], meta: dict[str, Any]) -> None:
        """Upload one snapshot's files (in a worker thread: no database here)."""
        snapshot_id = snap.id
        started = time.monotonic()
        logged = [0]

        def progress(done: int, total: int) -> None:
            if self._stopping.is_set():
                raise _Stopped
            if done - logged[0] >= PROGRESS_STEP or done == total:
                logged[0] = done
                log.info(
                    "uploading snapshot %s: %d of %d MiB", snapshot_id, done >> 20, total >> 20
                )

        known = self._pages.get(snap.sandbox_id)
        done = self.chunks.upload(snapshot_id, files, meta, progress, known)
        self._pages.pop(snap.sandbox_id, None)
        self._pages[snap.sandbox_id] = done.pages  # the newest last
        while len(self._pages) > PAGE_INDEXES:
            self._pages.popitem(last=False)
        seconds = max(time.monotonic() - started, 1e-6)
        size = done.manifest.total_bytes / 2**20
        log.info(
            "snapshot %s is durable: %d chunks sent (%.1f MiB, %.1f MiB/s), %d already stored; "
            "%.1f MiB stored in %.1f s%s",
            snapshot_id,
            done.sent,
            done.bytes_sent / 2**20,
            done.bytes_sent / 2**20 / seconds,
            done.skipped,
            size,
            seconds,
            "" if done.committed else " (its manifest was there already)",
        )
