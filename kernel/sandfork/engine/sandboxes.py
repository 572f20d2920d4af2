"""Sandboxes: create, restore, watch and lease them; the rest of their life (start, pause,
hibernate, wake, kill, adopt after a restart) is :mod:`sandfork.engine.lifecycle`'s.

What runs inside a sandbox is :mod:`sandfork.engine.execution`; snapshots and forks are
:mod:`sandfork.engine.snapshots`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path

from sandfork.backends.base import StartPoint
from sandfork.engine.backends import Backends
from sandfork.engine.boot_captures import BootCaptures
from sandfork.engine.capture import Capturer
from sandfork.engine.db import Database, Relations, SandboxRecord
from sandfork.engine.egress_tunnel import EgressTunnels
from sandfork.engine.errors import ApiError, BadRequest, Conflict
from sandfork.engine.fetches import Fetches
from sandfork.engine.lifecycle import Lifecycle
from sandfork.engine.limits import Limits
from sandfork.engine.registry import WATCH_TICK
from sandfork.engine.snapshot_store import SnapshotStore
from sandfork.holdpoints import hold_point
from sandfork.protocol import BootMode, OnExpiry, SandboxStatus
from sandfork.templates import BuiltTemplate, TemplateError, ensure_template, load_spec
from sandfork.templates.spec import TemplateSpec

log = logging.getLogger(__name__)

# The statuses of a sandbox that holds a lease (a sleeper's holder keeps it too).
_LEASED = frozenset(SandboxStatus) - {SandboxStatus.STARTING, SandboxStatus.DEAD}


class SandboxService(Lifecycle):
    """Owns every sandbox of one engine: creates them, watches them and their leases (its
    :class:`~sandfork.engine.lifecycle.Lifecycle` moves each from status to status)."""

    def __init__(
        self,
        db: Database,
        backends: Backends,
        home: Path,
        store: SnapshotStore,
        capturer: Capturer,
        boot_captures: BootCaptures | None,
        limits: Limits,
        *,
        hibernate_wait: float,
        egress: EgressTunnels | None = None,
        fetches: Fetches | None = None,
    ) -> None:
        super().__init__(
            db, backends, home, store, capturer, hibernate_wait=hibernate_wait, egress=egress
        )
        self.boot_captures = boot_captures
        self.limits = limits
        self._template_locks: dict[str, asyncio.Lock] = {}
        self._watch_task: asyncio.Task[None] | None = None
        # Finds a template built, or builds it (in a thread); tests of the engine's own rules
        # on the fake backend give a template made of small files instead.
        self.build_template: Callable[[TemplateSpec], BuiltTemplate] = functools.partial(
            ensure_template, progress=False
        )
        # Fetches a snapshot this engine lacks from the snapshot store (None: there is none).
        self.fetches = fetches

    async def start(self) -> None:
        """Adopt the sandboxes an earlier engine left running, then watch them.

        Nothing is collected before every adopted VM's real disk chain has been read from
        QEMU; VMs, RAM files and directories that no adopted sandbox owns (an engine killed
        while a sandbox was starting) are removed.
        """
        await self.adopt_all()
        swept = await asyncio.to_thread(self.backends.sweep, self.sandboxes_dir, set(self._live))
        for line in swept:
            log.warning("removed what an interrupted operation left: %s", line)
        self.store.collect(self.all())
        self.store.remove_strays()
        await asyncio.to_thread(self.store.drain)  # a clean slate before serving
        for record in self._records.values():  # a fresh, full period for every lease
            if record.lease_seconds is not None:
                self.leases.hold(record.id, record.lease_seconds)
        self._watch_task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        """Detach from every sandbox; the VMs keep running for the next engine."""
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        await self.detach_all()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_TICK)
            await self.tick()

    async def tick(self) -> None:
        """One round of the watch loop: sandboxes whose processes ended are marked dead,
        those whose lease ran out are ended (:meth:`expired`)."""
        await self.reap()
        for sandbox_id in self.leases.expired():
            try:
                await self.expired(sandbox_id)
            except Exception:
                log.exception("ending sandbox %s (its lease ran out) failed", sandbox_id)

    async def expired(self, sandbox_id: str) -> None:
        """The sandbox's lease (or time to live) ran out: kill it, or, when its lifecycle says
        ``"on_expiry": "hibernate"``, hibernate it (its memory and disk kept, woken by its
        next use).

        A hibernation that fails leaves the sandbox running, its lease held again for its
        period (the next expiry tries again): the user asked for its state to be kept, so it
        is never killed instead.
        """
        record = self.get(sandbox_id)
        if record.on_expiry is not OnExpiry.HIBERNATE:
            log.warning("sandbox %s: its lease ran out; killing it", sandbox_id)
            await self.kill(sandbox_id)
            return
        log.warning("sandbox %s: its lease ran out; hibernating it", sandbox_id)
        try:
            await self.hibernate(sandbox_id)
        except ApiError as e:
            log.warning("sandbox %s: hibernating it failed (%s); it runs on", sandbox_id, e)
            if record.lease_seconds is not None:
                self.lease(sandbox_id, record.lease_seconds)

    async def template(self, name: str) -> BuiltTemplate:
        """The built template ``name``, building it first if needed."""
        try:
            spec = load_spec(name)
        except TemplateError as e:
            raise BadRequest(str(e)) from e
        lock = self._template_locks.setdefault(spec.name, asyncio.Lock())
        async with lock:
            return await asyncio.to_thread(self.build_template, spec)

    async def create(
        self,
        template: str,
        *,
        memory_mb: int | None,
        cpu: int | None,
        metadata: dict[str, str],
        persistent: bool,
        host_access: bool = False,
        backend: str | None = None,
    ) -> SandboxRecord:
        """Create a sandbox from a template; returns once its agent answers.

        ``backend`` (``vm``, ``container``; ``None``: the template's or the engine's choice)
        runs it. The template's boot capture (booted once, default kernel idle) is restored
        when it exists, so only the first sandbox of a template pays for a cold boot. Its
        network reaches only the egress proxy unless ``host_access``.
        """
        built = await self.template(template)
        chosen = self.backends.choose(backend or built.spec.backend, host_access=host_access)
        memory_mb = memory_mb or built.spec.memory_mb
        cpu = cpu or built.spec.cpu
        spec = await asyncio.to_thread(chosen.spec, built, memory_mb, cpu)
        self.check_room(1, memory_mb)
        if self.boot_captures is not None:
            return await self.boot_captures.start(
                built,
                spec,
                lambda capture: self.start_sandbox(
                    built.name,
                    capture,
                    metadata=metadata,
                    persistent=persistent,
                    boot_mode=BootMode.TEMPLATE,
                    host_access=host_access,
                ),
            )
        base = await asyncio.to_thread(chosen.base_disk, built)
        disk = self.store.new_layer(base, chosen.images.suffix)
        await asyncio.to_thread(chosen.images.create_overlay, base, disk)
        return await self.start_sandbox(
            built.name,
            StartPoint.boot(spec, disk),
            metadata=metadata,
            persistent=persistent,
            host_access=host_access,
        )

    async def create_from_snapshot(
        self,
        snapshot_id: str,
        *,
        metadata: dict[str, str],
        persistent: bool,
        host_access: bool = False,
        relations: Relations | None = None,
    ) -> SandboxRecord:
        """A new sandbox resuming a snapshot: its kernels, memory, files and packages
        (``relations``: to the sandboxes it comes from). A snapshot that is not here but in
        the snapshot store is fetched first."""
        if self.fetches is not None:
            await self.fetches.ensure(snapshot_id, self.template, self.all)
        served: contextlib.AbstractContextManager[dict[str, Path]] = (
            self.fetches.hand(snapshot_id) if self.fetches else contextlib.nullcontext({})
        )
        with self.store.in_use(snapshot_id) as snap, served as lazily:
            await hold_point("restore.in_use")
            start = dataclasses.replace(await self.store.start_point(snap), served=lazily)
            backend = self.backends.choose(start.spec.backend, host_access=host_access)
            self.check_room(1, start.spec.memory_mb)
            if not backend.shares_memory:
                self.limits.check_host_memory(snap.size_bytes, f"restoring {snap.id} would")
            record = await self.start_sandbox(
                snap.template,
                start,
                metadata=metadata,
                persistent=persistent,
                boot_mode=BootMode.SNAPSHOT,
                host_access=host_access,
                relations=relations,
            )
        record.from_snapshot = snap.id
        self.db.put(record)
        return record

    def lease(self, sandbox_id: str, seconds: float | None) -> SandboxRecord:
        """Start (with ``seconds``) or renew the sandbox's lease: unless renewed again within
        its period, the watch loop kills the sandbox (see :mod:`sandfork.engine.leases`)."""
        record = self.get(sandbox_id)
        if record.persistent:
            raise BadRequest(f"sandbox {sandbox_id} is persistent: it holds no lease")
        if record.status not in _LEASED:
            raise Conflict(f"sandbox {sandbox_id} is not running: {record.error or record.status}")
        seconds = seconds or record.lease_seconds
        if seconds is None:
            raise BadRequest(f"sandbox {sandbox_id} has no lease: give lease_seconds")
        if seconds != record.lease_seconds:
            record.lease_seconds = seconds
            self.db.put(record)
        self.leases.hold(sandbox_id, seconds)
        return record

    def end_lease(self, sandbox_id: str) -> SandboxRecord:
        """End the sandbox's lease (or time to live): nothing kills it for want of renewal."""
        record = self.get(sandbox_id)
        self.leases.drop(sandbox_id)
        if record.lease_seconds is not None:
            record.lease_seconds = None
            self.db.put(record)
        return record

    def set_persistent(self, sandbox_id: str, persistent: bool) -> SandboxRecord:
        """Make a sandbox persistent (it gives up its lease) or not (PandaStack's lifecycle)."""
        record = self.get(sandbox_id)
        if record.status is SandboxStatus.DEAD:
            raise Conflict(f"sandbox {sandbox_id} is not running: {record.error or 'dead'}")
        if persistent:
            self.end_lease(sandbox_id)
        if record.persistent != persistent:
            record.persistent = persistent
            self.db.put(record)
        return record

    def lease_remaining(self, sandbox_id: str) -> float | None:
        """Seconds until the sandbox's lease runs out (``None``: it holds none)."""
        return self.leases.remaining(sandbox_id)

    def check_room(self, count: int, memory_mb: int) -> None:
        """Refuse new sandboxes that would go past the engine's limits (429)."""
        dead = SandboxStatus.DEAD
        running = [r.memory_mb for r in self._records.values() if r.status is not dead]
        self.limits.check_start(running, count, memory_mb)

    def tracked(self) -> dict[str, int]:
        """Sizes of this service's tables (:mod:`sandfork.engine.stats`)."""
        return {
            "sandbox_records": len(self._records),
            "live_sandboxes": len(self._live),
            "sandbox_locks": len(self._locks),
            "template_locks": len(self._template_locks),
            "leases": len(self.leases),
        }
