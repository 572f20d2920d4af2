"""Sandboxes: create, restore, adopt after a restart, watch, lease and kill.

One job: the life of each sandbox's VM and of its record. What runs inside a sandbox is
:mod:`sandfork.engine.execution`; snapshots and forks are :mod:`sandfork.engine.snapshotting`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from sandfork.backends.base import Capture, Instance
from sandfork.crashpoints import crash_point
from sandfork.engine.activity import Activity
from sandfork.engine.backends import Backends
from sandfork.engine.boot_captures import BootCaptures
from sandfork.engine.code_runner import CodeRunner
from sandfork.engine.db import Database, SandboxRecord
from sandfork.engine.egress_tunnel import EgressTunnel, EgressTunnels
from sandfork.engine.errors import ApiError, BadRequest, Conflict, NotFound
from sandfork.engine.leases import Leases
from sandfork.engine.ledger import now
from sandfork.engine.limits import Limits
from sandfork.engine.snapshots import SnapshotStore
from sandfork.holdpoints import hold_point
from sandfork.protocol import new_sandbox_id
from sandfork.templates import BuiltTemplate, TemplateError, ensure_template, load_spec
from sandfork.templates.spec import TemplateSpec

log = logging.getLogger(__name__)

_WATCH_TICK = 1.0  # seconds between two checks of the VMs and the leases
# How long a starting or adopted sandbox waits for its egress session before it is served
# anyway (its proxy refuses connections until the session is up).
_EGRESS_READY_S = 10.0
HIBERNATED = ("hibernated", "waking")  # statuses of a sandbox whose VM is stopped, state kept
PAUSED = "paused"  # frozen in place, its memory kept (sandfork.engine.pausing)


@dataclass
class Live:
    """A running sandbox: its record, its backend instance, its code runner and the engine's
    end of its egress channel."""

    record: SandboxRecord
    instance: Instance
    runner: CodeRunner
    egress: EgressTunnel | None = None

    async def detach(self) -> None:
        """Close the engine's links to the sandbox (it keeps running)."""
        if self.egress is not None:
            await self.egress.close()
        await self.instance.agent.close()

    async def destroy(self) -> None:
        """Close the links and stop the sandbox."""
        if self.egress is not None:
            await self.egress.close()
        await self.instance.destroy()


