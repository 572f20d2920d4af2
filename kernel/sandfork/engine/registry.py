"""The sandboxes of one engine: their records, the running ones' VMs, their locks, their
leases and the operations running in them. :mod:`sandfork.engine.lifecycle` moves them from
status to status; this holds what it moves."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sandfork.engine.activity import Activity
from sandfork.engine.db import Database, SandboxRecord
from sandfork.engine.errors import Conflict, NotFound
from sandfork.engine.leases import Leases
from sandfork.engine.live import Live
from sandfork.engine.snapshot_store import SnapshotStore
from sandfork.protocol import SandboxStatus

WATCH_TICK = 1.0  # seconds between two checks of the VMs and the leases


class SandboxRegistry:
    """Every sandbox the engine knows, and each running one's :class:`Live`."""

    def __init__(self, db: Database, home: Path, store: SnapshotStore) -> None:
        self.db = db
        self.store = store
        self.sandboxes_dir = home / "sandboxes"
        self._records: dict[str, SandboxRecord] = {r.id: r for r in db.all()}
        self._live: dict[str, Live] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.leases = Leases(tick=WATCH_TICK)
        self.activity = Activity()  # the operations running in each sandbox

    def get(self, sandbox_id: str) -> SandboxRecord:
        """The record of a sandbox, alive or dead."""
        record = self._records.get(sandbox_id)
        if record is None:
            raise NotFound(f"no sandbox {sandbox_id!r}")
        return record

    def all(self) -> list[SandboxRecord]:
        """Every sandbox the engine knows, dead ones included."""
        return list(self._records.values())

    def save(self, record: SandboxRecord) -> None:
        """Store a change to a sandbox's record (its disk after a capture, its metadata)."""
        self.db.put(record)

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """Held while the sandbox is captured or killed: the two never overlap."""
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def live(self, sandbox_id: str, paused: bool = False) -> Live:
        """A running sandbox (or, with ``paused``, a paused one too), or a clear error saying
        why it cannot be used."""
        record = self.get(sandbox_id)
        if record.status is SandboxStatus.PAUSED and not paused:
            raise Conflict(
                f"sandbox {sandbox_id} is paused: resume it first (POST /v1/sandboxes/"
                f"{sandbox_id}/resume)"
            )
        live = self._live.get(sandbox_id)
        if live is None or not live.instance.is_alive():
            reason = (
                record.error or (live.instance.failure_reason() if live else "") or record.status
            )
            raise Conflict(f"sandbox {sandbox_id} is not running: {reason}")
        return live

    def busy_kernels(self, sandbox_id: str) -> list[str]:
        """The code contexts of a running sandbox whose kernel is running code."""
        live = self._live.get(sandbox_id)
        return live.runner.busy() if live is not None else []

    def _forget(self, sandbox_id: str) -> None:
        self.leases.drop(sandbox_id)
        self._records.pop(sandbox_id, None)
        self.db.delete(sandbox_id)
        self.store.collect(self.all())
