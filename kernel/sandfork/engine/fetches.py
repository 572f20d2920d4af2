"""Restoring anywhere: a snapshot this engine lacks, fetched from the snapshot store.

When a restore names a snapshot that is not here but whose manifest is in the store, the
engine checks the manifest as hostile input (:mod:`sandfork.store.manifest`, then the meta and
layout: :mod:`sandfork.engine.stored`), fetches its template's build if this host lacks it
(:mod:`sandfork.engine.template_travel`), checks that it can restore it here (the same backend
and machine key, the same template image, within its limits), fetches every chunk (hashes
checked; chunks it has cached are read locally), writes the files under a temporary folder
and renames them into place: the layers into its layer folder, re-based onto its own
template image, the state folder as a snapshot's. Only then is the snapshot listed,
``durable``, exactly as one taken here.

The files its backend reads by page (:attr:`~sandfork.backends.base.Backend.fetched_lazily`:
a container's memory pages) are fetched lazily where a lazy server can mount
(:mod:`sandfork.engine.lazy_servers`): left as holes, listed, and served to the restore
while they fill, each read waiting only for its own chunks. A fill that fails drops the
snapshot; where no server mounts, the engine fills them itself before the restore.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from sandfork.backends.base import Backend
from sandfork.backends.vm.images import ImageError, Qcow2Images
from sandfork.engine.backends import Backends
from sandfork.engine.db import SandboxRecord, SnapshotRecord
from sandfork.engine.errors import ApiError, Conflict, NotFound
from sandfork.engine.lazy_servers import LazyServers
from sandfork.engine.limits import Limits
from sandfork.engine.snapshot_store import SnapshotStore
from sandfork.engine.stored import STATE, StoredMeta, base_key, check_layout, parse_meta
from sandfork.engine.template_travel import TemplateTravel
from sandfork.protocol import SnapshotStorage
from sandfork.store.chunks import ChunkStore
from sandfork.store.lazy_file import LazyFile
from sandfork.store.lazy_spec import Served
from sandfork.store.manifest import CHUNK_SIZE, Manifest, ManifestError
from sandfork.store.objects import StoreError
from sandfork.templates import BuiltTemplate
from sandfork.templates.errors import TemplateError

log = logging.getLogger(__name__)

Template = Callable[[str], Awaitable[BuiltTemplate]]


class Fetches:
    """Brings snapshots of the store that this engine lacks into its snapshot store."""

    def __init__(
        self,
        store: SnapshotStore,
        chunks: ChunkStore,
        backends: Backends,
        limits: Limits,
        templates: TemplateTravel,
        *,
        max_memory_mb: int,
        max_cpus: int,
        lazy: LazyServers | None = None,
    ) -> None:
        self.store = store
        self.lazy = lazy
        for unfinished in lazy.sweep() if lazy is not None else []:
            if store.has(unfinished):  # an earlier engine died while it filled
                store.forget(unfinished)
        self.chunks = chunks
        self.templates = templates
        self.backends = backends
        self.limits = limits
        self.max_memory_mb = max_memory_mb
        self.max_cpus = max_cpus
        self._fetching: dict[str, asyncio.Task[None]] = {}  # two restores fetch once
        self._filling: set[asyncio.Task[None]] = set()  # lazy fills, until they end

    async def ensure(
        self, snapshot_id: str, template: Template, sandboxes: Callable[[], list[SandboxRecord]]
    ) -> None:
        """Make ``snapshot_id`` a local snapshot, fetching it from the store if it is not
        here (its template found or built by ``template``; the layers no sandbox of
        ``sandboxes()`` uses are collected after); a 404 if it is neither here nor there."""
        if self.store.has(snapshot_id):
            return
        task = self._fetching.get(snapshot_id)
        if task is None:
            task = asyncio.create_task(self._fetch(snapshot_id, template, sandboxes))
            self._fetching[snapshot_id] = task
            task.add_done_callback(lambda _: self._fetching.pop(snapshot_id, None))
        await asyncio.shield(task)  # a client that goes away does not cut another's fetch

    async def _fetch(
        self, snapshot_id: str, template: Template, sandboxes: Callable[[], list[SandboxRecord]]
    ) -> None:
        budget = self.limits.free_bytes()
        try:
            manifest = await asyncio.to_thread(self.chunks.manifest, snapshot_id, budget)
        except StoreError as e:
            raise ApiError(
                f"snapshot {snapshot_id} is not here and the store failed: {e}", 502
            ) from e
        except ManifestError as e:
            raise ApiError(f"snapshot {snapshot_id} cannot be restored: {e}", 502) from e
        if manifest is None:
            raise NotFound(f"no snapshot {snapshot_id!r} (not here, nor in the snapshot store)")
        try:
            meta = parse_meta(manifest.meta, self.max_memory_mb, self.max_cpus)
            check_layout(manifest, meta)
        except ManifestError as e:
            raise ApiError(f"snapshot {snapshot_id} cannot be restored: {e}", 502) from e
        backend = self.backends[meta.backend]
        if meta.template_key is not None:  # its template's build travels with it
            try:
                await asyncio.to_thread(
                    self.templates.ensure, meta.fields["template"], meta.template_key, budget
                )
            except (StoreError, ManifestError, TemplateError) as e:
                raise ApiError(
                    f"snapshot {snapshot_id}'s template could not be fetched: {e}", 502
                ) from e
        built = await template(meta.fields["template"])
        base = backend.base_disk(built)
        if (meta.machine_key, meta.base) != (backend.machine_key(), base_key(base)):
            raise Conflict(
                f"snapshot {snapshot_id} was taken on another build of its {meta.backend} "
                f"backend or template (machine {meta.machine_key}, image {meta.base}); here "
                f"they are {backend.machine_key()} and {base_key(base)}"
            )
        self.limits.check_snapshot(
            sum(s.size_bytes for s in self.store.visible()), manifest.total_bytes
        )
        started = time.monotonic()
        folder = self.store.tmp_dir / f"fetch-{snapshot_id}"
        later = self._later(manifest, backend)
        try:
            await asyncio.to_thread(self.chunks.fetch, manifest, folder, later)
            if later and self.lazy is not None:
                self.lazy.mark(snapshot_id)
            self._register(snapshot_id, manifest, meta, backend, built, base, folder, sandboxes)
            if later:
                await self._fill(snapshot_id, manifest, later, sandboxes)
        except (ManifestError, ImageError, IsADirectoryError, NotADirectoryError) as e:
            raise ApiError(f"snapshot {snapshot_id} cannot be restored: {e}", 502) from e
        except StoreError as e:
            raise ApiError(f"fetching snapshot {snapshot_id} failed: {e}", 502) from e
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            if self.lazy is not None and not self.store.has(snapshot_id):
                self.lazy.unmark(snapshot_id)  # a fetch that failed before listing it
        log.info(
            "fetched snapshot %s from the store: %.1f MiB in %.1f s%s",
            snapshot_id, manifest.total_bytes / 2**20, time.monotonic() - started,
            " (its memory pages filling behind the restore)" if later else "",
        )  # fmt: skip

    def _later(self, manifest: Manifest, backend: Backend) -> frozenset[str]:
        """The files of ``manifest`` fetched lazily: those the backend reads by page, when
        a lazy server may serve them and they are more than a chunk."""
        if self.lazy is None:
            return frozenset()
        return frozenset(
            e.name
            for e in manifest.entries
            if e.kind == "file"
            and e.size > CHUNK_SIZE
            and any(fnmatch.fnmatch(e.name, f"{STATE}/{p}") for p in backend.fetched_lazily)
        )

    async def _fill(
        self,
        snapshot_id: str,
        manifest: Manifest,
        later: frozenset[str],
        sandboxes: Callable[[], list[SandboxRecord]],
    ) -> None:
        """Have the files ``later`` of the listed ``snapshot_id`` filled: by a lazy server
        if one mounts (the snapshot is dropped if its fill fails), else here and now."""
        assert self.lazy is not None
        folder = self.store.path(snapshot_id)
        names = [(e, e.name.removeprefix(f"{STATE}/")) for e in manifest.entries if e.name in later]
        files = [Served(name, str(folder / name), e) for e, name in names]
        filled = await self.lazy.serve(snapshot_id, files)
        if filled is None:
            try:
                await asyncio.to_thread(self._fill_here, files)
            except BaseException:
                self._drop(snapshot_id, sandboxes)
                raise
            self.lazy.unmark(snapshot_id)
            return

        async def settle(filled: asyncio.Future[bool]) -> None:
            assert self.lazy is not None
            if await filled:
                self.lazy.unmark(snapshot_id)
            else:
                self._drop(snapshot_id, sandboxes)

        task = asyncio.create_task(settle(filled))
        self._filling.add(task)
        task.add_done_callback(self._filling.discard)

    def _fill_here(self, files: list[Served]) -> None:
        for served in files:
            lazy = LazyFile.opened(served.path, served.entry, self.chunks.chunk)
            try:
                lazy.fill()
            finally:
                os.close(lazy.fd)

    def _drop(self, snapshot_id: str, sandboxes: Callable[[], list[SandboxRecord]]) -> None:
        if self.store.has(snapshot_id):
            self.store.forget(snapshot_id)
            self.store.collect(sandboxes())
        if self.lazy is not None:
            self.lazy.unmark(snapshot_id)

    @contextlib.contextmanager
    def hand(self, snapshot_id: str) -> Iterator[dict[str, Path]]:
        """The paths to read the files of ``snapshot_id`` still filling from, for a restore
        that starts inside this block (see :meth:`LazyServers.hand`)."""
        if self.lazy is None:
            yield {}
        else:
            with self.lazy.hand(snapshot_id) as served:
                yield served

    async def start(self) -> None:
        """Start what fetches use (a lazy server ahead of need)."""
        if self.lazy is not None:
            await self.lazy.start()

    async def stop(self) -> None:
        """Wait for the fills under way."""
        if self.lazy is not None:
            await self.lazy.stop()
        if self._filling:
            await asyncio.wait(self._filling)

    def _register(
        self,
        snapshot_id: str,
        manifest: Manifest,
        meta: StoredMeta,
        backend: Backend,
        built: BuiltTemplate,
        base: Path,
        folder: Path,
        sandboxes: Callable[[], list[SandboxRecord]],
    ) -> None:
        """Move the fetched files into place as layers and a snapshot, and list it."""
        made: list[Path] = []
        try:
            disk = base
            for i in range(meta.disk_layers):
                layer = self.store.new_layer(disk, backend.images.suffix)
                made.append(layer)
                if isinstance(backend.images, Qcow2Images):  # a qcow2 header names files
                    backend.images.check_layer(
                        folder / f"disk.{i}", backend.images.virtual_size(base)
                    )
                (folder / f"disk.{i}").rename(layer)
                backend.images.rebase(layer, disk)
                disk = layer
            memory: Path | None = None
            for i in range(meta.memory_layers):
                layer = self.store.new_layer(memory, backend.memory_suffix or "")
                made.append(layer)
                (folder / f"memory.{i}").rename(layer)
                memory = layer
            spec = backend.spec(built, meta.memory_mb, meta.cpu)
            record = SnapshotRecord(
                id=snapshot_id,
                disk=str(disk),
                memory=str(memory or ""),
                # The saved state needs the accelerator it was taken under.
                vm={**spec.to_dict(), "accelerator": meta.accelerator},
                size_bytes=manifest.total_bytes,
                storage=SnapshotStorage.DURABLE,
                **meta.fields,
            )
            staging = self.store.staging(snapshot_id, in_memory=False)
            staging.rmdir()
            (folder / STATE).rename(staging)
            self.store.publish(record, staging)
        finally:
            self.store.settle(*made)
            self.store.collect(sandboxes())