class SandboxService:
    """Owns every sandbox of one engine: its record, its VM and its lease."""

    def __init__(
        self,
        db: Database,
        backends: Backends,
        home: Path,
        store: SnapshotStore,
        boot_captures: BootCaptures | None,
        limits: Limits,
        egress: EgressTunnels | None = None,
    ) -> None:
        self.db = db
        self.egress = egress
        self.backends = backends
        self.store = store
        self.boot_captures = boot_captures
        self.limits = limits
        self.sandboxes_dir = home / "sandboxes"
        self._records: dict[str, SandboxRecord] = {r.id: r for r in db.all()}
        self._live: dict[str, Live] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._template_locks: dict[str, asyncio.Lock] = {}
        self._watch_task: asyncio.Task[None] | None = None
        self.leases = Leases(tick=_WATCH_TICK)
        # Finds a template built, or builds it (in a thread); tests of the engine's own rules
        # on the fake backend give a template made of small files instead.
        self.build_template: Callable[[TemplateSpec], BuiltTemplate] = functools.partial(
            ensure_template, progress=False
        )
        self.activity = Activity()  # the operations running in each sandbox
        # Wakes a hibernated sandbox from its capture (SnapshotService.wake sets itself).
        self.waker: Callable[[str], Awaitable[object]] | None = None
        # What an expired lease does (sandfork.engine.expiry sets its policy).
        self.on_expired: Callable[[str], Awaitable[object]] = self.kill

    async def start(self) -> None:
        """Adopt the sandboxes an earlier engine left running, then watch them.

        Nothing is collected before every adopted VM's real disk chain has been read from
        QEMU; VMs, RAM files and directories that no adopted sandbox owns (an engine killed
        while a sandbox was starting) are removed.
        """
        for record in list(self._records.values()):
            if record.status == "waking":  # its capture is still there: wake it again later
                record.status = "hibernated"
                self.db.put(record)
            if record.status == "starting":
                # Its creator never got an answer: the half-started VM goes (sweep below).
                log.warning("dropping sandbox %s: the engine stopped while it started", record.id)
                self._records.pop(record.id)
                self.db.delete(record.id)
            elif record.status in ("running", PAUSED) and record.pid is not None:
                if record.status == PAUSED:  # adopting lets a paused sandbox go on
                    record.status = "running"
                    self.db.put(record)
                await self._adopt(record, record.pid)
        await asyncio.gather(*(self._egress_ready(live) for live in self._live.values()))
        swept = await asyncio.to_thread(self.backends.sweep, self.sandboxes_dir, set(self._live))
        for line in swept:
            log.warning("removed what an interrupted operation left: %s", line)
        hibernated = {r.id for r in self._records.values() if r.status == "hibernated"}
        self.store.drop_hibernations(keep=hibernated, sandboxes=self.all())
        self.store.collect(self.all())
        self.store.remove_strays()
        await asyncio.to_thread(self.store.drain)  # a clean slate before serving
        for record in self._records.values():  # a fresh, full period for every lease
            if record.lease_seconds is not None:
                self.leases.hold(record.id, record.lease_seconds)
        self._watch_task = asyncio.create_task(self._watch())

    async def _adopt(self, record: SandboxRecord, pid: int) -> None:
        backend = self.backends.of(record)
        try:
            instance = await backend.adopt(Path(record.dir), Path(record.disk), pid)
            chain = await instance.disk_chain()
        except Exception as e:
            self.mark_dead(record, f"it was gone when the engine restarted ({e})")
            await asyncio.to_thread(backend.release, Path(record.dir))
            return
        self.store.adopt_chain(chain)
        if record.disk != str(chain[0]):
            log.warning("sandbox %s writes to %s, not %s: fixed", record.id, chain[0], record.disk)
            record.disk = str(chain[0])
            self.db.put(record)
        self._go_live(record, instance)
        log.info("adopted sandbox %s (pid %s)", record.id, record.pid)

    def _go_live(self, record: SandboxRecord, instance: Instance) -> Live:
        egress = None if self.egress is None else self.egress.open(record.id, instance.open_egress)
        runner = CodeRunner(instance.agent, functools.partial(self.activity.changed, record.id))
        live = Live(record, instance, runner, egress)
        self._live[record.id] = live
        return live

    @staticmethod
    async def _egress_ready(live: Live) -> None:
        if live.egress is not None and not await live.egress.ready(_EGRESS_READY_S):
            log.warning("sandbox %s: no egress session yet; its proxy refuses", live.record.id)

    async def stop(self) -> None:
        """Detach from every sandbox; the VMs keep running for the next engine."""
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        for live in self._live.values():
            await live.detach()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_TICK)
            await self.tick()

    async def tick(self) -> None:
        """One round of the watch loop: sandboxes whose processes ended are marked dead,
        those whose lease ran out are killed."""
        for live in list(self._live.values()):
            if not live.instance.is_alive():
                reason = live.instance.failure_reason() or "its processes exited"
                self.mark_dead(live.record, reason)
                self._live.pop(live.record.id, None)
                await live.destroy()
        for sandbox_id in self.leases.expired():
            try:
                await self.on_expired(sandbox_id)
            except Exception:
                log.exception("ending sandbox %s (its lease ran out) failed", sandbox_id)

    def mark_dead(self, record: SandboxRecord, reason: str) -> None:
        """Record that a sandbox stopped for good, and why."""
        log.warning("sandbox %s is dead: %s", record.id, reason)
        record.status = "dead"
        record.error = reason
        self.db.put(record)

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
        cpus: int | None,
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
        cpus = cpus or built.spec.cpus
        spec = await asyncio.to_thread(chosen.spec, built, memory_mb, cpus)
        self.check_room(1, memory_mb)
        if self.boot_captures is not None:
            return await self.boot_captures.start(
                built,
                spec,
                lambda capture: self._start(
                    built.name,
                    capture,
                    metadata=metadata,
                    persistent=persistent,
                    boot_mode="template",
                    host_access=host_access,
                ),
            )
        base = await asyncio.to_thread(chosen.base_disk, built)
        disk = self.store.new_layer(base, chosen.images.suffix)
        await asyncio.to_thread(chosen.images.create_overlay, base, disk)
        return await self._start(
            built.name,
            Capture(None, spec, disk, []),
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
    ) -> SandboxRecord:
        """A new sandbox resuming a snapshot: its kernels, memory, files and packages."""
        with self.store.in_use(snapshot_id) as snap:
            await hold_point("restore.in_use")
            capture = self.store.capture(snap)
            backend = self.backends.choose(capture.spec.backend, host_access=host_access)
            self.check_room(1, capture.spec.memory_mb)
            if not backend.shares_memory:
                self.limits.check_host_memory(snap.size_bytes, f"restoring {snap.id} would")
            record = await self._start(
                snap.template,
                capture,
                metadata=metadata,
                persistent=persistent,
                boot_mode="snapshot",
                host_access=host_access,
            )
        record.from_snapshot = snap.id
        self.db.put(record)
        return record

    async def _start(
        self,
        template: str,
        capture: Capture,
        *,
        metadata: dict[str, str],
        persistent: bool,
        boot_mode: str = "cold",
        host_access: bool = False,
    ) -> SandboxRecord:
        """Start a sandbox: boot ``capture.spec`` or resume ``capture``'s snapshot."""
        sandbox_id = new_sandbox_id()
        directory = self.sandboxes_dir / sandbox_id
        suffix = self.backends[capture.spec.backend].images.suffix
        disk = capture.disk if capture.dir is None else self.store.new_layer(capture.disk, suffix)
        spec = capture.spec
        record = SandboxRecord(
            id=sandbox_id,
            template=template,
            status="starting",
            cpus=spec.cpus,
            memory_mb=spec.memory_mb,
            created_at=now(),
            backend=spec.backend,
            accelerator=spec.accelerator,
            dir=str(directory),
            metadata=metadata,
            persistent=persistent,
            disk=str(disk),
            vm=spec.to_dict(),
            boot_mode=boot_mode,
            host_access=host_access,
            memory=str(capture.memory[0]) if capture.memory else "",
        )
        self._records[sandbox_id] = record
        self.db.put(record)
        self.store.settle(disk)  # the record owns it now
        try:
            await self.run_vm(record, capture)
        except Exception as e:
            self._forget(sandbox_id)
            raise ApiError(f"could not start the sandbox: {e}", 500) from e
        return record

    async def run_vm(self, record: SandboxRecord, capture: Capture) -> None:
        """Boot or resume ``capture`` as the sandbox of ``record`` (on its disk); it runs
        after."""
        directory, disk = Path(record.dir), Path(record.disk)
        backend = self.backends.of(record)
        started = time.monotonic()

        def spawned(pid: int) -> None:
            record.pid = pid  # an engine killed from here on finds the VM to remove
            self.db.put(record)
            crash_point("start.spawned")

        try:
            if capture.dir is None:
                instance = await backend.create(
                    capture.spec, directory, disk, spawned, host_access=record.host_access
                )
            else:
                await asyncio.to_thread(backend.images.create_overlay, capture.disk, disk)
                instance = await backend.restore(
                    capture, directory, disk, spawned, host_access=record.host_access
                )
                await instance.resumed()
        except Exception:
            await asyncio.to_thread(backend.release, directory)
            raise
        record.status = "running"
        record.pid = instance.pid
        record.boot_ms = int((time.monotonic() - started) * 1000)
        self.db.put(record)
        await self._egress_ready(self._go_live(record, instance))

    async def hibernated(self, sandbox_id: str) -> SandboxRecord:
        """Stop the VM of a sandbox whose capture was just taken for hibernation; its record
        stays, ``hibernated``, until it wakes. Call with the sandbox's lock held."""
        record = self.get(sandbox_id)
        record.status, record.pid = "hibernated", None
        self.db.put(record)  # first: a VM left running by a crash here is swept at start
        live = self._live.pop(sandbox_id, None)
        if live is not None:
            await live.destroy()
        return record

    async def awake(self, sandbox_id: str) -> Live:
        """A running sandbox, woken first if it is hibernated (as any use of it does), after
        a hibernation under way."""
        await self.activity.held_back(sandbox_id)
        return await self._awake(sandbox_id)

    @contextlib.asynccontextmanager
    async def working(self, sandbox_id: str) -> AsyncIterator[Live]:
        """The block is an operation in the sandbox (:mod:`sandfork.engine.activity`), which
        :meth:`awake` gives: a hibernation waits for it, and it waits for a hibernation."""
        async with self.activity.operation(sandbox_id):
            yield await self._awake(sandbox_id)

    async def _awake(self, sandbox_id: str) -> Live:
        if self.get(sandbox_id).status in HIBERNATED and self.waker is not None:
            await self.waker(sandbox_id)
        return self.live(sandbox_id)

    def busy_kernels(self, sandbox_id: str) -> list[str]:
        """The code contexts of a running sandbox whose kernel is running code."""
        live = self._live.get(sandbox_id)
        return live.runner.busy() if live is not None else []

    def _forget(self, sandbox_id: str) -> None:
        self.leases.drop(sandbox_id)
        self._records.pop(sandbox_id, None)
        self.db.delete(sandbox_id)
        self.store.collect(self.all())

    def save(self, record: SandboxRecord) -> None:
        """Store a change to a sandbox's record (its disk after a capture, its metadata)."""
        self.db.put(record)

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """Held while the sandbox is captured or killed: the two never overlap."""
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def get(self, sandbox_id: str) -> SandboxRecord:
        """The record of a sandbox, alive or dead."""
        record = self._records.get(sandbox_id)
        if record is None:
            raise NotFound(f"no sandbox {sandbox_id!r}")
        return record

    def all(self) -> list[SandboxRecord]:
        """Every sandbox the engine knows, dead ones included."""
        return list(self._records.values())

    def live(self, sandbox_id: str, paused: bool = False) -> Live:
        """A running sandbox (or, with ``paused``, a paused one too), or a clear error saying
        why it cannot be used."""
        record = self.get(sandbox_id)
        if record.status == PAUSED and not paused:
            raise Conflict(
                f"sandbox {sandbox_id} is paused: resume it first (POST /v1/sandboxes/"
                f"{sandbox_id}/resume)"
            )
        live = self._live.get(sandbox_id)
        if live is None or not live.instance.is_alive():
            reason = (
                record.error or (live.instance.failure_reason() if live else "") or record.status
            )
            raise Conflict(f"sandbox {sandbox_id} is not running: {reason}")
        return live

    def lease(self, sandbox_id: str, seconds: float | None) -> SandboxRecord:
        """Start (with ``seconds``) or renew the sandbox's lease: unless renewed again within
        its period, the watch loop kills the sandbox (see :mod:`sandfork.engine.leases`)."""
        record = self.get(sandbox_id)
        if record.persistent:
            raise BadRequest(f"sandbox {sandbox_id} is persistent: it holds no lease")
        if record.status not in ("running", PAUSED, *HIBERNATED):  # a sleeper's holder keeps it
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
        if record.status == "dead":
            raise Conflict(f"sandbox {sandbox_id} is not running: {record.error or 'dead'}")
        if persistent:
            self.end_lease(sandbox_id)
        if record.persistent != persistent:
            record.persistent = persistent
            self.db.put(record)
        return record

    async def kill(self, sandbox_id: str) -> None:
        """Stop a sandbox and delete everything it owns (after a snapshot in progress)."""
        record = self.get(sandbox_id)
        async with self.lock(sandbox_id):
            live = self._live.pop(sandbox_id, None)
            if live is not None:
                await live.destroy()
            else:
                await asyncio.to_thread(self.backends.of(record).release, Path(record.dir))
            crash_point("kill.destroyed")
            self._forget(sandbox_id)
            self.store.drop_hibernations(keep=set(), sandboxes=self.all(), of=sandbox_id)
        self._locks.pop(sandbox_id, None)

    def lease_remaining(self, sandbox_id: str) -> float | None:
        """Seconds until the sandbox's lease runs out (``None``: it holds none)."""
        return self.leases.remaining(sandbox_id)

    def check_room(self, count: int, memory_mb: int) -> None:
        """Refuse new sandboxes that would go past the engine's limits (429)."""
        running = [r.memory_mb for r in self._records.values() if r.status != "dead"]
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
