"""Snapshots of running sandboxes, forks, checkpoints, and snapshots moved between machines.

One job: captures. A snapshot is taken with the sandbox paused (see
:meth:`sandfork.backends.base.Instance.snapshot`) and listed only once complete; a fork is
a hidden snapshot restored N times; a checkpoint is a snapshot marked in the ledger; an
export is one self-contained file that another engine imports trusting nothing in it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sandfork.backends.base import CaptureRequest
from sandfork.backends.vm.backend import VmBackend
from sandfork.crashpoints import crash_point
from sandfork.engine import exchange, inventory
from sandfork.engine.backends import Backends
from sandfork.engine.db import SandboxRecord, SnapshotRecord
from sandfork.engine.errors import ApiError, Conflict
from sandfork.engine.execution import ExecutionService
from sandfork.engine.ledger import Ledger, now
from sandfork.engine.limits import Limits
from sandfork.engine.sandboxes import HIBERNATED, SandboxService
from sandfork.engine.snapshots import (
    ATTACHMENTS,
    SnapshotStore,
    new_snapshot_id,
    stored_bytes,
    write_attachments,
)
from sandfork.holdpoints import hold_point
from sandfork.protocol import (
    FORK_PARENT,
    FORK_TREE,
    HIBERNATION_OF,
    INVENTORY_ATTACHMENT,
    RESUMED_FROM,
    new_fork_tree_id,
)


class SnapshotService:
    """Takes, forks, checkpoints, exports, imports and deletes snapshots."""

    def __init__(
        self,
        sandboxes: SandboxService,
        execution: ExecutionService,
        store: SnapshotStore,
        ledger: Ledger,
        backends: Backends,
        limits: Limits,
        home: Path,
        inventory_timeout: float,
        hibernate_wait: float,
    ) -> None:
        self.sandboxes = sandboxes
        self.execution = execution
        self.store = store
        self.ledger = ledger
        self.backends = backends
        self.limits = limits
        self.inventory_timeout = inventory_timeout
        self.hibernate_wait = hibernate_wait
        sandboxes.waker = self._wake
        self.tmp_dir = home / "tmp"  # export and import files; what a killed engine left goes
        exchange.reset_tmp(self.tmp_dir)

    def visible(self, sandbox_id: str | None = None) -> list[SnapshotRecord]:
        """Visible snapshots, newest first, optionally only those of one sandbox (killed
        ones included: their snapshots outlive them)."""
        return self.store.visible(sandbox_id)

    def get(self, snapshot_id: str) -> SnapshotRecord:
        """A snapshot, or 404."""
        return self.store.get(snapshot_id)

    def rename(self, snapshot_id: str, name: str) -> SnapshotRecord:
        """Give a snapshot a new name."""
        return self.store.rename(snapshot_id, name)

    def attachment(self, snapshot_id: str, name: str) -> bytes:
        """The file ``name`` stored with a snapshot, or 404."""
        return self.store.attachment(snapshot_id, name).read_bytes()

    async def snapshot(
        self,
        sandbox_id: str,
        name: str | None = None,
        *,
        hidden: bool = False,
        metadata: dict[str, str] | None = None,
        attachments: dict[str, bytes] | None = None,
    ) -> SnapshotRecord:
        """Capture a running sandbox (it keeps running) into an immutable snapshot.

        ``attachments`` are files stored with it (a notebook document, say), written before
        the snapshot is listed: it appears with them or not at all. A visible snapshot also
        gets the engine's ``inventory.json`` (:mod:`sandfork.engine.inventory`).
        """
        inventory.refuse_client_inventory(attachments)
        async with self.sandboxes.working(sandbox_id) as live:  # a sleeper wakes first
            estimate = live.instance.memory_bytes()
            if hidden:  # a fork's capture: no quota (not listed), but its layers are on disk
                self.limits.check_disk(estimate)
            else:
                stored = sum(s.size_bytes for s in self.store.visible())
                self.limits.check_snapshot(stored, estimate)
            async with self.sandboxes.lock(sandbox_id):
                return await self._capture(sandbox_id, name, hidden, metadata, attachments)

    async def hibernate(self, sandbox_id: str) -> SandboxRecord:
        """Capture a sandbox and stop its VM (its memory freed); any later use wakes it from
        the capture under the same id (:meth:`wake`). Hibernating a hibernated sandbox does
        nothing.

        It waits, at most ``hibernate_wait`` seconds, until no operation runs in the sandbox
        and none of its kernels is busy, holding new operations back meanwhile (they run,
        waking the sandbox, once it is asleep); a 409 "busy" past the wait
        (:mod:`sandfork.engine.activity`)."""
        if self.sandboxes.get(sandbox_id).status not in HIBERNATED:
            self.sandboxes.live(sandbox_id)  # a 409 for a dead one
        busy = functools.partial(self.sandboxes.busy_kernels, sandbox_id)
        async with (
            self.sandboxes.activity.quiet(sandbox_id, busy, self.hibernate_wait),
            self.sandboxes.lock(sandbox_id),
        ):
            record = self.sandboxes.get(sandbox_id)
            if record.status in HIBERNATED:
                return record
            await self._capture(sandbox_id, None, False, {HIBERNATION_OF: sandbox_id}, None)
            crash_point("hibernate.captured")
            return await self.sandboxes.hibernated(sandbox_id)

    async def wake(self, sandbox_id: str) -> SandboxRecord:
        """Resume a hibernated sandbox from its capture, under the same id (after a
        hibernation under way); a running one is left as it is."""
        await self.sandboxes.activity.held_back(sandbox_id)
        return await self._wake(sandbox_id)

    async def _wake(self, sandbox_id: str) -> SandboxRecord:
        """:meth:`wake` now; the capture is deleted once the sandbox runs again."""
        async with self.sandboxes.lock(sandbox_id):
            record = self.sandboxes.get(sandbox_id)
            if record.status not in HIBERNATED:
                return record
            snap = self.store.hibernation_of(sandbox_id)
            if snap is None:
                self.sandboxes.mark_dead(record, "its hibernation capture is missing")
                raise Conflict(f"sandbox {sandbox_id} cannot wake: its capture is missing")
            capture = self.store.capture(snap)
            suffix = self.backends[capture.spec.backend].images.suffix
            disk = self.store.new_layer(capture.disk, suffix)  # later writes are dropped
            record.status, record.disk = "waking", str(disk)
            self.sandboxes.save(record)
            self.store.settle(disk)
            try:
                await self.sandboxes.run_vm(record, capture)
            except Exception as e:
                record.status = "hibernated"
                self.sandboxes.save(record)
                raise ApiError(f"could not wake sandbox {sandbox_id}: {e}", 500) from e
            crash_point("wake.resumed")
            self.store.delete(snap.id, self.sandboxes.all())
        return record

    async def _capture(
        self,
        sandbox_id: str,
        name: str | None,
        hidden: bool,
        metadata: dict[str, str] | None,
        attachments: dict[str, bytes] | None,
    ) -> SnapshotRecord:
        """:meth:`snapshot`, the sandbox's lock held."""
        await hold_point("snapshot.capture")
        live = self.sandboxes.live(sandbox_id)  # it may have been killed while we waited
        record = live.record
        contexts = await self.execution.contexts_of(live)
        if not hidden and HIBERNATION_OF not in (metadata or {}):
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

        request = CaptureRequest(
            Path(record.disk), self.store.memory_chain(record.memory), new_layer
        )
        try:
            captured = await live.instance.snapshot(staging, request)
        except Exception as e:
            self.store.abandon(snapshot_id, staging)
            self.store.settle(*made)
            raise ApiError(f"the snapshot failed: {e}", 500) from e
        if captured.memory is not None:
            self.store.set_backing(captured.memory, captured.memory_backing)
        crash_point("snapshot.frozen")
        record.disk = str(captured.sandbox_disk)
        if captured.sandbox_memory is not None:
            record.memory = str(captured.sandbox_memory)
        self.sandboxes.save(record)
        self.store.settle(*made)
        snap = SnapshotRecord(
            id=snapshot_id,
            name=name,
            created_at=now(),
            sandbox_id=sandbox_id,
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
        )
        crash_point("snapshot.written")
        self.store.publish(snap, staging)
        return snap

    async def fork(
        self, sandbox_id: str, count: int, *, metadata: dict[str, str], reseed_python: bool
    ) -> list[SandboxRecord]:
        """Clone a running sandbox ``count`` times from one capture; the parent runs on."""
        parent = self.sandboxes.get(sandbox_id)
        self.sandboxes.check_room(count, parent.memory_mb)
        backend = self.backends.of(parent)
        if not backend.shares_memory:
            used = self.sandboxes.live(sandbox_id).instance.memory_bytes()
            copies = count + 1 if backend.captures_in_memory else count  # the capture's too
            self.limits.check_host_memory(copies * used, f"{count} copies of sandbox {sandbox_id}")
        snap = await self.snapshot(sandbox_id, hidden=True)
        crash_point("fork.captured")
        tree = new_fork_tree_id()
        try:
            children = await asyncio.gather(
                *(
                    self.sandboxes.create_from_snapshot(
                        snap.id,
                        metadata={**metadata, FORK_PARENT: sandbox_id, FORK_TREE: tree},
                        persistent=parent.persistent,
                        host_access=parent.host_access,
                    )
                    for _ in range(count)
                ),
                return_exceptions=True,
            )
        finally:
            self.store.delete(snap.id, self.sandboxes.all())
        failures = [c for c in children if isinstance(c, BaseException)]
        made = [c for c in children if isinstance(c, SandboxRecord)]
        if failures:
            for child in made:
                await self.sandboxes.kill(child.id)
            raise ApiError(f"the fork failed: {failures[0]}", 500)
        for child in made:
            child.from_snapshot = None
            child.metadata[FORK_PARENT] = sandbox_id
            self.sandboxes.save(child)
            if reseed_python:
                await self.execution.reseed_python(child.id)
        return made

    async def checkpoint(self, sandbox_id: str, name: str | None) -> dict[str, Any]:
        """Snapshot the sandbox and record a ``checkpoint_created`` event in its ledger."""
        snap = await self.snapshot(sandbox_id, name)
        return self.ledger.checkpoint(sandbox_id, snap.id, name)

    async def resume(
        self, sandbox_id: str, name: str | None
    ) -> tuple[SandboxRecord, list[dict[str, Any]]]:
        """Restore the latest (or named) checkpoint of a sandbox, alive or killed.

        Returns the new sandbox and the calls made before the checkpoint, which the client
        replays from cache; the new sandbox's ledger starts with them.
        """
        checkpoint = self.ledger.find_checkpoint(sandbox_id, name)
        metadata = {RESUMED_FROM: sandbox_id}
        record = await self.sandboxes.create_from_snapshot(
            checkpoint["snapshot_id"], metadata=metadata, persistent=False
        )
        self.ledger.copy(sandbox_id, record.id, checkpoint["seq"])
        return record, self.ledger.entries(record.id)

    async def export_snapshot(self, snapshot_id: str, out: Path) -> None:
        """Write a snapshot to one portable file (see :mod:`sandfork.engine.exchange`)."""
        snap = self.store.get(snapshot_id)
        backend = self._exchanging(snap.vm.get("backend", "vm"))
        chain = self.store.memory_chain(snap.memory)
        flat = Path(tempfile.mkdtemp(prefix="export-", dir=self.tmp_dir)) / "memory.img"
        try:
            if len(chain) > 1:  # the file is self-contained: one full image
                await asyncio.to_thread(backend.flatten_memory, chain, flat, snap.vm["memory_mb"])
            await asyncio.to_thread(
                exchange.export_snapshot,
                snap,
                self.store.path(snap.id),
                flat if len(chain) > 1 else chain[0],
                out,
                backend.images,
            )
        finally:
            shutil.rmtree(flat.parent, ignore_errors=True)

    async def import_snapshot(self, file: Path, limits: exchange.ImportLimits) -> SnapshotRecord:
        """Add the snapshot in an exported file under a new id; its template is built here if
        needed. Nothing in the file is trusted (see :mod:`sandfork.engine.exchange`)."""
        snapshot_id = new_snapshot_id()
        backend = self._exchanging("vm")
        staging = Path(tempfile.mkdtemp(prefix="import-", dir=self.tmp_dir))
        memory = self.store.new_layer(None, ".mem")
        layers: list[Path] = [memory]
        try:
            stored = sum(s.size_bytes for s in self.store.visible())

            def admit(manifest: exchange.Manifest) -> None:  # before a member is written
                self.limits.check_snapshot(stored, manifest.total_bytes)

            manifest = await asyncio.to_thread(exchange.unpack, file, staging, limits, admit)
            built = await self.sandboxes.template(manifest.fields["template"])
            if (built.boot_key, built.rootfs.parent.name) != (
                manifest.boot_key,
                manifest.rootfs_key,
            ):
                raise Conflict(
                    f"this snapshot needs template {built.name!r} built from the same inputs "
                    f"(boot {manifest.boot_key}, image {manifest.rootfs_key}); "
                    f"here it is boot {built.boot_key}, image {built.rootfs.parent.name}"
                )
            await asyncio.to_thread(
                exchange.check_layers, staging, manifest.layers, built.rootfs, backend.images
            )
            backing = built.rootfs
            for i in range(manifest.layers):
                layer = self.store.new_layer(backing, backend.images.suffix)
                layers.append(layer)
                (staging / f"layer{i}.qcow2").rename(layer)
                await asyncio.to_thread(backend.images.rebase, layer, backing)
                backing = layer
            if manifest.fields["attachments"]:
                (staging / ATTACHMENTS).mkdir()
            for name in manifest.fields["attachments"]:
                (staging / (exchange.ATTACHMENT_PREFIX + name)).rename(staging / ATTACHMENTS / name)
            imported = staging / ATTACHMENTS / INVENTORY_ATTACHMENT
            if imported.exists():
                imported.write_bytes(inventory.sanitized(imported.read_bytes()))
            (staging / "memory.img").rename(memory)
            os.truncate(memory, manifest.memory_mb * 2**20)  # VMs map it whole
            spec = backend.spec(built, manifest.memory_mb, manifest.cpus)
            # The saved state needs the accelerator it was taken under.
            vm = {**spec.to_dict(), "accelerator": manifest.accelerator}
            snap = manifest.record(snapshot_id, backing, vm)
            snap.memory = str(memory)
            self.store.publish(snap, staging)
            return snap
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            self.store.settle(*layers)
            self.store.collect(self.sandboxes.all())

    def _exchanging(self, name: str) -> VmBackend:
        """The backend whose snapshots travel in files: the VM's (container snapshots do not
        yet: their CRIU images would have to be proved harmless before a restore, which runs
        as root)."""
        backend = self.backends[name]
        if not isinstance(backend, VmBackend):
            raise ApiError(
                f"snapshots of the {name} backend cannot be exported or imported yet", 501
            )
        return backend

    def delete(self, snapshot_id: str) -> None:
        """Delete a snapshot; what other snapshots and sandboxes use stays."""
        self.store.delete(snapshot_id, self.sandboxes.all())
