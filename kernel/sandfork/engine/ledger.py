"""The execution ledger: every exec and run_code of a sandbox, numbered, with checkpoints.

Entries outlive their sandbox (a killed sandbox can still be resumed from its last
checkpoint) and the engine. ``resume`` hands the entries up to a checkpoint to the client,
which serves repeated calls from them instead of running them again.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sandfork.engine.db import Database
from sandfork.engine.errors import NotFound


def now(at: float | None = None) -> str:
    """The time ``at`` (seconds since the epoch; default: now) as the API writes it."""
    moment = datetime.now(UTC) if at is None else datetime.fromtimestamp(at, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Ledger:
    """Read and append ledger entries and checkpoint events."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def last_seq(self, sandbox_id: str) -> int:
        """The sequence number of the sandbox's latest entry (0 when it has none)."""
        rows = self.db.execute("SELECT MAX(seq) FROM ledger WHERE sandbox_id = ?", (sandbox_id,))
        return int(rows[0][0] or 0)

    def append(
        self,
        sandbox_id: str,
        kind: str,
        request: dict[str, Any],
        result: dict[str, Any],
        started_at: str,
        duration_ms: int,
    ) -> int:
        """Record a completed call; returns its sequence number."""
        seq = self.last_seq(sandbox_id) + 1
        self.db.execute(
            "INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                sandbox_id,
                seq,
                kind,
                json.dumps(request),
                json.dumps(result),
                started_at,
                duration_ms,
            ),
        )
        return seq

    def checkpoint(self, sandbox_id: str, snapshot_id: str, name: str | None) -> dict[str, Any]:
        """Record a ``checkpoint_created`` event at the sandbox's current sequence number."""
        event = {
            "seq": self.last_seq(sandbox_id),
            "snapshot_id": snapshot_id,
            "name": name,
            "created_at": now(),
        }
        self.db.execute(
            "INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?)",
            (sandbox_id, event["seq"], snapshot_id, name, event["created_at"]),
        )
        return {"type": "sandbox.checkpoint_created", **event}

    def entries(self, sandbox_id: str, up_to: int | None = None) -> list[dict[str, Any]]:
        """The sandbox's calls in order (only those numbered ``up_to`` or less, if given)."""
        rows = self.db.execute(
            "SELECT * FROM ledger WHERE sandbox_id = ? AND seq <= ? ORDER BY seq",
            (sandbox_id, up_to if up_to is not None else 2**62),
        )
        return [
            {
                "type": f"sandbox.{row['kind']}",
                "seq": row["seq"],
                "kind": row["kind"],
                "request": json.loads(row["request"]),
                "result": json.loads(row["result"]),
                "started_at": row["started_at"],
                "duration_ms": row["duration_ms"],
            }
            for row in rows
        ]

    def events(self, sandbox_id: str) -> list[dict[str, Any]]:
        """Calls and checkpoint events of a sandbox, in order; 404 when it has none."""
        checkpoints = [
            {
                "type": "sandbox.checkpoint_created",
                "seq": row["seq"],
                "snapshot_id": row["snapshot_id"],
                "name": row["name"],
                "created_at": row["created_at"],
            }
            for row in self.db.execute(
                "SELECT * FROM checkpoints WHERE sandbox_id = ? ORDER BY rowid", (sandbox_id,)
            )
        ]
        calls = self.entries(sandbox_id)
        if not calls and not checkpoints:
            raise NotFound(f"no ledger for sandbox {sandbox_id!r}")
        # A checkpoint at seq n comes after call n.
        return sorted(calls + checkpoints, key=lambda e: (e["seq"], "snapshot_id" in e))

    def find_checkpoint(self, sandbox_id: str, name: str | None) -> dict[str, Any]:
        """The latest checkpoint of a sandbox, or its latest one called ``name``."""
        sql = "SELECT * FROM checkpoints WHERE sandbox_id = ?"
        params: tuple[Any, ...] = (sandbox_id,)
        if name is not None:
            sql += " AND name = ?"
            params += (name,)
        rows = self.db.execute(sql + " ORDER BY rowid DESC LIMIT 1", params)
        if not rows:
            which = f"named {name!r}" if name is not None else "at all"
            raise NotFound(f"sandbox {sandbox_id} has no checkpoint {which}")
        return dict(rows[0])

    def copy(self, source: str, target: str, up_to: int) -> None:
        """Start ``target``'s ledger with ``source``'s calls up to ``up_to`` (a resume)."""
        self.db.execute(
            "INSERT INTO ledger SELECT ?, seq, kind, request, result, started_at, duration_ms "
            "FROM ledger WHERE sandbox_id = ? AND seq <= ?",
            (target, source, up_to),
        )
