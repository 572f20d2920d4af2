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

from sandfork.engine.changes import ChangeFeed
from sandfork.protocol import SnapshotInfo

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
    from_snapshot TEXT,
    disk TEXT NOT NULL,
    vm TEXT NOT NULL,
    boot_mode TEXT NOT NULL DEFAULT 'cold',
    host_access INTEGER NOT NULL DEFAULT 0,
    lease_seconds REAL,
    on_expiry TEXT NOT NULL DEFAULT 'kill',
    memory TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY,
    name TEXT,
    created_at TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    template TEXT NOT NULL,
    parent_id TEXT,
    disk TEXT NOT NULL,
    vm TEXT NOT NULL,
    contexts TEXT NOT NULL DEFAULT '[]',
    size_bytes INTEGER NOT NULL,
    paused_ms INTEGER NOT NULL DEFAULT 0,
    hidden INTEGER NOT NULL DEFAULT 0,
    metadata TEXT NOT NULL DEFAULT '{}',
    attachments TEXT NOT NULL DEFAULT '[]',
    memory TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS ledger (
    sandbox_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    request TEXT NOT NULL,
    result TEXT NOT NULL,
    started_at TEXT NOT NULL,
    duration_ms INTEGER NOT NULL,
    PRIMARY KEY (sandbox_id, seq)
);
CREATE TABLE IF NOT EXISTS checkpoints (
    sandbox_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    snapshot_id TEXT NOT NULL,
    name TEXT,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS layers (
    path TEXT PRIMARY KEY,
    backing TEXT NOT NULL
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
    disk: str = ""
    vm: dict[str, Any] = field(default_factory=dict)
    boot_mode: str = "cold"
    host_access: bool = False  # the guest may reach the host's network (opt-in)
    lease_seconds: float | None = None  # killed when its holder stops renewing for this long
    on_expiry: str = "kill"  # or "hibernate": what its lease running out does (ON_EXPIRY)
    memory: str = ""  # the memory layer its RAM matched when started or last captured

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
            "boot_mode": self.boot_mode,
            "backend": self.backend,
            "isolation": self.backend,  # what separates it from the host: "vm" or "container"
            "accelerator": self.accelerator,
            "error": self.error,
            "disk": self.disk,
            "host_access": self.host_access,
            "lease_seconds": self.lease_seconds,
            "on_expiry": self.on_expiry,
        }


class Database:
    """The engine's SQLite database."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(path, isolation_level=None)
        path.chmod(0o600)  # the ledger holds command output
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        # Durable through any crash of the engine (not of the machine), without an fsync
        # on the event loop at every write.
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)
        self._migrate()
        self.changes = ChangeFeed()

    def _migrate(self) -> None:
        """Add the columns that databases of earlier versions lack."""
        added = {
            "snapshots": {
                "metadata": "TEXT NOT NULL DEFAULT '{}'",
                "attachments": "TEXT NOT NULL DEFAULT '[]'",
                "memory": "TEXT NOT NULL DEFAULT ''",
            },
            "sandboxes": {
                "host_access": "INTEGER NOT NULL DEFAULT 0",
                "lease_seconds": "REAL",
                "on_expiry": "TEXT NOT NULL DEFAULT 'kill'",
                "memory": "TEXT NOT NULL DEFAULT ''",
            },
        }
        for table, columns in added.items():
            have = {row["name"] for row in self._conn.execute(f"PRAGMA table_info({table})")}
            for column, declaration in columns.items():
                if column not in have:
                    self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def put(self, record: SandboxRecord) -> None:
        """Insert or replace a sandbox row."""
        row = asdict(record)
        row["metadata"] = json.dumps(record.metadata)
        row["vm"] = json.dumps(record.vm)
        row["persistent"] = int(record.persistent)
        row["host_access"] = int(record.host_access)
        self._replace("sandboxes", row)
        self.changes.sandbox(record.id, (record.status, row["metadata"], record.from_snapshot))

    def _replace(self, table: str, row: dict[str, Any]) -> None:
        cols = ", ".join(row)
        marks = ", ".join(f":{c}" for c in row)
        self._conn.execute(f"INSERT OR REPLACE INTO {table} ({cols}) VALUES ({marks})", row)

    def delete(self, sandbox_id: str) -> None:
        """Forget a sandbox."""
        self._conn.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))
        self.changes.forget(sandbox_id)

    def all(self) -> list[SandboxRecord]:
        """Every sandbox, oldest first."""
        rows = self._conn.execute("SELECT * FROM sandboxes ORDER BY created_at").fetchall()
        return [_record(row) for row in rows]

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """Run one statement and return its rows (for the engine's smaller tables)."""
        return self._conn.execute(sql, params).fetchall()

    def put_snapshot(self, snap: SnapshotRecord) -> None:
        """Insert or replace a snapshot row."""
        row = asdict(snap)
        del row["memory_mb"], row["cpu"]  # derived from vm
        row["vm"] = json.dumps(snap.vm)
        row["contexts"] = json.dumps(snap.contexts)
        row["hidden"] = int(snap.hidden)
        row["metadata"] = json.dumps(snap.metadata)
        row["attachments"] = json.dumps(snap.attachments)
        self._replace("snapshots", row)
        self.changes.bump()

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Forget a snapshot."""
        self._conn.execute("DELETE FROM snapshots WHERE id = ?", (snapshot_id,))
        self.changes.bump()

    def snapshots(self) -> list[SnapshotRecord]:
        """Every snapshot, oldest first."""
        rows = self._conn.execute("SELECT * FROM snapshots ORDER BY created_at").fetchall()
        return [_snapshot(row) for row in rows]

    def add_layer(self, path: str, backing: str) -> None:
        """Record a layer and the one it lies over (``""``: it stands alone)."""
        self._conn.execute("INSERT OR REPLACE INTO layers VALUES (?, ?)", (path, backing))

    def delete_layer(self, path: str) -> None:
        """Forget a disk layer."""
        self._conn.execute("DELETE FROM layers WHERE path = ?", (path,))

    def layers(self) -> dict[str, str]:
        """Every layer (disk or memory), mapped to the one it lies over."""
        return dict(self._conn.execute("SELECT path, backing FROM layers").fetchall())


@dataclass
class SnapshotRecord(SnapshotInfo):
    """A snapshot as the engine keeps it: what the API shows (:class:`SnapshotInfo`), plus
    where it lives (a frozen disk layer, a memory layer, device state in its folder), the
    VM it restores into, and whether it is a fork's hidden capture."""

    disk: str = ""
    memory: str = ""
    vm: dict[str, Any] = field(default_factory=dict)
    hidden: bool = False

    def __post_init__(self) -> None:
        self.memory_mb, self.cpu = self.vm.get("memory_mb"), self.vm.get("cpus")

    @property
    def backend(self) -> str:
        """The backend that took it (and restores it)."""
        return str(self.vm.get("backend", "vm"))


def _record(row: sqlite3.Row) -> SandboxRecord:
    data = dict(row)
    data["metadata"] = json.loads(data["metadata"] or "{}")
    data["vm"] = json.loads(data["vm"])
    data["persistent"] = bool(data["persistent"])
    data["host_access"] = bool(data["host_access"])
    return SandboxRecord(**data)


def _snapshot(row: sqlite3.Row) -> SnapshotRecord:
    data = dict(row)
    data["vm"] = json.loads(data["vm"])
    data["contexts"] = json.loads(data["contexts"])
    data["hidden"] = bool(data["hidden"])
    data["metadata"] = json.loads(data["metadata"])
    data["attachments"] = json.loads(data["attachments"])
    return SnapshotRecord(**data)
