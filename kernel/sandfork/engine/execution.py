"""Work inside a sandbox: commands, files, code contexts, and the ledger that records them.

One job: every request that reaches a running sandbox's guest agent. Each has a deadline:
``agent_timeout`` (exec and run_code: their own timeout plus it); reads and writes are
bounded by ``max_file_bytes``; each runs as an operation of the sandbox, which a hibernation
waits for (:mod:`sandfork.engine.activity`); each reply is checked before use
(:mod:`sandfork.engine.replies`). Every exec and run_code (streamed or not) is appended to the
sandbox's ledger here, with its result or its failure, so a resume can replay it.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sandfork.engine import outputs, replies
from sandfork.engine.errors import ApiError, BadReply, NotFound, Timeout, TooLarge
from sandfork.engine.ledger import Ledger, now
from sandfork.engine.live import Check, Live, agent_failures
from sandfork.engine.sandboxes import SandboxService
from sandfork.protocol import DEFAULT_CONTEXT

_RESULT_FIELDS = ("stdout", "stderr", "exit_code", "duration_ms", "truncated")

# Run in a fork's code contexts when asked: forks start with identical RNG states.
_RESEED = """\
import os as _os, random as _random, sys as _sys
_random.seed(_os.urandom(32))
if "numpy" in _sys.modules:
    _sys.modules["numpy"].random.seed(int.from_bytes(_os.urandom(4), "little"))
