"""Snapshots of running sandboxes, forks, checkpoints, and snapshots moved between machines.

One job: what is made of captures. A snapshot is a capture (:mod:`sandfork.engine.capture`)
within the engine's quota; a fork is a hidden snapshot restored N times; a checkpoint is a
snapshot marked in the ledger; an export is one self-contained file that another engine
imports trusting nothing in it. The snapshots themselves are kept by
:mod:`sandfork.engine.snapshot_store`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sandfork.backends.vm.backend import VmBackend
from sandfork.crashpoints import crash_point
from sandfork.engine import exchange, inventory
from sandfork.engine.backends import Backends
from sandfork.engine.db import SandboxRecord, SnapshotRecord
from sandfork.engine.errors import ApiError, Conflict
from sandfork.engine.execution import ExecutionService
from sandfork.engine.ledger import Ledger
from sandfork.engine.limits import Limits
from sandfork.engine.sandboxes import SandboxService
from sandfork.engine.snapshot_store import (
    ATTACHMENTS,
    SnapshotStore,
    new_snapshot_id,
)
from sandfork.engine.uploads import Uploads
from sandfork.protocol import INVENTORY_ATTACHMENT, new_fork_tree_id


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
        uploads: Uploads | None = None,
    ) -> None:
        self.sandboxes = sandboxes
        self.execution = execution
        self.store = store
        self.ledger = ledger
        self.backends = backends
        self.limits = limits
        self.uploads = uploads  # to the snapshot store, after each capture (None: none)
        self.tmp_dir = store.tmp_dir  # export and import files; what a killed engine left goes
        exchange.reset_tmp(self.tmp_dir)

    def visible(
        self, sandbox_id: str | None = None, metadata: dict[str, str] | None = None
    ) -> list[SnapshotRecord]:
        """Visible snapshots, newest first, optionally only those of one sandbox (killed
        ones included: their snapshots outlive them) and those whose metadata has each
        key of ``metadata`` with its value."""
        return self.store.visible(sandbox_id, metadata)

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
        gets the engine's ``inventory.json`` (:mod:`sandfork.engine.inventory`) and, with a
        snapshot store, is uploaded in the background (:mod:`sandfork.engine.uploads`).
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
                snap = await self.sandboxes.capture(
                    sandbox_id, name, hidden=hidden, metadata=metadata, attachments=attachments
                )
        if self.uploads is not None and not hidden:
            self.uploads.submit(snap)
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
                        metadata=metadata,
                        persistent=parent.persistent,
                        host_access=parent.host_access,
                        relations={"fork_parent_id": sandbox_id, "fork_tree_id": tree},
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
            self.sandboxes.save(child)
        if reseed_python:  # each child in its own sandbox: all at once
            reseeds = [self.execution.reseed_python(child.id) for child in made]
            done = await asyncio.gather(*reseeds, return_exceptions=True)
            failed = [r for r in done if isinstance(r, BaseException)]
            if failed:  # no child the caller never hears of is left running
                for child in made:
                    await self.sandboxes.kill(child.id)
                raise ApiError(f"the fork failed: reseeding a copy failed: {failed[0]}", 500)
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
        record = await self.sandboxes.create_from_snapshot(
            checkpoint["snapshot_id"],
            metadata={},
            persistent=False,
            relations={"resumed_from": sandbox_id},
        )
        self.ledger.copy(sandbox_id, record.id, checkpoint["seq"])
        return record, self.ledger.entries(record.id)

    async def export_snapshot(self, snapshot_id: str, out: Path) -> None:
        """Write a snapshot to one portable file (see :mod:`sandfork.engine.exchange`)."""
        snap = self.store.get(snapshot_id)
        backend = self._exchanging(snap.vm.get("backend", "vm"))
        chain = await self.store.written_chain(snap.memory)
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
            spec = backend.spec(built, manifest.memory_mb, manifest.cpu)
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
