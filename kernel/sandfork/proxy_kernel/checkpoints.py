"""A checkpoint after every cell, and rewinding to one (``%checkpoints``, ``%rewind``).

With checkpoints on, each cell the guest kernel finishes is followed by a capture of the
sandbox (incremental: it stores what the cell changed), tagged with the cell's id, its
execution count and a hash of its source, before the next request reaches the guest (so a
checkpoint holds exactly the state after its cell). The last ``kept`` checkpoints of the kernel
are kept; older ones are deleted. ``%rewind [n]`` restores the checkpoint taken before the last
``n`` cells (default 1) into a new sandbox, and the kernel goes on there.

Checkpoints of one kernel carry its ``lineage`` (an id of the kernel process), so they are
found across the sandboxes a kernel moves through (``%restore``, ``%rewind``).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field

from sandfork.sdk import Sandbox, Snapshot

KIND = "checkpoint"  # metadata: what made the snapshot
LINEAGE = "kernel_lineage"


@dataclass
class _Cell:
    cell_id: str
    source_sha256: str


@dataclass
class CellCheckpoints:
    """The checkpoint settings and bookkeeping of one proxy kernel."""

    enabled: bool = False
    kept: int = 20
    lineage: str = field(default_factory=lambda: uuid.uuid4().hex)
    _cells: dict[str, _Cell] = field(default_factory=dict)  # execute msg_id -> its cell

    def started(self, msg_id: str, code: str, metadata: dict[str, object]) -> None:
        """An execute request went to the guest: remember which cell it is."""
        if self.enabled:
            source = hashlib.sha256(code.encode()).hexdigest()
            self._cells[msg_id] = _Cell(str(metadata.get("cellId", "")), source)

    def finished(self, msg_id: str, content: bytes) -> dict[str, str] | None:
        """The guest answered execute request ``msg_id``: the metadata of the checkpoint to
        take now, or ``None`` (checkpoints off, or not a cell we saw start)."""
        cell = self._cells.pop(msg_id, None)
        if cell is None or not self.enabled:
            return None
        try:
            count = json.loads(content).get("execution_count")
        except ValueError:
            count = None
        return {
            KIND: "cell",
            LINEAGE: self.lineage,
            "cell_id": cell.cell_id,
            "execution_count": "" if count is None else str(count),
            "source_sha256": cell.source_sha256,
        }

    def take(self, sandbox: Sandbox, metadata: dict[str, str]) -> str:
        """Capture ``sandbox`` as a checkpoint, then drop the kernel's oldest past ``kept``."""
        snapshot_id = sandbox.snapshot(metadata=metadata)
        for old in self.listed(sandbox)[self.kept :]:
            old.delete()
        return snapshot_id

    def listed(self, sandbox: Sandbox) -> list[Snapshot]:
        """This kernel's checkpoints, newest first."""
        return [
            s
            for s in Snapshot.list(client=sandbox.client)
            if s.metadata.get(KIND) == "cell" and s.metadata.get(LINEAGE) == self.lineage
        ]

    def before_last(self, sandbox: Sandbox, cells: int) -> Snapshot:
        """The checkpoint taken before the last ``cells`` cells ran (``LookupError`` if that
        is further back than the checkpoints kept)."""
        listed = self.listed(sandbox)
        if cells >= len(listed):
            raise LookupError(
                f"there are {len(listed)} checkpoints of this kernel: rewinding {cells} cell(s) "
                f"needs {cells + 1} (turn them on with %checkpoints on before running cells)"
            )
        return listed[cells]
