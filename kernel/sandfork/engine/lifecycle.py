"""Every status a sandbox goes through, and every transition between them, with its crash
points (:mod:`sandfork.crashpoints`).

``starting`` (:meth:`Lifecycle.start_sandbox`) → ``running`` (:meth:`Lifecycle.run_vm`) ⇄
``paused`` (:meth:`Lifecycle.pause`, :meth:`Lifecycle.unpause`); ``running`` → ``hibernated``
(:meth:`Lifecycle.hibernate`) → ``waking`` → ``running`` (:meth:`Lifecycle.wake`); any of them
→ ``dead`` (:meth:`Lifecycle.mark_dead`) or gone (:meth:`Lifecycle.kill`). An engine that
restarts adopts what the last one left (:meth:`Lifecycle.adopt_all`).

Pausing freezes every process of the sandbox where it is (a VM's CPUs stop; a container's
control group is frozen); its memory stays in RAM, so it goes on at once and exactly where it
was. A paused sandbox refuses work (409 naming the resume) rather than waking by itself,
keeps its lease, can be killed, and is neither snapshotted nor forked until resumed.

Hibernating captures the sandbox (:mod:`sandfork.engine.capture`) and stops its VM, freeing
its memory; its record stays, under the same id, and any later use wakes it from the capture
(:meth:`Lifecycle.working`), which is deleted once it runs again. A pause and a hibernation
both wait for the engine's operations in the sandbox to end (:mod:`sandfork.engine.activity`);
a hibernation also waits for its kernels to be idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

from sandfork.backends.base import Instance, StartPoint
from sandfork.crashpoints import crash_point
from sandfork.engine.backends import Backends
from sandfork.engine.capture import Capturer
from sandfork.engine.code_runner import CodeRunner
from sandfork.engine.db import Database, Relations, SandboxRecord, SnapshotRecord
from sandfork.engine.egress_tunnel import EgressTunnels
from sandfork.engine.errors import ApiError, Conflict
from sandfork.engine.ledger import now
from sandfork.engine.live import Live
from sandfork.engine.registry import SandboxRegistry
from sandfork.engine.snapshot_store import SnapshotStore
from sandfork.holdpoints import hold_point
from sandfork.protocol import BootMode, SandboxStatus, new_sandbox_id

log = logging.getLogger(__name__)

# How long a starting or adopted sandbox waits for its egress session before it is served
# anyway (its proxy refuses connections until the session is up).
_EGRESS_READY_S = 10.0


class Lifecycle(SandboxRegistry):
    """Moves the sandboxes of one engine from status to status."""

    def __init__(
        self,
        db: Database,
        backends: Backends,
        home: Path,
        store: SnapshotStore,
        capturer: Capturer,
        *,
        hibernate_wait: float,
        egress: EgressTunnels | None = None,
    ) -> None:
        super().__init__(db, home, store)
        self.backends = backends
        self.capturer = capturer
        self.hibernate_wait = hibernate_wait
        self.egress = egress

    # -- starting and running ---------------------------------------------------------------

    async def start_sandbox(
        self,
        template: str,
        start: StartPoint,
        *,
        metadata: dict[str, str],
        persistent: bool,
        boot_mode: BootMode = BootMode.COLD,
        host_access: bool = False,
        relations: Relations | None = None,
    ) -> SandboxRecord:
        """A new sandbox, ``starting``: boot ``start.spec`` or resume ``start``'s
        snapshot; ``running`` once its agent answers."""
        sandbox_id = new_sandbox_id()
        suffix = self.backends[start.spec.backend].images.suffix
        disk = start.disk if start.dir is None else self.store.new_layer(start.disk, suffix)
        spec = start.spec
        record = SandboxRecord(
            id=sandbox_id,
            template=template,
            status=SandboxStatus.STARTING,
            cpu=spec.cpu,
            memory_mb=spec.memory_mb,
            created_at=now(),
            backend=spec.backend,
            accelerator=spec.accelerator,
            dir=str(self.sandboxes_dir / sandbox_id),
            metadata=metadata,
            persistent=persistent,
            disk=str(disk),
            vm=spec.to_dict(),
            boot_mode=boot_mode,
            host_access=host_access,
            memory=str(start.memory[0]) if start.memory else "",
            **(relations or {}),
        )
        self._records[sandbox_id] = record
        self.db.put(record)
        self.store.settle(disk)  # the record owns it now
        try:
            await self.run_vm(record, start)
        except Exception as e:
            self._forget(sandbox_id)
            raise ApiError(f"could not start the sandbox: {e}", 500) from e
        return record

    async def run_vm(self, record: SandboxRecord, start: StartPoint) -> None:
        """Boot or resume ``start`` as the sandbox of ``record`` (on its disk): it is
        ``running`` after."""
        directory, disk = Path(record.dir), Path(record.disk)
        backend = self.backends.of(record)
        started = time.monotonic()

        def spawned(pid: int) -> None:
            record.pid = pid  # an engine killed from here on finds the VM to remove
            self.db.put(record)
            crash_point("start.spawned")

        try:
            if start.dir is None:
                instance = await backend.create(
                    start.spec, directory, disk, spawned, host_access=record.host_access
                )
            else:
                await asyncio.to_thread(backend.images.create_overlay, start.disk, disk)
                instance = await backend.restore(
                    start, directory, disk, spawned, host_access=record.host_access
                )
                await instance.resumed()
        except Exception:
            await asyncio.to_thread(backend.release, directory)
            raise
        record.status = SandboxStatus.RUNNING
        record.pid = instance.pid
        record.boot_ms = int((time.monotonic() - started) * 1000)
        self.db.put(record)
        await self._egress_ready(self._go_live(record, instance))

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

    # -- after a restart --------------------------------------------------------------------

    async def adopt_all(self) -> None:
        """Take over what an earlier engine left: a ``waking`` sandbox is ``hibernated``
        again (its capture is still there), a ``starting`` one is dropped (its creator never
        got an answer), a ``paused`` one goes on (adopting thaws it), a running one is adopted
        or marked ``dead``; hibernation captures of sandboxes not asleep go."""
        adopting = []
        for record in list(self._records.values()):
            if record.status is SandboxStatus.WAKING:
                record.status = SandboxStatus.HIBERNATED
                self.db.put(record)
            if record.status is SandboxStatus.STARTING:
                log.warning("dropping sandbox %s: the engine stopped while it started", record.id)
                self._records.pop(record.id)
                self.db.delete(record.id)
            elif record.status in (SandboxStatus.RUNNING, SandboxStatus.PAUSED):
                if record.pid is None:
                    continue
                if record.status is SandboxStatus.PAUSED:
                    record.status = SandboxStatus.RUNNING
                    self.db.put(record)
                adopting.append(self._adopt(record, record.pid))
        # At once: one sandbox whose agent is slow to answer holds up no other.
        await asyncio.gather(*adopting)
        await asyncio.gather(*(self._egress_ready(live) for live in self._live.values()))
        asleep = {r.id for r in self._records.values() if r.status is SandboxStatus.HIBERNATED}
        for snap in self._hibernation_captures():
            if snap.hibernation_of not in asleep:  # killed, woken, or left running by a crash
                self.store.delete(snap.id, self.all())

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

    async def detach_all(self) -> None:
        """Close the engine's links to every sandbox; they keep running for the next engine."""
        for live in self._live.values():
            await live.detach()

    # -- dead and gone ----------------------------------------------------------------------

    async def reap(self) -> None:
        """Mark ``dead`` the sandboxes whose processes ended."""
        for live in list(self._live.values()):
            if not live.instance.is_alive():
                reason = live.instance.failure_reason() or "its processes exited"
                self._live.pop(live.record.id, None)
                try:
                    await live.destroy()
                finally:  # once released: a sandbox reported dead holds nothing of the host
                    self.mark_dead(live.record, reason)

    def mark_dead(self, record: SandboxRecord, reason: str) -> None:
        """Record that a sandbox stopped for good, and why."""
        log.warning("sandbox %s is dead: %s", record.id, reason)
        record.status = SandboxStatus.DEAD
        record.error = reason
        self.db.put(record)

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
            for snap in self._hibernation_captures(sandbox_id):
                self.store.delete(snap.id, self.all())
        self._locks.pop(sandbox_id, None)

    # -- pausing ----------------------------------------------------------------------------

    async def pause(self, sandbox_id: str, wait: float) -> SandboxRecord:
        """Freeze a running sandbox (a paused one is left as it is); a 409 for one that is not
        running, or "busy" when operations in it do not end within ``wait`` seconds."""
        if self.get(sandbox_id).status is SandboxStatus.PAUSED:
            return self.get(sandbox_id)
        self.live(sandbox_id)  # a 409 for a dead or hibernated one
        async with (
            self.activity.quiet(sandbox_id, list, wait, what="pause"),
            self.lock(sandbox_id),
        ):
            record = self.get(sandbox_id)
            if record.status is not SandboxStatus.PAUSED:
                await self.live(sandbox_id).instance.freeze()
                crash_point("pause.frozen")
                record.status = SandboxStatus.PAUSED
                self.db.put(record)
            return record

    async def unpause(self, sandbox_id: str) -> SandboxRecord:
        """Let a paused sandbox go on (a running one is left as it is)."""
        async with self.lock(sandbox_id):
            record = self.get(sandbox_id)
            if record.status is SandboxStatus.PAUSED:
                await self.live(sandbox_id, paused=True).instance.thaw()
                record.status = SandboxStatus.RUNNING  # a crash before: the restart's adopt thaws
                self.db.put(record)
            return record

    # -- captures, hibernation and waking ---------------------------------------------------

    async def capture(
        self,
        sandbox_id: str,
        name: str | None = None,
        *,
        hidden: bool = False,
        metadata: dict[str, str] | None = None,
        attachments: dict[str, bytes] | None = None,
        hibernation: bool = False,
    ) -> SnapshotRecord:
        """Capture a running sandbox, its lock held (:meth:`Capturer.capture`)."""
        await hold_point("snapshot.capture")
        live = self.live(sandbox_id)  # it may have been killed while we waited
        return await self.capturer.capture(
            live,
            name,
            hidden=hidden,
            metadata=metadata,
            attachments=attachments,
            hibernation=hibernation,
        )

    async def hibernate(self, sandbox_id: str) -> SandboxRecord:
        """Capture a sandbox and stop its VM (its memory freed); any later use wakes it from
        the capture under the same id. Hibernating a hibernated sandbox does nothing.

        It waits, at most ``hibernate_wait`` seconds, until no operation runs in the sandbox
        and none of its kernels is busy, holding new operations back meanwhile (they run,
        waking the sandbox, once it is asleep); a 409 "busy" past the wait."""
        if not self.get(sandbox_id).status.is_hibernated:
            self.live(sandbox_id)  # a 409 for a dead one
        busy = functools.partial(self.busy_kernels, sandbox_id)
        async with (
            self.activity.quiet(sandbox_id, busy, self.hibernate_wait),
            self.lock(sandbox_id),
        ):
            record = self.get(sandbox_id)
            if record.status.is_hibernated:
                return record
            await self.capture(sandbox_id, hibernation=True)
            crash_point("hibernate.captured")
            record.status, record.pid = SandboxStatus.HIBERNATED, None
            self.db.put(record)  # first: a VM left running by a crash here is swept at start
            live = self._live.pop(sandbox_id, None)
            if live is not None:
                await live.destroy()
            return record

    async def wake(self, sandbox_id: str) -> SandboxRecord:
        """Resume a hibernated sandbox from its capture, under the same id (after a
        hibernation under way); a running one is left as it is."""
        await self.activity.held_back(sandbox_id)
        return await self._wake(sandbox_id)

    async def _wake(self, sandbox_id: str) -> SandboxRecord:
        """:meth:`wake` now; the capture is deleted once the sandbox runs again."""
        async with self.lock(sandbox_id):
            record = self.get(sandbox_id)
            if not record.status.is_hibernated:
                return record
            snap = self.hibernation_capture(sandbox_id)
            if snap is None:
                self.mark_dead(record, "its hibernation start is missing")
                raise Conflict(f"sandbox {sandbox_id} cannot wake: its start is missing")
            start = await self.store.start_point(snap)
            suffix = self.backends[start.spec.backend].images.suffix
            disk = self.store.new_layer(start.disk, suffix)  # later writes are dropped
            record.status, record.disk = SandboxStatus.WAKING, str(disk)
            self.db.put(record)
            self.store.settle(disk)
            try:
                await self.run_vm(record, start)
            except Exception as e:
                record.status = SandboxStatus.HIBERNATED
                self.db.put(record)
                raise ApiError(f"could not wake sandbox {sandbox_id}: {e}", 500) from e
            crash_point("wake.resumed")
            self.store.delete(snap.id, self.all())
        return record

    def hibernation_capture(self, sandbox_id: str) -> SnapshotRecord | None:
        """The capture a hibernated sandbox wakes from (the newest, if a crash left two)."""
        captures = self._hibernation_captures(sandbox_id)
        return max(captures, key=lambda s: s.created_at, default=None)

    def _hibernation_captures(self, sandbox_id: str | None = None) -> list[SnapshotRecord]:
        """The hibernation captures (of one sandbox, or of any); more than one of a sandbox
        only when a crash left them."""
        return [
            s
            for s in self.store.all()
            if s.hibernation_of is not None and sandbox_id in (None, s.hibernation_of)
        ]

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
        if self.get(sandbox_id).status.is_hibernated:
            await self._wake(sandbox_id)
        return self.live(sandbox_id)
