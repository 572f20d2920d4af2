"""Taking a snapshot of a running sandbox: the one act behind a snapshot, a checkpoint, a
fork's hidden capture and a hibernation's.

The sandbox is paused for the capture (see :meth:`sandfork.backends.base.Instance.snapshot`)
and runs on after; the snapshot is listed only once complete, with its attachments (and, for
a visible one, the kernel's variable inventory: :mod:`sandfork.engine.inventory`).
"""

from __future__ import annotations

from pathlib import Path

from sandfork.backends.base import CaptureRequest
from sandfork.crashpoints import crash_point
from sandfork.engine import inventory, replies
from sandfork.engine.backends import Backends
from sandfork.engine.db import Database, SnapshotRecord
from sandfork.engine.errors import ApiError
from sandfork.engine.ledger import now
from sandfork.engine.live import Live
from sandfork.engine.snapshot_store import (
    SnapshotStore,
    new_snapshot_id,
    stored_bytes,
    write_attachments,
)
from sandfork.protocol import INVENTORY_ATTACHMENT, SnapshotStorage


class Capturer:
    """Captures running sandboxes into snapshots of one store."""

    def __init__(
        self,
        db: Database,
        store: SnapshotStore,
        backends: Backends,
        *,
        inventory_timeout: float,
        agent_timeout: float,
    ) -> None:
        self.db = db
        self.store = store
        self.backends = backends
        self.inventory_timeout = inventory_timeout
        self.agent_timeout = agent_timeout

    async def capture(
        self,
        live: Live,
        name: str | None = None,
        *,
        hidden: bool = False,
        metadata: dict[str, str] | None = None,
        attachments: dict[str, bytes] | None = None,
        hibernation: bool = False,
    ) -> SnapshotRecord:
        """Capture ``live`` (its lock held by the caller) into a new snapshot: a fork's
        ``hidden`` one, a ``hibernation`` capture (unlisted, the sandbox wakes from it), or a
        visible one with the kernel's inventory."""
        record = live.record
        contexts = await live.request("ctx.list", None, replies.contexts, self.agent_timeout)
        if not hidden and not hibernation:
            found = await inventory.take(live, contexts.get("contexts", []), self.inventory_timeout)
            attachments = {**(attachments or {}), INVENTORY_ATTACHMENT: found}
            crash_point("snapshot.inventoried")
        snapshot_id = new_snapshot_id()
        backend = self.backends.of(record)
        # A fork's capture is thrown away once the children run: keep it off the disk if
        # the backend can restore from memory.
        staging = self.store.staging(snapshot_id, in_memory=hidden and backend.captures_in_memory)
        try:
            stored = write_attachments(staging, attachments or {})
        except ApiError:
            self.store.abandon(snapshot_id, staging)
            raise
        made: list[Path] = []

        def new_layer(backing: Path | None, suffix: str) -> Path:
            made.append(self.store.new_layer(backing, suffix))
            return made[-1]

        # A visible capture may list its snapshot before a large memory layer is written.
        deferred = not hidden and not hibernation
        try:
            memory = await self.store.written_chain(record.memory)  # the last capture's layer
            request = CaptureRequest(Path(record.disk), memory, new_layer, deferred)
            captured = await live.instance.snapshot(staging, request)
        except Exception as e:
            self.store.abandon(snapshot_id, staging)
            self.store.settle(*made)
            raise ApiError(f"the snapshot failed: {e}", 500) from e
        writing = captured.memory_written
        if captured.memory is not None and writing is None:
            self.store.set_backing(captured.memory, captured.memory_backing)
        crash_point("snapshot.frozen")
        record.disk = str(captured.sandbox_disk)
        if captured.sandbox_memory is not None:
            record.memory = str(captured.sandbox_memory)
        self.db.put(record)
        self.store.settle(*(m for m in made if writing is None or m != captured.memory))
        snap = SnapshotRecord(
            id=snapshot_id,
            name=name,
            created_at=now(),
            sandbox_id=record.id,
            template=record.template,
            parent_id=record.from_snapshot,
            disk=str(captured.disk),
            memory=str(captured.memory or ""),
            vm=record.vm,
            size_bytes=sum(map(stored_bytes, (staging, captured.disk, captured.memory))),
            paused_ms=int(captured.paused * 1000),
            contexts=[c["id"] for c in contexts.get("contexts", [])],
            hidden=hidden,
            metadata=metadata or {},
            attachments=stored,
            hibernation_of=record.id if hibernation else None,
            storage=SnapshotStorage.LOCAL if writing is None else SnapshotStorage.WRITING,
        )
        crash_point("snapshot.written")
        if writing is not None:
            self.store.writes.start(snap, record, writing)
        self.store.publish(snap, staging)
        return snap
