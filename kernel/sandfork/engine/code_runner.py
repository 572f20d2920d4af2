"""``run_code``: one execute request to a code context, its outputs gathered into a result.

The guest agent only relays Jupyter messages; this module builds the execute request and
turns the replies into the API's shape: ``results`` (one ``{type, data}`` per MIME type of
each ``execute_result``/``display_data``), ``stdout``, ``stderr`` and ``error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.session import Session

from sandfork.backends.agent_link import (
    DEFAULT_AGENT_TIMEOUT,
    AgentError,
    AgentLink,
    AgentTimeout,
)
from sandfork.engine.errors import NotFound, Timeout

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_INTERRUPT_GRACE = 10.0  # seconds an interrupted cell gets to wind down


def truncate(text: str, limit: int) -> str:
    """Cut ``text`` to ``limit`` bytes of UTF-8, ending with a marker saying how much went."""
    data = text.encode()
    if len(data) <= limit:
        return text
    kept = data[:limit].decode(errors="ignore")
    return f"{kept}\n[sandfork: output truncated, {len(data) - limit} bytes omitted]\n"


@dataclass
class _Run:
    context: str
    max_output: int
    started: float = field(default_factory=time.monotonic)
    results: list[dict[str, Any]] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    execution_count: int | None = None
    user_expressions: Any = None  # as the kernel sent them: untrusted
    replied: bool = False
    idle: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    died: str | None = None

    def add(self, channel: str, msg: dict[str, Any]) -> None:
        kind = msg.get("header", {}).get("msg_type")
        content = msg.get("content", {})
        if channel == "shell" and kind == "execute_reply":
            self.replied = True
            self.execution_count = content.get("execution_count")
            self.user_expressions = content.get("user_expressions")
            if content.get("status") == "aborted" and self.error is None:
                self.error = {
                    "name": "Aborted",
                    "value": "the kernel skipped this code because an earlier run failed",
                    "traceback": [],
                }
        elif kind == "status" and content.get("execution_state") == "idle":
            self.idle = True
        elif kind == "stream":
            (self.stdout if content.get("name") == "stdout" else self.stderr).append(
                content.get("text", "")
            )
        elif kind in ("execute_result", "display_data"):
            for mime, value in (content.get("data") or {}).items():
                data = value if isinstance(value, str) else json.dumps(value)
                self.results.append(
                    {"type": mime, "data": data, "is_main_result": kind == "execute_result"}
                )
        elif kind == "error":
            self.error = {
                "name": content.get("ename", ""),
                "value": content.get("evalue", ""),
                "traceback": [_ANSI.sub("", line) for line in content.get("traceback", [])],
            }
        elif kind == "clear_output":
            self.results.clear()
            self.stdout.clear()
            self.stderr.clear()
        if self.replied and self.idle:
            self.done.set()

    def kernel_died(self, reason: str) -> None:
        self.died = reason
        self.done.set()

    def to_api(self) -> dict[str, Any]:
        error = self.error
        if self.died is not None:
            error = {
                "name": "KernelDied",
                "value": f"the code context's kernel died: {self.died}; it restarts on next use",
                "traceback": [],
            }
        return {
            "results": self.results,
            "stdout": truncate("".join(self.stdout), self.max_output),
            "stderr": truncate("".join(self.stderr), self.max_output),
            "error": error,
            "exit_code": 1 if error else 0,
            "execution_count": self.execution_count,
            "duration_ms": int((time.monotonic() - self.started) * 1000),
        }


class CodeRunner:
    """Runs code in the code contexts of one sandbox."""

    def __init__(self, agent: AgentLink) -> None:
        self._agent = agent
        self._session = Session(username="sandfork")
        self._runs: dict[str, _Run] = {}
        agent.add_listener(self._on_event)

    def _on_event(self, frame: dict[str, Any]) -> None:
        if frame.get("event") == "kernel":
            msg = frame.get("msg") or {}
            run = self._runs.get((msg.get("parent_header") or {}).get("msg_id", ""))
            if run is not None:
                run.add(str(frame.get("channel")), msg)
        elif frame.get("event") == "context_status" and frame.get("status") == "dead":
            for run in self._runs.values():
                if run.context == frame.get("context"):
                    run.kernel_died(str(frame.get("reason", "unknown reason")))

    async def run(
        self,
        context: str,
        code: str,
        timeout: float,
        max_output: int,
        *,
        margin: float = DEFAULT_AGENT_TIMEOUT,
        silent: bool = False,
    ) -> dict[str, Any]:
        """Execute ``code`` in ``context`` and return the API result.

        Past ``timeout`` the code is interrupted (:class:`Timeout`). The whole call, the
        request to the agent and the interrupt included, ends within ``timeout + margin``:
        past that the agent is not answering (:class:`AgentTimeout`), e.g. a guest
        starved by a fork bomb. ``silent`` code leaves no trace in the kernel's history or
        execution count.
        """
        try:
            async with asyncio.timeout(timeout + margin):
                return await self._run(context, code, timeout, max_output, silent, margin)
        except TimeoutError as e:
            if isinstance(e, AgentTimeout):
                raise
            raise AgentTimeout("ctx.send", timeout + margin) from None

    async def evaluate(self, context: str, expressions: dict[str, str], wait: float) -> Any:
        """Evaluate ``expressions`` in ``context``'s kernel and return its reply's
        ``user_expressions`` (untrusted: whatever the kernel sent).

        The request is silent: the kernel's history and execution count do not change.
        Nothing is interrupted: a kernel still busy with a cell after ``wait`` seconds raises
        :class:`TimeoutError`, and the reply it sends later is dropped.
        """
        msg = self._execute_request("", silent=True, user_expressions=expressions)
        async with asyncio.timeout(wait), self._tracked(context, msg, 0) as run:
            await self._send(context, msg, wait)
            await run.done.wait()
        if run.died is not None:
            raise AgentError("KernelDied", f"the kernel died: {run.died}")
        return run.user_expressions

    async def _run(
        self, context: str, code: str, timeout: float, max_output: int, silent: bool, margin: float
    ) -> dict[str, Any]:
        wait = timeout + margin  # each request's own deadline; run() bounds them together
        msg = self._execute_request(code, silent=silent)
        async with self._tracked(context, msg, max_output) as run:
            await self._send(context, msg, wait)
            try:
                await asyncio.wait_for(run.done.wait(), timeout)
            except TimeoutError:
                await self._agent.request("ctx.interrupt", {"context": context}, wait=wait)
                # Let the interrupted cell finish, so the next run does not land in the
                # window where the kernel aborts requests queued behind an error.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(run.done.wait(), _INTERRUPT_GRACE)
                raise Timeout(
                    f"timeout: the code ran past {timeout:g} s and was interrupted"
                ) from None
            return run.to_api()

    def _execute_request(
        self, code: str, *, silent: bool, user_expressions: dict[str, str] | None = None
    ) -> dict[str, Any]:
        return self._session.msg(
            "execute_request",
            {
                "code": code,
                "silent": silent,
                "store_history": not silent,
                "user_expressions": user_expressions or {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
        )

    @contextlib.asynccontextmanager
    async def _tracked(
        self, context: str, msg: dict[str, Any], max_output: int
    ) -> AsyncIterator[_Run]:
        """The replies to ``msg`` gathered while in the block; later ones are dropped."""
        msg_id = msg["header"]["msg_id"]
        run = self._runs[msg_id] = _Run(context, max_output)
        try:
            yield run
        finally:
            del self._runs[msg_id]

    async def _send(self, context: str, msg: dict[str, Any], wait: float) -> None:
        try:
            await self._agent.request(
                "ctx.send", {"context": context, "channel": "shell", "msg": msg}, wait=wait
            )
        except AgentError as e:
            if e.type == "NotFound":
                raise NotFound(f"no code context {context!r} in this sandbox") from e
            raise
