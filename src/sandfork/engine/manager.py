"""The sandbox manager: creates, tracks, adopts and kills sandboxes, and runs work in them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandfork.backends.base import Backend, Instance
from sandfork.backends.channel import AgentError, AgentUnavailable
from sandfork.engine.db import Database, SandboxRecord
from sandfork.engine.errors import ApiError, BadRequest, Conflict, NotFound, Timeout
from sandfork.engine.execution import CodeRunner
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
}


def _api_error(e: AgentError) -> ApiError:
    return ApiError(e.message, _AGENT_ERROR_STATUS.get(e.type, 500))


@dataclass
class Live:
    """A running sandbox: its record, its backend instance and its code runner."""

    record: SandboxRecord
    instance: Instance
    runner: CodeRunner


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_sandbox_id() -> str:
    """A fresh, unguessable sandbox id."""
    return "sbx_" + secrets.token_hex(8)


class SandboxManager:
    """Owns every sandbox of one engine."""

    def __init__(
        self,
        db: Database,
        backend: Backend,
        sandboxes_dir: Path,
        *,
        max_output: int,
        default_timeout: float,
    ) -> None:
        self.db = db
        self.backend = backend
        self.sandboxes_dir = sandboxes_dir
        self.max_output = max_output
        self.default_timeout = default_timeout
        self._records: dict[str, SandboxRecord] = {r.id: r for r in db.all()}
        self._live: dict[str, Live] = {}
        self._template_locks: dict[str, asyncio.Lock] = {}
        self._watch_task: asyncio.Task[None] | None = None

    # -- lifecycle of the manager -------------------------------------------------------

    async def start(self) -> None:
        """Adopt the sandboxes an earlier engine left running, then watch them."""
        for record in list(self._records.values()):
            if record.status != "running" or record.pid is None:
                if record.status == "starting":
                    self._mark_dead(record, "the engine stopped while the sandbox was starting")
                continue
            try:
                instance = await self.backend.adopt(Path(record.dir), record.pid)
            except Exception as e:
                self._mark_dead(record, f"its VM was gone when the engine restarted ({e})")
                continue
            self._live[record.id] = Live(record, instance, CodeRunner(instance.agent))
            log.info("adopted sandbox %s (pid %s)", record.id, record.pid)
        self._watch_task = asyncio.create_task(self._watch())

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
            await asyncio.sleep(1.0)
            for live in list(self._live.values()):
                if not live.instance.is_alive():
                    self._mark_dead(live.record, live.instance.failure_reason() or "its VM exited")
                    self._live.pop(live.record.id, None)

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
    ) -> SandboxRecord:
        """Create and boot a sandbox; returns once its agent answers."""
        built = await self.template(template)
        sandbox_id = new_sandbox_id()
        directory = self.sandboxes_dir / sandbox_id
        record = SandboxRecord(
            id=sandbox_id,
            template=built.name,
            status="starting",
            cpus=cpus or built.spec.cpus,
            memory_mb=memory_mb or built.spec.memory_mb,
            created_at=_now(),
            backend=self.backend.name,
            accelerator=self.backend.accelerator,
            dir=str(directory),
            metadata=metadata,
            persistent=persistent,
        )
        self._records[sandbox_id] = record
        self.db.put(record)
        started = asyncio.get_running_loop().time()
        try:
            instance = await self.backend.create(built, record.memory_mb, record.cpus, directory)
        except Exception as e:
            self._records.pop(sandbox_id, None)
            self.db.delete(sandbox_id)
            shutil.rmtree(directory, ignore_errors=True)
            raise ApiError(f"could not start the sandbox: {e}", 500) from e
        record.status = "running"
        record.pid = instance.pid
        record.boot_ms = int((asyncio.get_running_loop().time() - started) * 1000)
        self.db.put(record)
        self._live[sandbox_id] = Live(record, instance, CodeRunner(instance.agent))
        return record

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

    async def kill(self, sandbox_id: str) -> None:
        """Stop a sandbox and delete everything it owns."""
        record = self.get(sandbox_id)
        live = self._live.pop(sandbox_id, None)
        if live is not None:
            await live.instance.destroy()
        else:
            await asyncio.to_thread(shutil.rmtree, record.dir, True)
        self._records.pop(sandbox_id, None)
        self.db.delete(sandbox_id)

    async def kill_all(self) -> None:
        """Kill every sandbox (used by tests and ``sandfork sandbox kill --all``)."""
        for sandbox_id in list(self._records):
            await self.kill(sandbox_id)

    # -- work inside a sandbox -------------------------------------------------------------

    async def call(
        self,
        sandbox_id: str,
        op: str,
        args: dict[str, Any] | None = None,
        *,
        wait: float | None = None,
    ) -> dict[str, Any]:
        """One agent request, with agent failures mapped to API errors."""
        live = self.live(sandbox_id)
        try:
            return await live.instance.agent.request(op, args, wait=wait)
        except AgentError as e:
            raise _api_error(e) from e
        except (AgentUnavailable, TimeoutError) as e:
            raise Conflict(f"sandbox {sandbox_id} did not answer: {e}") from e

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
            sandbox_id, "exec", {**args, "stream": False}, wait=args["timeout"] + 30
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
        try:
            async for event in live.instance.agent.stream(
                "exec", {**args, "stream": True}, wait=args["timeout"] + 30
            ):
                yield event
        except AgentError as e:
            raise _api_error(e) from e
        except AgentUnavailable as e:
            raise Conflict(f"sandbox {sandbox_id} did not answer: {e}") from e

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        """The bytes of a file in the sandbox."""
        result = await self.call(sandbox_id, "fs.read", {"path": path})
        return base64.b64decode(result["data"])

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> dict[str, Any]:
        """Write a file in the sandbox (parent directories are created)."""
        return await self.call(
            sandbox_id, "fs.write", {"path": path, "data": base64.b64encode(data).decode()}
        )

    async def create_context(self, sandbox_id: str, isolated: bool) -> dict[str, Any]:
        """The default code context, or a new isolated one."""
        return await self.call(sandbox_id, "ctx.create", {"isolated": isolated})

    async def run_code(
        self, sandbox_id: str, context: str, code: str, timeout: float | None
    ) -> dict[str, Any]:
        """Run code in a code context and return its outputs."""
        live = self.live(sandbox_id)
        try:
            return await live.runner.run(
                context, code, timeout or self.default_timeout, self.max_output
            )
        except AgentError as e:
            raise _api_error(e) from e
        except AgentUnavailable as e:
            raise Conflict(f"sandbox {sandbox_id} did not answer: {e}") from e