del _os, _random, _sys
"""


@dataclass(frozen=True)
class ShellCommand:
    """A shell command to run in a sandbox, as the API takes it."""

    cmd: str
    timeout: float | None = None
    env: dict[str, str] | None = None
    cwd: str | None = None


class ExecutionService:
    """Runs commands and code, and moves files, inside running sandboxes."""

    def __init__(
        self,
        sandboxes: SandboxService,
        ledger: Ledger,
        *,
        max_output: int,
        default_timeout: float,
        agent_timeout: float,
        max_file_bytes: int,
    ) -> None:
        self.sandboxes = sandboxes
        self.ledger = ledger
        self.max_output = max_output
        self.default_timeout = default_timeout
        self.agent_timeout = agent_timeout
        self.max_file_bytes = max_file_bytes

    async def _call(
        self, sandbox_id: str, op: str, args: dict[str, Any] | None = None, check: Check = dict
    ) -> Any:
        """One agent request, an operation of the sandbox: its result checked by ``check``,
        agent failures mapped to API errors."""
        async with self.sandboxes.working(sandbox_id) as live:
            return await self._request(live, op, args, check)

    async def _request(self, live: Live, op: str, args: dict[str, Any] | None, check: Check) -> Any:
        """:meth:`_call` in a sandbox already at hand (within an operation)."""
        return await live.request(op, args, check, self.agent_timeout)

    async def _recorded(
        self, sandbox_id: str, kind: str, request: dict[str, Any], call: Awaitable[dict[str, Any]]
    ) -> dict[str, Any]:
        """Await ``call`` and append it, with its result, to the sandbox's ledger.

        A call that fails once it reached the sandbox (a timeout, an agent error) is recorded
        too, as ``{"failed": {"status", "error", "kind"}}``: a resume replays the failure, so the
        calls after it keep their numbers.
        """
        started_at, started = now(), time.monotonic()
        try:
            result = await call
        except ApiError as e:
            if not isinstance(e, NotFound):
                failure = {"failed": {"status": e.status, "error": e.message, "kind": e.kind}}
                duration_ms = int((time.monotonic() - started) * 1000)
                self.ledger.append(sandbox_id, kind, request, failure, started_at, duration_ms)
            raise
        duration_ms = int((time.monotonic() - started) * 1000)
        result["seq"] = self.ledger.append(
            sandbox_id, kind, request, result, started_at, duration_ms
        )
        return result

    def ledger_events(self, sandbox_id: str) -> list[dict[str, Any]]:
        """The sandbox's ledger: its calls and checkpoints, in order (kept after a kill:
        a killed sandbox can still be resumed)."""
        return self.ledger.events(sandbox_id)

    # -- commands ---------------------------------------------------------------------------

    def _exec_args(self, command: ShellCommand, stream: bool) -> dict[str, Any]:
        return {
            "cmd": command.cmd,
            "timeout": command.timeout or self.default_timeout,
            "env": command.env or {},
            "cwd": command.cwd,
            "max_output": self.max_output,
            "stream": stream,
        }

    async def exec(
        self, sandbox_id: str, command: ShellCommand, request: dict[str, Any]
    ) -> dict[str, Any]:
        """Run a shell command and record it (``request`` as the client sent it); raises
        :class:`Timeout` when it had to be killed."""
        return await self._recorded(sandbox_id, "exec", request, self._exec(sandbox_id, command))

    async def _exec(self, sandbox_id: str, command: ShellCommand) -> dict[str, Any]:
        args = self._exec_args(command, stream=False)
        async with self.sandboxes.working(sandbox_id) as live:
            with agent_failures(live.record):
                reply = await live.instance.agent.request(
                    "exec", args, wait=args["timeout"] + self.agent_timeout
                )
                result = replies.exec_result(reply, self.max_output)
        if result["timed_out"]:
            raise Timeout(f"timeout: the command ran past {args['timeout']:g} s and was killed")
        return {k: result[k] for k in _RESULT_FIELDS}

    async def exec_stream(
        self, sandbox_id: str, command: ShellCommand, request: dict[str, Any] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Run a shell command, yielding ``stdout``/``stderr`` events as they come and then
        ``result`` (the fields of :meth:`exec`'s answer). With ``request``, the call is
        recorded in the ledger like :meth:`exec` and its ``result`` carries its ``seq``."""
        args = self._exec_args(command, stream=True)
        events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        async def run(live: Live) -> dict[str, Any]:
            bounded = outputs.Rebounded(self.max_output)
            try:
                with agent_failures(live.record):
                    async for event in live.instance.agent.stream(
                        "exec", args, wait=args["timeout"] + self.agent_timeout
                    ):
                        if event["event"] == "result":
                            result = replies.exec_result(event, self.max_output)
                            if result["timed_out"]:
                                raise Timeout("timeout: the command was killed")
                            return {k: result[k] for k in _RESULT_FIELDS}
                        name, data = replies.stream_event(event)
                        if (kept := bounded.event(name, data)) is not None:
                            events.put_nowait({"event": name, "data": kept})
                raise BadReply("the command's output stream ended without a result")
            finally:
                events.put_nowait(None)

        async with self.sandboxes.working(sandbox_id) as live:
            call = run(live)
            if request is not None:
                call = self._recorded(sandbox_id, "exec", request, call)
            task = asyncio.ensure_future(call)
            try:
                while (event := await events.get()) is not None:
                    yield event
                yield {"event": "result", **(await task)}
            finally:
                task.cancel()

    # -- files ------------------------------------------------------------------------------

    async def read_file(
        self, sandbox_id: str, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        """The bytes of a file in the sandbox (``length`` bytes from ``offset``, or all).

        A file over ``max_file_bytes`` without a ``length`` is a 413; so is anything but a
        regular file (a device, a pipe) without one.
        """
        args = {"path": path, "offset": offset, "length": length, "max_bytes": self.max_file_bytes}
        most = self.max_file_bytes if length is None else min(length, self.max_file_bytes)
        data: bytes = await self._call(
            sandbox_id, "fs.read", args, lambda r: replies.file_data(r, most)
        )
        return data

    async def write_file(self, sandbox_id: str, path: str, data: bytes) -> dict[str, Any]:
        """Write a file in the sandbox (parent directories are created)."""
        if len(data) > self.max_file_bytes:
            raise TooLarge(f"the file is larger than the limit of {self.max_file_bytes} bytes")
        args = {"path": path, "data": base64.b64encode(data).decode()}
        written: dict[str, Any] = await self._call(
            sandbox_id, "fs.write", args, lambda r: replies.written(r, self.max_file_bytes)
        )
        return written

    async def list_dir(self, sandbox_id: str, path: str) -> dict[str, Any]:
        """The entries of a directory in the sandbox."""
        entries: dict[str, Any] = await self._call(
            sandbox_id, "fs.list", {"path": path}, replies.listing
        )
        return entries

    async def stat(self, sandbox_id: str, path: str) -> dict[str, Any]:
        """Name, size, mode, mtime and type of a path in the sandbox."""
        entry: dict[str, Any] = await self._call(
            sandbox_id, "fs.stat", {"path": path}, replies.stat
        )
        return entry

    async def delete_path(self, sandbox_id: str, path: str, recursive: bool) -> None:
        """Delete a file (or, ``recursive``, a directory tree) in the sandbox."""
        await self._call(sandbox_id, "fs.delete", {"path": path, "recursive": recursive})

    # -- code contexts ----------------------------------------------------------------------

    async def contexts(self, sandbox_id: str) -> dict[str, Any]:
        """The sandbox's code contexts: ``{"contexts": [{id, status, ...}]}``."""
        async with self.sandboxes.working(sandbox_id) as live:
            return await self.contexts_of(live)

    async def contexts_of(self, live: Live) -> dict[str, Any]:
        """:meth:`contexts` of a sandbox at hand, within an operation (or a capture) already."""
        found: dict[str, Any] = await self._request(live, "ctx.list", None, replies.contexts)
        return found

    async def create_context(self, sandbox_id: str, isolated: bool) -> dict[str, Any]:
        """The default code context, or a new isolated one."""
        made: dict[str, Any] = await self._call(
            sandbox_id, "ctx.create", {"isolated": isolated}, replies.context
        )
        return made

    async def close_context(self, sandbox_id: str, context: str) -> None:
        """Shut an isolated context down; the default context stays for the next turn."""
        if context != DEFAULT_CONTEXT:
            await self._call(sandbox_id, "ctx.shutdown", {"context": context})

    async def interrupt(self, sandbox_id: str, context: str) -> None:
        """Interrupt the code running in a context (SIGINT to its kernel)."""
        await self._call(sandbox_id, "ctx.interrupt", {"context": context})

    async def restart(self, sandbox_id: str, context: str) -> None:
        """Restart a context's kernel: the context keeps its id, its state is gone."""
        await self._call(sandbox_id, "ctx.restart", {"context": context})

    def subscribe(
        self, sandbox_id: str, listener: Callable[[dict[str, Any]], None]
    ) -> Callable[[], None]:
        """Have ``listener`` called with every event of the sandbox's agent (kernel messages,
        context status); returns the function that ends it."""
        return self.sandboxes.live(sandbox_id).instance.agent.add_listener(listener)

    async def send_to_kernel(
        self, sandbox_id: str, context: str, channel: str, msg: dict[str, Any]
    ) -> None:
        """Hand one Jupyter message (``shell``, ``control`` or ``stdin``) to a context's
        kernel; its replies come to the listeners of :meth:`subscribe`.

        Not an operation: the kernel channels are a live stream the engine cannot wait on
        (a hibernation waits for the kernel to be idle instead), and never wake a sandbox:
        a channel is closed when its sandbox stops."""
        args = {"context": context, "channel": channel, "msg": msg}
        await self._request(self.sandboxes.live(sandbox_id), "ctx.send", args, dict)

    async def run_code(
        self,
        sandbox_id: str,
        context: str,
        code: str,
        timeout: float | None,
        request: dict[str, Any],
    ) -> dict[str, Any]:
        """Run code in a code context and record it; its outputs (within timeout +
        ``agent_timeout``)."""
        return await self._recorded(
            sandbox_id, "run_code", request, self._run(sandbox_id, context, code, timeout)
        )

    async def _run(
        self, sandbox_id: str, context: str, code: str, timeout: float | None, silent: bool = False
    ) -> dict[str, Any]:
        async with self.sandboxes.working(sandbox_id) as live:
            with agent_failures(live.record):
                return await live.runner.run(
                    context,
                    code,
                    timeout or self.default_timeout,
                    self.max_output,
                    margin=self.agent_timeout,
                    silent=silent,
                )

    async def reseed_python(self, sandbox_id: str) -> None:
        """Reseed ``random`` (and NumPy's global generator) in every running context."""
        for ctx in (await self.contexts(sandbox_id)).get("contexts", []):
            if ctx.get("status") == "running":
                await self._run(sandbox_id, ctx["id"], _RESEED, 60, silent=True)
