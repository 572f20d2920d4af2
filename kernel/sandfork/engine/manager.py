"""The sandbox manager: creates, tracks, adopts and kills sandboxes, and runs work in them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandfork.backends.base import Backend, Instance
from sandfork.backends.channel import (
    DEFAULT_AGENT_TIMEOUT,
    AgentError,
    AgentUnavailable,
    default_wait,
)
from sandfork.crashpoints import crash_point
from sandfork.engine import exchange
from sandfork.engine.boot_captures import BootCaptures, Capture
from sandfork.engine.db import Database, SandboxRecord, SnapshotRecord
from sandfork.engine.errors import (
    ApiError,
    BadRequest,
    Conflict,
    NotFound,
    Timeout,
    TooLarge,
    Unresponsive,
)
from sandfork.engine.execution import CodeRunner
from sandfork.engine.leases import Leases
from sandfork.engine.ledger import Ledger, now
from sandfork.engine.limits import Limits
from sandfork.engine.snapshots import (
    ATTACHMENTS,
    SnapshotStore,
    new_snapshot_id,
    write_attachments,
)
from sandfork.templates import BuiltTemplate, TemplateError, ensure_template, load_spec

log = logging.getLogger(__name__)

_AGENT_ERROR_STATUS = {
    "BadRequest": 400,
    "IsADirectory": 400,
    "NotADirectory": 400,
    "PermissionDenied": 403,
    "NotFound": 404,
    "Exists": 409,
    "Timeout": 504,
    "TooLarge": 413,
}
UNRESPONSIVE = "unresponsive: "  # how a sandbox's ``error`` starts while its agent is silent


@contextlib.contextmanager
def _agent_failures(record: SandboxRecord) -> Iterator[None]:
    """Map the agent's errors to API errors: its own by type, a lost connection as a 409,
    no answer within the deadline as a 504 (and the sandbox's ``error`` says unresponsive
    until its agent answers again)."""
    try:
        yield
    except TimeoutError as e:
        record.error = f"{UNRESPONSIVE}{e}"
        raise Unresponsive(f"sandbox {record.id} is unresponsive: {e}") from e
    except AgentUnavailable as e:
        raise Conflict(f"sandbox {record.id} did not answer: {e}") from e
    except AgentError as e:
        _answered(record)
        raise ApiError(e.message, _AGENT_ERROR_STATUS.get(e.type, 500)) from e
    _answered(record)


def _answered(record: SandboxRecord) -> None:
    if record.error is not None and record.error.startswith(UNRESPONSIVE):
        record.error = None


@dataclass
class Live:
    """A running sandbox: its record, its backend instance and its code runner."""

    record: SandboxRecord
    instance: Instance
    runner: CodeRunner


# Run in a fork's code contexts when asked: forks start with identical RNG states.
_RESEED = """\
import os as _os, random as _random, sys as _sys
_random.seed(_os.urandom(32))
if "numpy" in _sys.modules:
    _sys.modules["numpy"].random.seed(int.from_bytes(_os.urandom(4), "little"))
