"""Snapshot records, their directories and the disk and memory layers they share.

A snapshot is a directory ``snapshots/<id>/`` holding its backend's state (a VM's device
state, a container's CRIU image) and its attachments, plus layers in ``layers/``: a frozen
disk layer (a qcow2 file, or a container's layer directory) and, for a VM, a memory layer
(``.mem``). Which files a backend makes is its own business; this store only knows what lies
over what. Layers form chains: a disk layer is an overlay of the one below, down to a
template's image; a memory layer is a delta over the one below or a full image that stands
alone (a boot capture's image ends a chain too). A layer is kept while a snapshot or a
running sandbox has it in a chain, and collected once nothing does. Directories are written
under a temporary name and renamed into place before the database row is added, so a crash
never lists a snapshot that cannot be restored.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import shutil
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sandfork import protocol
from sandfork.backends.base import MachineSpec, StartPoint
from sandfork.engine.db import Database, SandboxRecord, SnapshotRecord
from sandfork.engine.errors import BadRequest, Conflict, NotFound
from sandfork.engine.memory_writes import MemoryWrites, drop_unwritten
from sandfork.protocol import MAX_ATTACHMENT_BYTES as MAX_ATTACHMENT_BYTES
from sandfork.protocol import SNAPSHOT_ID as SNAPSHOT_ID
from sandfork.protocol import new_snapshot_id as new_snapshot_id

log = logging.getLogger(__name__)

ATTACHMENTS = "attachments"  # the folder of a snapshot's attached files


def check_name(name: str) -> str:
    """``name`` if it is a valid snapshot name (:mod:`sandfork.protocol`'s rule), else a 400."""
    try:
        return protocol.check_snapshot_name(name)
    except ValueError as e:
        raise BadRequest(str(e)) from e


def check_attachment_name(name: str) -> str:
    """``name`` if it is a valid attachment name (a plain file name), else a 400."""
    try:
        return protocol.check_attachment_name(name)
    except ValueError as e:
        raise BadRequest(str(e)) from e


def write_attachments(staging: Path, attachments: dict[str, bytes]) -> list[str]:
    """Store files with a snapshot being written; returns their names."""
    if sum(len(data) for data in attachments.values()) > MAX_ATTACHMENT_BYTES:
        raise BadRequest(f"attachments are limited to {MAX_ATTACHMENT_BYTES >> 20} MiB in all")
    if attachments:
        (staging / ATTACHMENTS).mkdir()
    for name, data in attachments.items():
        (staging / ATTACHMENTS / check_attachment_name(name)).write_bytes(data)
    return sorted(attachments)


def stored_bytes(path: Path | None) -> int:
    """Bytes a file (or a folder's files, all the way down) take on disk: holes are free."""
    if path is None or not path.exists():
        return 0
    if not path.is_dir():
        return path.stat().st_blocks * 512
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def _delete(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class SnapshotStore:
    """The snapshots and disk layers of one engine."""

    def __init__(self, db: Database, root: Path, scratch: Path) -> None:
        self.db = db
        self.dir = root / "snapshots"
        self.layers_dir = root / "layers"
        self.tmp_dir = root / "tmp"  # exports, imports and fetches on their way
        self.scratch = scratch
        for path in (self.dir, self.layers_dir, self.scratch):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o700)
        self._records = {s.id: s for s in drop_unwritten(db, db.snapshots())}
        self.writes = MemoryWrites(self)
        self._pending: set[str] = set()
        self._pending_layers: set[str] = set()  # layers being created, not yet referenced
        self._deleter = ThreadPoolExecutor(1, thread_name_prefix="sandfork-delete")
        for folder in (self.dir, self.layers_dir, self.scratch):
            for leftover in folder.glob(".trash-*"):  # an earlier engine died deleting them
                _delete(leftover)
        self._in_use: Counter[str] = Counter()  # snapshots being restored right now
        for snap in [s for s in self._records.values() if s.hidden]:
            # A fork's capture lives in scratch memory and only while the fork runs.
            db.delete_snapshot(snap.id)
            del self._records[snap.id]

    def new_layer(self, backing: Path | None, suffix: str) -> Path:
        """Register a new layer over ``backing`` (``None``: it stands alone); the caller
        creates the file.

        The layer is owned from this moment: :meth:`collect` keeps it until the caller hands
        it over (a record refers to it) or gives it up, both with :meth:`settle`.
        """
        path = self.layers_dir / f"{secrets.token_hex(8)}{suffix}"
        self.db.add_layer(str(path), str(backing or ""))
        self._pending_layers.add(str(path))
        return path

    def set_backing(self, layer: Path, backing: Path | None) -> None:
        """Record what a layer lies over once its writer has chosen (``None``: nothing)."""
        self.db.add_layer(str(layer), str(backing or ""))

    def memory_chain(self, top: str) -> list[Path]:
        """The memory layers from ``top`` down to the full image, top first (``[]`` for a
        sandbox that booted: its memory was zeros)."""
        if not top:
            return []
        layers = self.db.layers()
        chain = [Path(top)]
        while layers.get(str(chain[-1])):
            chain.append(Path(layers[str(chain[-1])]))
        return chain

    async def written_chain(self, top: str) -> list[Path]:
        """:meth:`memory_chain`, once each of its layers is completely written."""
        while True:
            chain = self.memory_chain(top)
            if not await self.writes.wait(chain):
                return chain

    async def start_point(self, snap: SnapshotRecord) -> StartPoint:
        """What a sandbox restored from ``snap`` starts from (once its memory is written: a
        404 if that failed and dropped it)."""
        spec = MachineSpec.from_dict(snap.vm)
        memory = await self.written_chain(snap.memory)
        self.get(snap.id)
        return StartPoint(self.path(snap.id), spec, Path(snap.disk), memory)

    def settle(self, *layers: Path) -> None:
        """End the ownership :meth:`new_layer` started; unreferenced layers can now go."""
        self._pending_layers.difference_update(str(layer) for layer in layers)

    def adopt_chain(self, chain: list[Path]) -> None:
        """Record a running VM's disk chain (top first) as QEMU reports it.

        An engine killed between freezing a layer and saving the sandbox's record left a
        layer the database does not know as the VM's disk: the chain read from QEMU wins.
        """
        for layer, backing in itertools.pairwise(chain):
            if layer.parent == self.layers_dir:
                self.db.add_layer(str(layer), str(backing))

    def staging(self, snapshot_id: str, in_memory: bool) -> Path:
        """A fresh directory to write a snapshot into: in scratch memory, or on disk."""
        self._pending.add(snapshot_id)
        parent = self.scratch if in_memory else self.dir
        parent.mkdir(parents=True, exist_ok=True)  # /dev/shm may have been emptied
        path = parent / f".tmp-{snapshot_id}"
        path.mkdir()
        return path

    def abandon(self, snapshot_id: str, staging: Path) -> None:
        """Drop a capture that failed."""
        shutil.rmtree(staging, ignore_errors=True)
        self._pending.discard(snapshot_id)

    def publish(self, record: SnapshotRecord, staging: Path) -> None:
        """Move a complete snapshot into place (a rename: into scratch memory for a fork's
        capture staged there, else into the snapshot folder) and list it."""
        try:
            in_memory = record.hidden and staging.parent == self.scratch
            staging.rename((self.scratch if in_memory else self.dir) / record.id)
            self.db.put_snapshot(record)
            self._records[record.id] = record
        finally:
            self._pending.discard(staging.name.removeprefix(".tmp-"))

    def path(self, snapshot_id: str, hidden: bool | None = None) -> Path:
        """The directory of a snapshot (a fork's capture may be in scratch memory)."""
        if hidden is None:
            hidden = self.get(snapshot_id).hidden
        in_memory = self.scratch / snapshot_id
        return in_memory if hidden and in_memory.exists() else self.dir / snapshot_id

    def attachment(self, snapshot_id: str, name: str) -> Path:
        """The file ``name`` stored with a snapshot, or 404."""
        record = self.get(snapshot_id)
        if name not in record.attachments:
            raise NotFound(f"snapshot {snapshot_id} has no attachment {name!r}")
        return self.path(snapshot_id) / ATTACHMENTS / name

    @contextlib.contextmanager
    def in_use(self, snapshot_id: str) -> Iterator[SnapshotRecord]:
        """Hold a snapshot while a sandbox is restored from it: deleting it meanwhile is a 409."""
        record = self.get(snapshot_id)
        self._in_use[snapshot_id] += 1
        try:
            yield record
        finally:
            self._in_use[snapshot_id] -= 1
            if not self._in_use[snapshot_id]:  # a Counter keeps zeros: one per restore, for ever
                del self._in_use[snapshot_id]

    def tracked(self) -> dict[str, int]:
        """Sizes of the store's tables (:mod:`sandfork.engine.stats`)."""
        return {
            "snapshot_records": len(self._records),
            "snapshots_pending": len(self._pending),
            "layers_pending": len(self._pending_layers),
            "snapshots_in_use": len(self._in_use),
            **self.writes.tracked(),
        }

    def get(self, snapshot_id: str) -> SnapshotRecord:
        """A snapshot, or 404."""
        record = self._records.get(snapshot_id)
        if record is None:
            raise NotFound(f"no snapshot {snapshot_id!r}")
        return record

    def has(self, snapshot_id: str) -> bool:
        """Whether the snapshot is here (hidden ones included)."""
        return snapshot_id in self._records

    def all(self) -> list[SnapshotRecord]:
        """Every snapshot, hidden ones and hibernation captures included."""
        return list(self._records.values())

    def visible(
        self, sandbox_id: str | None = None, metadata: dict[str, str] | None = None
    ) -> list[SnapshotRecord]:
        """Visible snapshots, newest first (neither forks' captures nor hibernated
        sandboxes'), optionally only those of one sandbox and those whose metadata has every
        key of ``metadata`` with its value."""
        wanted = (metadata or {}).items()
        found = [
            s
            for s in self._records.values()
            if not s.hidden
            and s.hibernation_of is None
            and (sandbox_id is None or s.sandbox_id == sandbox_id)
            and wanted <= s.metadata.items()
        ]
        return sorted(found, key=lambda s: s.created_at, reverse=True)

    def rename(self, snapshot_id: str, name: str) -> SnapshotRecord:
        """Give a snapshot a new name."""
        check_name(name)
        record = self.get(snapshot_id)
        record.name = name
        self.db.put_snapshot(record)
        return record

    def delete(self, snapshot_id: str, sandboxes: list[SandboxRecord]) -> None:
        """Delete a snapshot; layers still used by others stay."""
        if self._in_use[snapshot_id]:
            raise Conflict(
                f"snapshot {snapshot_id} is being restored into a new sandbox right now; "
                "delete it once that has finished"
            )
        self.forget(snapshot_id)
        self.collect(sandboxes)

    def forget(self, snapshot_id: str) -> None:
        """Unlist a snapshot and delete its folder; its layers go with the next collection."""
        record = self.get(snapshot_id)
        self.db.delete_snapshot(snapshot_id)
        del self._records[snapshot_id]
        self._remove(self.path(snapshot_id, record.hidden))

    def _remove(self, path: Path) -> None:
        """Delete a file or folder off the event loop: unlinking gigabytes takes a while.

        Renamed first, so a snapshot id is free at once; an engine killed before the
        deletion is done finds the leftover unowned at its next start and deletes it then.
        """
        doomed = path.with_name(f".trash-{path.name}")
        with contextlib.suppress(FileNotFoundError):
            path.rename(doomed)
            self._deleter.submit(_delete, doomed)

    def drain(self) -> None:
        """Wait until every deletion handed to the background so far is done."""
        self._deleter.submit(lambda: None).result()

    def collect(self, sandboxes: list[SandboxRecord]) -> None:
        """Delete leftovers of interrupted snapshots and every layer nothing uses."""
        scratch = list(self.scratch.iterdir()) if self.scratch.exists() else []
        for entry in [*self.dir.iterdir(), *scratch]:
            if entry.name.startswith(".trash-"):
                continue  # being deleted
            name = entry.name.removeprefix(".tmp-")
            if name not in self._records and name not in self._pending:
                log.info("removing incomplete snapshot directory %s", entry)
                self._remove(entry)
        layers = self.db.layers()
        keep: set[str] = set()
        roots = [s.disk for s in self._records.values()] + [s.disk for s in sandboxes]
        roots += [s.memory for s in self._records.values()] + [s.memory for s in sandboxes]
        roots += self._pending_layers
        for path in roots:
            while path in layers and path not in keep:
                keep.add(path)
                path = layers[path]
        for path in set(layers) - keep:
            self._remove(Path(path))
            self.db.delete_layer(path)

    def remove_strays(self) -> None:
        """Delete the layer files the database does not know (left by an engine killed
        before it recorded them). Only at start: no layer is being created then."""
        known = self.db.layers()
        for stray in self.layers_dir.glob("[!.]*"):
            if str(stray) not in known:
                self._remove(stray)
