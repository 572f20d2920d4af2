"""The engine's metadata in SQLite: one row per sandbox and per snapshot.

A record's columns are its dataclass fields (:func:`stored_fields`): a field added to the
wire model (:mod:`sandfork.protocol.models`) or to a record is stored, and an existing
database gains its column when it is opened (:meth:`Database._migrate`). Lists and dicts are
stored as JSON, booleans as integers, enums as their value.

Writes are small and rare (create, status change, kill), so the standard ``sqlite3`` module
is used directly from the event loop; WAL mode keeps a reader from blocking a writer.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sqlite3
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypedDict, TypeVar

from sandfork.engine.changes import ChangeFeed
from sandfork.protocol import (
    FORK_PARENT,
    FORK_TREE,
    HIBERNATION_OF,
    PROMOTED_FROM,
    RESUMED_FROM,
    SandboxInfo,
    SnapshotInfo,
)

R = TypeVar("R", "SandboxRecord", "SnapshotRecord")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS snapshots (id TEXT PRIMARY KEY);
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

SANDBOX_RELATIONS = (FORK_PARENT, FORK_TREE, PROMOTED_FROM, RESUMED_FROM)
"""The sandbox's fields that relate it to others, which the API also shows in ``metadata``."""


class Relations(TypedDict, total=False):
    """The relations a new sandbox starts with (fields of :class:`SandboxRecord`)."""

    fork_parent_id: str
    fork_tree_id: str
    resumed_from: str


@dataclass
class SandboxRecord(SandboxInfo):
    """A sandbox as the engine keeps it across restarts: what the API shows
    (:class:`SandboxInfo`), plus where it lives (its folder, its process, the memory layer
    its RAM matched when started or last captured) and the machine it runs as."""

    TABLE: ClassVar[str] = "sandboxes"
    NOT_STORED: ClassVar[frozenset[str]] = frozenset({"isolation"})  # its backend's name
    RELATIONS: ClassVar[tuple[str, ...]] = SANDBOX_RELATIONS  # kept in metadata once

    dir: str = ""
    pid: int | None = None
    vm: dict[str, Any] = field(default_factory=dict)
    memory: str = ""

    def __post_init__(self) -> None:
        self.isolation = self.backend

    def api_metadata(self) -> dict[str, str]:
        """Its ``metadata`` as the API shows it: the client's, plus the relations the engine
        records (PandaStack's clients read ``promoted_from`` and ``fork_parent_id`` there)."""
        relations = {key: getattr(self, key) for key in SANDBOX_RELATIONS}
        return {**self.metadata, **{k: v for k, v in relations.items() if v is not None}}

    def to_api(self) -> dict[str, Any]:
        """The sandbox as the API shows it, its relations in ``metadata`` too (a view, never
        read back: :meth:`api_metadata`)."""
        return {**super().to_api(), "metadata": self.api_metadata()}


@dataclass
class SnapshotRecord(SnapshotInfo):
    """A snapshot as the engine keeps it: what the API shows (:class:`SnapshotInfo`), plus
    where it lives (a frozen disk layer, a memory layer, device state in its folder), the
    VM it restores into, whether it is a fork's hidden capture, and the sandbox it is the
    hibernation capture of (neither is listed)."""

    TABLE: ClassVar[str] = "snapshots"
    NOT_STORED: ClassVar[frozenset[str]] = frozenset({"memory_mb", "cpu"})  # from vm
    RELATIONS: ClassVar[tuple[str, ...]] = (HIBERNATION_OF,)

    disk: str = ""
    memory: str = ""
    vm: dict[str, Any] = field(default_factory=dict)
    hidden: bool = False
    hibernation_of: str | None = None

    def __post_init__(self) -> None:
        self.memory_mb, self.cpu = self.vm.get("memory_mb"), self.vm.get("cpus")

    @property
    def backend(self) -> str:
        """The backend that took it (and restores it)."""
        return str(self.vm.get("backend", "vm"))


def _base(hint: Any) -> Any:
    """The type of an annotation, ``X | None`` being ``X``'s."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    return typing.get_origin(hint) or hint


_COLUMNS: dict[type, dict[str, Any]] = {}  # stored_fields of each record class, once made


def stored_fields(cls: type[R]) -> dict[str, Any]:
    """The record's columns: each stored field, mapped to its type."""
    if cls not in _COLUMNS:
        hints = typing.get_type_hints(cls)
        _COLUMNS[cls] = {
            f.name: _base(hints[f.name])
            for f in dataclasses.fields(cls)
            if f.name not in cls.NOT_STORED
        }
    return _COLUMNS[cls]


def _to_column(value: Any, kind: Any) -> Any:
    if value is None:
        return None
    if kind in (list, dict):
        return json.dumps(value)
    if isinstance(value, enum.Enum):
        return value.value
    return int(value) if kind is bool else value