del _os, _random, _sys
"""


async def _after_resume(instance: Instance) -> None:
    """A resumed guest still has the clock and entropy of its capture: refresh both."""
    await instance.agent.request("sys.set_time", {"epoch_ns": time.time_ns()})
    entropy = base64.b64encode(os.urandom(64)).decode()
    await instance.agent.request("sys.reseed", {"entropy": entropy})


def _stored_bytes(path: Path | None) -> int:
    """Bytes a file (or a directory's files) take on disk: holes are free."""
    if path is None or not path.exists():
        return 0
    files = [p for p in path.iterdir() if p.is_file()] if path.is_dir() else [path]
    return sum(p.stat().st_blocks * 512 for p in files)


_WATCH_TICK = 1.0  # seconds between two checks of the VMs and the leases


def new_sandbox_id() -> str:
    """A fresh, unguessable sandbox id."""
    return "sbx_" + secrets.token_hex(8)


class SandboxManager:
    """Owns every sandbox of one engine."""

    def __init__(
        self,
        db: Database,
        backend: Backend,
        home: Path,
        boot_captures: BootCaptures | None,
        scratch: Path,
        *,
        max_output: int,
        default_timeout: float,
        limits: Limits,
    ) -> None:
        self.db = db
        self.limits = limits
        self.backend = backend
        self.sandboxes_dir = home / "sandboxes"
        self.snapshots = SnapshotStore(db, home, scratch)
        self.tmp_dir = home / "tmp"  # export and import files; what a killed engine left goes
        exchange.reset_tmp(self.tmp_dir)
        self.ledger = Ledger(db)
        self.boot_captures = boot_captures
        self._locks: dict[str, asyncio.Lock] = {}
        self.max_output = max_output
        self.default_timeout = default_timeout
        self._records: dict[str, SandboxRecord] = {r.id: r for r in db.all()}
        self._live: dict[str, Live] = {}
        self._template_locks: dict[str, asyncio.Lock] = {}
        self._watch_task: asyncio.Task[None] | None = None
        self.leases = Leases(tick=_WATCH_TICK)

    # -- lifecycle of the manager -------------------------------------------------------

    async def start(self) -> None:
        """Adopt the sandboxes an earlier engine left running, then watch them.

        Nothing is collected before every adopted VM's real disk chain has been read from
        QEMU; VMs, RAM files and directories that no adopted sandbox owns (an engine killed
        while a sandbox was starting) are removed.
        """
        for record in list(self._records.values()):
            if record.status == "starting":
                # Its creator never got an answer: the half-started VM goes (sweep below).
                log.warning("dropping sandbox %s: the engine stopped while it started", record.id)
                self._records.pop(record.id)
                self.db.delete(record.id)
            elif record.status == "running" and record.pid is not None:
                await self._adopt(record, record.pid)
        swept = await asyncio.to_thread(self.backend.sweep, self.sandboxes_dir, set(self._live))
        for line in swept:
            log.warning("removed what an interrupted operation left: %s", line)
        self.snapshots.collect(self.list())
        await asyncio.to_thread(self.snapshots.drain)  # a clean slate before serving
        for record in self._records.values():  # a fresh, full period for every lease
            if record.lease_seconds is not None:
                self.leases.hold(record.id, record.lease_seconds)
        self._watch_task = asyncio.create_task(self._watch())

    async def _adopt(self, record: SandboxRecord, pid: int) -> None:
        try:
            instance = await self.backend.adopt(Path(record.dir), Path(record.disk), pid)
            chain = await instance.disk_chain()
        except Exception as e:
            self._mark_dead(record, f"its VM was gone when the engine restarted ({e})")
            await asyncio.to_thread(self.backend.release, Path(record.dir))
            return
        self.snapshots.adopt_chain(chain)
        if record.disk != str(chain[0]):
            log.warning("sandbox %s writes to %s, not %s: fixed", record.id, chain[0], record.disk)
            record.disk = str(chain[0])
            self.db.put(record)
        self._live[record.id] = Live(record, instance, CodeRunner(instance.agent))
        log.info("adopted sandbox %s (pid %s)", record.id, record.pid)

    async def stop(self) -> None:
        """Detach from every sandbox; the VMs keep running for the next engine."""
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        for live in self._live.values():
            await live.instance.agent.close()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_TICK)
            for live in list(self._live.values()):
                if not live.instance.is_alive():
                    self._mark_dead(live.record, live.instance.failure_reason() or "its VM exited")
                    self._live.pop(live.record.id, None)
                    await live.instance.destroy()
            for sandbox_id in self.leases.expired():
                log.warning("sandbox %s: its lease ran out; killing it", sandbox_id)
                try:
                    await self.kill(sandbox_id)
                except Exception:
                    log.exception("killing sandbox %s failed", sandbox_id)

    def _mark_dead(self, record: SandboxRecord, reason: str) -> None:
        log.warning("sandbox %s is dead: %s", record.id, reason)
        record.status = "dead"
        record.error = reason
        self.db.put(record)

    # -- sandboxes -----------------------------------------------------------------------

    async def template(self, name: str) -> BuiltTemplate:
        """The built template ``name``, building it first if needed."""
        try:
            spec = load_spec(name)
        except TemplateError as e:
            raise BadRequest(str(e)) from e
        lock = self._template_locks.setdefault(spec.name, asyncio.Lock())
        async with lock:
            return await asyncio.to_thread(ensure_template, spec, progress=False)

    async def create(
        self,
        template: str,
        *,
        memory_mb: int | None,
        cpus: int | None,
        metadata: dict[str, str],
        persistent: bool,
        host_access: bool = False,
    ) -> SandboxRecord:
        """Create a sandbox from a template; returns once its agent answers.

        The template's pre-booted snapshot (booted once, default kernel idle) is restored
        when it exists, so only the first sandbox of a template pays for a cold boot.
        Its network reaches only the egress proxy unless ``host_access``.
        """
        built = await self.template(template)
        memory_mb = memory_mb or built.spec.memory_mb
        cpus = cpus or built.spec.cpus
        spec = self.backend.spec(built, memory_mb, cpus)
        self._check_room(1, memory_mb, 0)
        if self.boot_captures is not None:
            return await self.boot_captures.start(
                built,
                spec,
                self._boot_and_capture,
                lambda capture: self._start(
                    built.name,
                    capture,
                    metadata=metadata,
                    persistent=persistent,
                    boot_mode="template",
                    host_access=host_access,
                ),
            )
        disk = self.snapshots.new_layer(built.rootfs)
        await asyncio.to_thread(self.backend.new_disk, built.rootfs, disk)
        return await self._start(
            built.name,
            Capture(None, spec, disk),
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
        with self.snapshots.in_use(snapshot_id) as snap:
            capture = Capture(self.snapshots.path(snap.id), snap.vm, Path(snap.disk))
            self._check_room(1, snap.vm["memory_mb"], _stored_bytes(capture.dir))
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
        disk = capture.disk if capture.dir is None else self.snapshots.new_layer(capture.disk)
        record = SandboxRecord(
            id=sandbox_id,
            template=template,
            status="starting",
            cpus=capture.spec["cpus"],
            memory_mb=capture.spec["memory_mb"],
            created_at=now(),
            backend=self.backend.name,
            accelerator=capture.spec["accelerator"],
            dir=str(directory),
            metadata=metadata,
            persistent=persistent,
            disk=str(disk),
            vm=capture.spec,
            boot_mode=boot_mode,
            host_access=host_access,
        )
        self._records[sandbox_id] = record
        self.db.put(record)
        self.snapshots.settle(disk)  # the record owns it now
        started = time.monotonic()

        def spawned(pid: int) -> None:
            record.pid = pid  # an engine killed from here on finds the VM to remove
            self.db.put(record)
            crash_point("start.spawned")

        try:
            if capture.dir is None:
                instance = await self.backend.create(
                    capture.spec, directory, disk, spawned, host_access=host_access
                )
            else:
                await asyncio.to_thread(self.backend.new_disk, capture.disk, disk)
                instance = await self.backend.restore(
                    capture.spec, capture.dir, directory, disk, spawned, host_access=host_access
                )
                await _after_resume(instance)
        except Exception as e:
            self._forget(sandbox_id)
            shutil.rmtree(directory, ignore_errors=True)
            raise ApiError(f"could not start the sandbox: {e}", 500) from e
        record.status = "running"
        record.pid = instance.pid
        record.boot_ms = int((time.monotonic() - started) * 1000)
        self.db.put(record)
        self._live[sandbox_id] = Live(record, instance, CodeRunner(instance.agent))
        return record

    async def _boot_and_capture(self, spec: dict[str, Any], disk: Path, dest: Path) -> None:
        """Cold-boot a VM on ``disk``, start its default kernel, and snapshot it into ``dest``."""
        # Named uniquely: its RAM file and sockets share the engine's RAM folder.
        instance = await self.backend.create(spec, dest / f"boot-{secrets.token_hex(6)}", disk)
        try:
            await instance.agent.request("ctx.create", {"isolated": False}, wait=300)
            await instance.snapshot(dest, dest / "scratch.qcow2")
        finally:
            await instance.destroy()
            (dest / "scratch.qcow2").unlink(missing_ok=True)

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
        the snapshot is listed: it appears with them or not at all.
        """
        live = self.live(sandbox_id)
        record = live.record
        if not hidden:
            self.limits.check_snapshot(
                sum(s.size_bytes for s in self.snapshots.visible()),
                live.instance.memory_bytes(),
            )
        async with self._sandbox_lock(sandbox_id):
            live = self.live(sandbox_id)  # it may have been killed while we waited
            contexts = await self.call(sandbox_id, "ctx.list")
            snapshot_id = new_snapshot_id()
            # A fork's capture is thrown away once the children run: keep it off the disk.
            staging = self.snapshots.staging(snapshot_id, in_memory=hidden)
            try:
                stored = write_attachments(staging, attachments or {})
            except ApiError:
                self.snapshots.abandon(snapshot_id, staging)
                raise
            frozen = Path(record.disk)
            new_disk = self.snapshots.new_layer(frozen)
            try:
                paused = await live.instance.snapshot(staging, new_disk)
            except Exception as e:
                self.snapshots.abandon(snapshot_id, staging)
                self.snapshots.settle(new_disk)
                raise ApiError(f"the snapshot failed: {e}", 500) from e
            crash_point("snapshot.frozen")
            record.disk = str(new_disk)
            self.db.put(record)
            self.snapshots.settle(new_disk)
            snap = SnapshotRecord(
                id=snapshot_id,
                name=name,
                created_at=now(),
                sandbox_id=sandbox_id,
                template=record.template,
                parent_id=record.from_snapshot,
                disk=str(frozen),
                vm=record.vm,
                size_bytes=_stored_bytes(staging) + _stored_bytes(frozen),
                paused_ms=int(paused * 1000),
                contexts=[c["id"] for c in contexts.get("contexts", [])],
                hidden=hidden,
                metadata=metadata or {},
                attachments=stored,
            )
            crash_point("snapshot.written")
            self.snapshots.publish(snap, staging)
        return snap

    async def fork(
        self, sandbox_id: str, count: int, *, metadata: dict[str, str], reseed_python: bool
    ) -> list[SandboxRecord]:
        """Clone a running sandbox ``count`` times from one capture; the parent runs on."""
        parent = self.get(sandbox_id)
        ram = self.live(sandbox_id).instance.memory_bytes()
        # The capture and the children's RAM all sit in the RAM folder while the fork runs.
        self._check_room(count, parent.memory_mb, ram + ram // count)
        snap = await self.snapshot(sandbox_id, hidden=True)
        crash_point("fork.captured")
        try:
            children = await asyncio.gather(
                *(
                    self.create_from_snapshot(
                        snap.id,
                        metadata={**metadata, "fork_parent_id": sandbox_id},
                        persistent=parent.persistent,
                        host_access=parent.host_access,
                    )
                    for _ in range(count)
                ),
                return_exceptions=True,
            )
        finally:
            self.snapshots.delete(snap.id, self.list())
        failures = [c for c in children if isinstance(c, BaseException)]
        made = [c for c in children if isinstance(c, SandboxRecord)]
        if failures:
            for child in made:
                await self.kill(child.id)
            raise ApiError(f"the fork failed: {failures[0]}", 500)
        for child in made:
            child.from_snapshot = None
            child.metadata["fork_parent_id"] = sandbox_id
            self.db.put(child)
            if reseed_python:
                await self.reseed_python(child.id)
        return made

    async def reseed_python(self, sandbox_id: str) -> None:
        """Reseed ``random`` (and NumPy's global generator) in every running context."""
        contexts = await self.call(sandbox_id, "ctx.list")
        for ctx in contexts.get("contexts", []):
            if ctx.get("status") == "running":
                await self.live(sandbox_id).runner.run(
                    ctx["id"], _RESEED, 60, self.max_output, silent=True
                )

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
        metadata = {"resumed_from": sandbox_id}
        record = await self.create_from_snapshot(
            checkpoint["snapshot_id"], metadata=metadata, persistent=False
        )
        self.ledger.copy(sandbox_id, record.id, checkpoint["seq"])
        return record, self.ledger.entries(record.id)

    async def ledgered(
        self, sandbox_id: str, kind: str, request: dict[str, Any], call: Awaitable[dict[str, Any]]
    ) -> dict[str, Any]:
        """Await ``call`` and append it, with its result, to the sandbox's ledger.

        A call that fails once it reached the sandbox (a timeout, an agent error) is recorded
        too, as ``{"failed": {"status", "error"}}``: a resume replays the failure, so the
        calls after it keep their numbers.
        """
        started_at, started = now(), time.monotonic()
        try:
            result = await call
        except ApiError as e:
            if not isinstance(e, NotFound):
                failure = {"failed": {"status": e.status, "error": e.message}}
                duration_ms = int((time.monotonic() - started) * 1000)
                self.ledger.append(sandbox_id, kind, request, failure, started_at, duration_ms)
            raise
        duration_ms = int((time.monotonic() - started) * 1000)
        result["seq"] = self.ledger.append(
            sandbox_id, kind, request, result, started_at, duration_ms
        )
        return result

    async def export_snapshot(self, snapshot_id: str, out: Path) -> None:
        """Write a snapshot to one portable file (see :mod:`sandfork.engine.exchange`)."""
        snap = self.snapshots.get(snapshot_id)
        await asyncio.to_thread(exchange.export_snapshot, snap, self.snapshots.path(snap.id), out)

    async def import_snapshot(self, file: Path, limits: exchange.ImportLimits) -> SnapshotRecord:
        """Add the snapshot in an exported file under a new id; its template is built here if
        needed. Nothing in the file is trusted (see :mod:`sandfork.engine.exchange`)."""
        snapshot_id = new_snapshot_id()
        staging = Path(tempfile.mkdtemp(prefix="import-", dir=self.tmp_dir))
        layers: list[Path] = []
        try:
            stored = sum(s.size_bytes for s in self.snapshots.visible())

            def admit(manifest: exchange.Manifest) -> None:  # before a member is written
                self.limits.check_snapshot(stored, manifest.total_bytes)

            manifest = await asyncio.to_thread(exchange.unpack, file, staging, limits, admit)
            built = await self.template(manifest.fields["template"])
            if (built.boot_key, built.rootfs.parent.name) != (
                manifest.boot_key,
                manifest.rootfs_key,
            ):
                raise Conflict(
                    f"this snapshot needs template {built.name!r} built from the same inputs "
                    f"(boot {manifest.boot_key}, image {manifest.rootfs_key}); "
                    f"here it is boot {built.boot_key}, image {built.rootfs.parent.name}"
                )
            await asyncio.to_thread(exchange.check_layers, staging, manifest.layers, built.rootfs)
            backing = built.rootfs
            for i in range(manifest.layers):
                layer = self.snapshots.new_layer(backing)
                layers.append(layer)
                (staging / f"layer{i}.qcow2").rename(layer)
                await asyncio.to_thread(exchange.rebase, layer, backing)
                backing = layer
            if manifest.fields["attachments"]:
                (staging / ATTACHMENTS).mkdir()
            for name in manifest.fields["attachments"]:
                (staging / (exchange.ATTACHMENT_PREFIX + name)).rename(staging / ATTACHMENTS / name)
            vm = self.backend.spec(built, manifest.memory_mb, manifest.cpus)
            vm["accelerator"] = manifest.accelerator  # the saved state needs the same one
            snap = manifest.record(snapshot_id, backing, vm)
            self.snapshots.publish(snap, staging)
            return snap
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            self.snapshots.settle(*layers)
            self.snapshots.collect(self.list())

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot; what other snapshots and sandboxes use stays."""
        self.snapshots.delete(snapshot_id, self.list())

    def _forget(self, sandbox_id: str) -> None:
        self.leases.drop(sandbox_id)
        self._records.pop(sandbox_id, None)
        self.db.delete(sandbox_id)
        self.snapshots.collect(self.list())

    def _sandbox_lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def get(self, sandbox_id: str) -> SandboxRecord:
        """The record of a sandbox, alive or dead."""
        record = self._records.get(sandbox_id)
        if record is None:
            raise NotFound(f"no sandbox {sandbox_id!r}")
        return record

    def list(self) -> list[SandboxRecord]:
        """Every sandbox the engine knows, dead ones included."""
        return list(self._records.values())

    def live(self, sandbox_id: str) -> Live:
        """A running sandbox, or a clear error saying why it cannot be used."""
        record = self.get(sandbox_id)
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
        if record.status != "running":
            raise Conflict(f"sandbox {sandbox_id} is not running: {record.error or record.status}")
        seconds = seconds or record.lease_seconds
        if seconds is None:
            raise BadRequest(f"sandbox {sandbox_id} has no lease: give lease_seconds")
        if seconds != record.lease_seconds:
            record.lease_seconds = seconds
            self.db.put(record)
        self.leases.hold(sandbox_id, seconds)
        return record

    async def kill(self, sandbox_id: str) -> None:
        """Stop a sandbox and delete everything it owns (after a snapshot in progress)."""
        record = self.get(sandbox_id)
        async with self._sandbox_lock(sandbox_id):
            live = self._live.pop(sandbox_id, None)
            if live is not None:
                await live.instance.destroy()
            else:
                await asyncio.to_thread(self.backend.release, Path(record.dir))
            crash_point("kill.destroyed")
            self._forget(sandbox_id)
        self._locks.pop(sandbox_id, None)

    def _check_room(self, count: int, memory_mb: int, ram_bytes: int) -> None:
        """Refuse new sandboxes that would go past the engine's limits (429)."""
        running = [r.memory_mb for r in self._records.values() if r.status != "dead"]
        self.limits.check_start(running, count, memory_mb, ram_bytes)

    # -- work inside a sandbox -------------------------------------------------------------
    # Every agent request has a deadline: ``agent_timeout`` (exec and run_code: their own
    # timeout plus it); reads and writes are bounded by ``max_file_bytes``. The engine sets
    # both from its configuration.

    agent_timeout: float = DEFAULT_AGENT_TIMEOUT
    max_file_bytes: int = 32 * 2**20

    async def call(
        self,
        sandbox_id: str,
        op: str,
        args: dict[str, Any] | None = None,
        *,
        wait: float | None = None,
    ) -> dict[str, Any]:
        """One agent request, with agent failures mapped to API errors.

        ``wait`` defaults to ``agent_timeout`` (plus the agent's own kernel start time for
        the operations that may start a kernel).
        """
        live = self.live(sandbox_id)
        if wait is None:
            wait = default_wait(op, self.agent_timeout)
        with _agent_failures(live.record):
            return await live.instance.agent.request(op, args, wait=wait)

    def _exec_args(
        self, cmd: str, timeout: float | None, env: dict[str, str], cwd: str | None
    ) -> dict[str, Any]:
        return {
            "cmd": cmd,
            "timeout": timeout or self.default_timeout,
            "env": env,
            "cwd": cwd,
            "max_output": self.max_output,
        }

    async def exec(
        self, sandbox_id: str, cmd: str, timeout: float | None, env: dict[str, str], cwd: str | None
    ) -> dict[str, Any]:
        """Run a shell command; raises :class:`Timeout` when it had to be killed."""
        args = self._exec_args(cmd, timeout, env, cwd)
        result = await self.call(
            sandbox_id, "exec", {**args, "stream": False}, wait=args["timeout"] + self.agent_timeout
        )
        if result.get("timed_out"):
            raise Timeout(
                f"timeout: the command ran past {args['timeout']:g} s and was killed",
            )
        return {k: result[k] for k in ("stdout", "stderr", "exit_code", "duration_ms", "truncated")}

    async def exec_stream(
        self, sandbox_id: str, cmd: str, timeout: float | None, env: dict[str, str], cwd: str | None
    ) -> AsyncIterator[dict[str, Any]]:
        """Run a shell command, yielding ``stdout``/``stderr`` events and then ``result``."""
        live = self.live(sandbox_id)
        args = self._exec_args(cmd, timeout, env, cwd)
        with _agent_failures(live.record):
            async for event in live.instance.agent.stream(
                "exec", {**args, "stream": True}, wait=args["timeout"] + self.agent_timeout
            ):
                yield event

    async def read_file(
        self, sandbox_id: str, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        """The bytes of a file in the sandbox (``length`` bytes from ``offset``, or all).

        A file over ``max_file_bytes`` without a ``length`` is a 413; so is anything but a
        regular file (a device, a pipe) without one.
        """
        args = {"path": path, "offset": offset, "length": length, "max_bytes": self.max_file_bytes}
        result = await self.call(sandbox_id, "fs.read", args)
        return base64.b64decode(result["data"])

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> dict[str, Any]:
        """Write a file in the sandbox (parent directories are created)."""
        if len(data) > self.max_file_bytes:
            raise TooLarge(f"the file is larger than the limit of {self.max_file_bytes} bytes")
        return await self.call(
            sandbox_id, "fs.write", {"path": path, "data": base64.b64encode(data).decode()}
        )

    async def create_context(self, sandbox_id: str, isolated: bool) -> dict[str, Any]:
        """The default code context, or a new isolated one."""
        return await self.call(sandbox_id, "ctx.create", {"isolated": isolated})

    async def run_code(
        self, sandbox_id: str, context: str, code: str, timeout: float | None
    ) -> dict[str, Any]:
        """Run code in a code context and return its outputs (within timeout + agent_timeout)."""
        live = self.live(sandbox_id)
        with _agent_failures(live.record):
            return await live.runner.run(
                context,
                code,
                timeout or self.default_timeout,
                self.max_output,
                margin=self.agent_timeout,
            )
