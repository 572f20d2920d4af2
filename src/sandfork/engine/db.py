"""The engine's metadata in SQLite: one row per sandbox.

Writes are small and rare (create, status change, kill), so the standard ``sqlite3`` module
is used directly from the event loop; WAL mode keeps a reader from blocking a writer.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    template TEXT NOT NULL,
    status TEXT NOT NULL,
    cpus INTEGER NOT NULL,
    memory_mb INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}',
    persistent INTEGER NOT NULL DEFAULT 0,
    backend TEXT NOT NULL,
    accelerator TEXT NOT NULL,
    dir TEXT NOT NULL,
    pid INTEGER,
    boot_ms INTEGER,
    error TEXT,
    from_snapshot TEXT
);
"""


@dataclass
class SandboxRecord:
    """What the engine remembers about a sandbox across restarts."""

    id: str
    template: str
    status: str  # "starting", "running", "dead"
    cpus: int
    memory_mb: int
    created_at: str
    backend: str
    accelerator: str
    dir: str
    metadata: dict[str, str] = field(default_factory=dict)
    persistent: bool = False
    pid: int | None = None
    boot_ms: int | None = None
    error: str | None = None
    from_snapshot: str | None = None

    def to_api(self) -> dict[str, Any]:
        """The sandbox as the HTTP API shows it (PandaStack's shape plus our fields)."""
        return {
            "id": self.id,
            "template": self.template,
            "status": self.status,
            "cpu": self.cpus,
            "memory_mb": self.memory_mb,
            "created_at": self.created_at,
            "metadata": self.metadata,
            "persistent": self.persistent,
            "from_snapshot": self.from_snapshot,
            "boot_ms": self.boot_ms,
            "boot_mode": "cold",
            "backend": self.backend,
            "accelerator": self.accelerator,
            "error": self.error,
        }


class Database:
    """The engine's SQLite database."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(path, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def put(self, record: SandboxRecord) -> None:
        """Insert or replace a sandbox row."""
        row = asdict(record)
        row["metadata"] = json.dumps(record.metadata)
        row["persistent"] = int(record.persistent)
        cols = ", ".join(row)
        marks = ", ".join(f":{c}" for c in row)
        self._conn.execute(f"INSERT OR REPLACE INTO sandboxes ({cols}) VALUES ({marks})", row)

    def delete(self, sandbox_id: str) -> None:
        """Forget a sandbox."""
        self._conn.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))

    def all(self) -> list[SandboxRecord]:
        """Every sandbox, oldest first."""
        rows = self._conn.execute("SELECT * FROM sandboxes ORDER BY created_at").fetchall()
        return [_record(row) for row in rows]


def _record(row: sqlite3.Row) -> SandboxRecord:
    data = dict(row)
    data["metadata"] = json.loads(data["metadata"] or "{}")
    data["persistent"] = bool(data["persistent"])
    return SandboxRecord(**data)