def _from_column(value: Any, kind: Any) -> Any:
    if value is None:
        return None
    if kind in (list, dict):
        return json.loads(value)
    if isinstance(kind, type) and issubclass(kind, enum.Enum | bool):
        return kind(value)
    return value


def _declaration(kind: Any, default: Any) -> str:
    """The column's SQL declaration: its type affinity and the field's default (what rows of
    a database older than the column take)."""
    affinity = {int: "INTEGER", bool: "INTEGER", float: "REAL"}.get(kind, "TEXT")
    if default is dataclasses.MISSING or default is None:
        return affinity
    literal = _to_column(default, kind)
    if not isinstance(literal, int | float):
        literal = "'" + str(literal).replace("'", "''") + "'"
    return f"{affinity} DEFAULT {literal}"


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


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
        self._migrate(SandboxRecord)
        self._migrate(SnapshotRecord)
        self.changes = ChangeFeed()

    def _migrate(self, cls: type[R]) -> None:
        """Bring the record's table up to its fields: a column renamed since (``cpus``) takes
        its new name, a missing one is added, and relations that rows of earlier versions
        kept in their ``metadata`` move to their own columns."""
        table = cls.TABLE
        have = {row["name"] for row in self._conn.execute(f"PRAGMA table_info({table})")}
        if "cpus" in have and "cpu" in stored_fields(cls):
            self._conn.execute(f"ALTER TABLE {table} RENAME COLUMN cpus TO cpu")
            have = (have - {"cpus"}) | {"cpu"}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, kind in stored_fields(cls).items():
            if name not in have:
                declaration = _declaration(kind, _default(fields[name]))
                self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
        rows = self._conn.execute(f"SELECT id, metadata FROM {table}").fetchall()
        for row in rows:
            metadata = json.loads(row["metadata"] or "{}")
            moved = {key: metadata.pop(key) for key in cls.RELATIONS if key in metadata}
            if moved:
                sets = ", ".join(f"{key} = :{key}" for key in moved)
                self._conn.execute(
                    f"UPDATE {table} SET metadata = :metadata, {sets} WHERE id = :id",
                    {**moved, "metadata": json.dumps(metadata), "id": row["id"]},
                )

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def _replace(self, record: R) -> None:
        kinds = stored_fields(type(record))
        row = {name: _to_column(getattr(record, name), kind) for name, kind in kinds.items()}
        cols = ", ".join(row)
        marks = ", ".join(f":{c}" for c in row)
        self._conn.execute(f"INSERT OR REPLACE INTO {record.TABLE} ({cols}) VALUES ({marks})", row)

    def _load(self, cls: type[R]) -> list[R]:
        """Every row of the record's table, oldest first."""
        kinds = stored_fields(cls)
        rows = self._conn.execute(f"SELECT * FROM {cls.TABLE} ORDER BY created_at").fetchall()
        return [
            cls(**{name: _from_column(row[name], kind) for name, kind in kinds.items()})
            for row in rows
        ]

    def put(self, record: SandboxRecord) -> None:
        """Insert or replace a sandbox row."""
        self._replace(record)
        metadata = json.dumps(record.api_metadata(), sort_keys=True)
        self.changes.sandbox(record.id, (record.status, metadata, record.from_snapshot))

    def delete(self, sandbox_id: str) -> None:
        """Forget a sandbox."""
        self._conn.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))
        self.changes.forget(sandbox_id)

    def all(self) -> list[SandboxRecord]:
        """Every sandbox, oldest first."""
        return self._load(SandboxRecord)

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """Run one statement and return its rows (for the engine's smaller tables)."""
        return self._conn.execute(sql, params).fetchall()

    def put_snapshot(self, snap: SnapshotRecord) -> None:
        """Insert or replace a snapshot row."""
        self._replace(snap)
        self.changes.bump()

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Forget a snapshot."""
        self._conn.execute("DELETE FROM snapshots WHERE id = ?", (snapshot_id,))
        self.changes.bump()

    def snapshots(self) -> list[SnapshotRecord]:
        """Every snapshot, oldest first."""
        return self._load(SnapshotRecord)

    def add_layer(self, path: str, backing: str) -> None:
        """Record a layer and the one it lies over (``""``: it stands alone)."""
        self._conn.execute("INSERT OR REPLACE INTO layers VALUES (?, ?)", (path, backing))

    def delete_layer(self, path: str) -> None:
        """Forget a disk layer."""
        self._conn.execute("DELETE FROM layers WHERE path = ?", (path,))

    def layers(self) -> dict[str, str]:
        """Every layer (disk or memory), mapped to the one it lies over."""
        return dict(self._conn.execute("SELECT path, backing FROM layers").fetchall())
