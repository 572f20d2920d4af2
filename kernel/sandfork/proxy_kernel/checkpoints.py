"""A checkpoint after every cell, and rewinding to one (``%checkpoints``, ``%rewind``).

With checkpoints on, each cell the guest kernel finishes is followed by a capture of the
sandbox (incremental: it stores what the cell changed), tagged with the cell's id, its
execution count and a hash of its source, before the next request reaches the guest (so a
checkpoint holds exactly the state after its cell). Turning checkpoints on takes one of the
state as it is, so that the first cell can be rewound too. The last ``kept`` unnamed
checkpoints of the kernel are kept; older ones are deleted (a checkpoint given a name is kept).

Each checkpoint names the one its state came from (``previous_checkpoint``), so the kernel's
history is a chain from its ``head`` (the checkpoint the kernel's state is now) back, whatever
was rewound or re-run in between: ``%rewind [n]`` restores the checkpoint ``n`` cells back
along it (default 1) and ``%rewind --cell ID`` the one before that cell last ran, into a new
sandbox, and the kernel goes on there.

Checkpoints of one kernel carry its ``lineage`` (an id of the kernel process, kept across
restarts), so they are found across the sandboxes a kernel moves through.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from sandfork.protocol import CHECKPOINTS_KEPT
from sandfork.sdk import Sandbox, Snapshot

# A cell checkpoint (a snapshot the kernel takes after a cell, for %rewind) is marked so in
# its metadata; a ledger checkpoint (``Sandbox.checkpoint``) is another thing.
CELL_CHECKPOINT = {"checkpoint": "cell"}
LINEAGE = "kernel_lineage"
PREVIOUS = "previous_checkpoint"
CELL_ID = "cell_id"  # "" for the checkpoint taken when checkpoints were turned on


@dataclass
class _Cell:
    cell_id: str
    source_sha256: str


@dataclass
class CellCheckpoints:
    """The checkpoint settings and bookkeeping of one proxy kernel."""

    enabled: bool = False
    kept: int = CHECKPOINTS_KEPT
    lineage: str = field(default_factory=lambda: uuid.uuid4().hex)
    head: str | None = None  # the checkpoint the kernel's state is now, if it is one
    _cells: dict[str, _Cell] = field(default_factory=dict)  # execute msg_id -> its cell

    def state(self) -> dict[str, Any]:
        """What the kernel's state file keeps of them (a restarted kernel goes on with it)."""
        return {"enabled": self.enabled, "kept": self.kept, "lineage": self.lineage}

    @classmethod
    def from_state(cls, saved: dict[str, Any] | None, enabled: bool, kept: int) -> CellCheckpoints:
        """The checkpoints of a restarted kernel (``saved``), else new ones as configured."""
        if not saved:
            return cls(enabled=enabled, kept=kept)
        return cls(bool(saved["enabled"]), int(saved["kept"]), str(saved["lineage"]))

    def started(self, msg_id: str, code: str, metadata: dict[str, object]) -> None:
        """A cell's execute request went to the guest: remember which cell it is."""
        source = hashlib.sha256(code.encode()).hexdigest()
        self._cells[msg_id] = _Cell(str(metadata.get("cellId", "")), source)

    def finished(self, msg_id: str, content: bytes) -> dict[str, str] | None:
        """The guest answered execute request ``msg_id``: the metadata of the checkpoint to
        take now, or ``None`` (checkpoints off, or not a cell we saw start)."""
        cell = self._cells.pop(msg_id, None)
        if cell is None:
            return None
        if not self.enabled:
            self.head = None  # the cell changed the state: it is no checkpoint any more
            return None
        try:
            count = json.loads(content).get("execution_count")
        except ValueError:
            count = None
        return self._metadata(cell.cell_id, "" if count is None else str(count), cell.source_sha256)

    def _metadata(self, cell_id: str, count: str, source: str) -> dict[str, str]:
        return {
            **CELL_CHECKPOINT,
            LINEAGE: self.lineage,
            CELL_ID: cell_id,
            "execution_count": count,
            "source_sha256": source,
        }

    async def take(self, sandbox: Sandbox, metadata: dict[str, str]) -> Snapshot:
        """Capture ``sandbox`` as a checkpoint after the head, then drop the kernel's oldest
        unnamed ones past ``kept``; returns the checkpoint."""
        taken = await sandbox.async_snapshot(metadata={**metadata, PREVIOUS: self.head or ""})
        self.head = taken.id
        for old in [s for s in await self.listed(sandbox) if not s.name][self.kept :]:
            await old.async_delete()
        return taken

    async def turn_on(self, sandbox: Sandbox, kept: int | None = None) -> None:
        """Checkpoints on (keeping ``kept``), starting with one of the state as it is now."""
        self.kept = kept or self.kept
        if not (self.enabled and self.head):
            self.enabled = True
            await self._take_first(sandbox)

    async def moved(self, sandbox: Sandbox, snapshot_id: str) -> None:
        """The kernel now runs in ``sandbox``, restored from ``snapshot_id``."""
        self.head = snapshot_id
        if self.enabled and snapshot_id not in {s.id for s in await self.listed(sandbox)}:
            self.head = None  # not one of ours: its history starts here
            await self._take_first(sandbox)

    async def _take_first(self, sandbox: Sandbox) -> None:
        """The checkpoint a history starts with: the state before any cell of it."""
        await self.take(sandbox, self._metadata("", "", ""))

    async def listed(self, sandbox: Sandbox) -> list[Snapshot]:
        """This kernel's checkpoints, newest first."""
        ours = {**CELL_CHECKPOINT, LINEAGE: self.lineage}
        return await Snapshot.async_list(metadata=ours, client=sandbox.client)

    async def history(self, sandbox: Sandbox) -> list[Snapshot]:
        """The checkpoints the kernel's state descends from: the head first, then back."""
        by_id = {s.id: s for s in await self.listed(sandbox)}
        chain: list[Snapshot] = []
        current = self.head
        while current in by_id and len(chain) < len(by_id):
            chain.append(by_id[current])
            current = by_id[current].metadata.get(PREVIOUS)
        return chain

    async def before_last(self, sandbox: Sandbox, cells: int) -> Snapshot:
        """The checkpoint the state was in before the last ``cells`` cells ran
        (``LookupError`` if that is further back than the checkpoints kept)."""
        chain = await self.history(sandbox)
        if cells >= len(chain):
            raise LookupError(
                f"this kernel's history has {len(chain)} checkpoint(s): rewinding {cells} "
                f"cell(s) needs {cells + 1} (turn them on with %checkpoints on before "
                f"running cells; the last {self.kept} are kept)"
            )
        return chain[cells]

    async def before_cell(self, sandbox: Sandbox, cell_id: str) -> Snapshot:
        """The checkpoint the state was in before cell ``cell_id`` last ran, in the kernel's
        history (``LookupError`` if there is none)."""
        chain = await self.history(sandbox)
        for i, snapshot in enumerate(chain[:-1]):
            if snapshot.metadata.get(CELL_ID) == cell_id:
                return chain[i + 1]
        raise LookupError(
            f"no checkpoint before cell {cell_id} in this kernel's history: the cell did not "
            f"run with checkpoints on in this kernel state, or ran before the last "
            f"{self.kept} checkpoints"
        )
