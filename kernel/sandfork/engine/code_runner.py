"""``run_code``: one execute request to a code context, its outputs gathered into a result.

The guest agent only relays Jupyter messages; this module builds the execute request and
turns the replies into the API's shape: ``results`` (one ``{type, data}`` per MIME type of
each ``execute_result``/``display_data``), ``stdout``, ``stderr`` and ``error``. The kernel
is the guest's, so its messages are untrusted: each kind of output is kept within the output
budget as it arrives (:mod:`sandfork.engine.outputs`), fields of the wrong type are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.session import Session

from sandfork.backends.agent_link import (
    DEFAULT_AGENT_TIMEOUT,
    AgentErrorReply,
    AgentLink,
    AgentTimeout,
)
from sandfork.engine import outputs
from sandfork.engine.errors import NotFound, Timeout

_INTERRUPT_GRACE = 10.0  # seconds an interrupted cell gets to wind down


@dataclass
class _Run:
    context: str
    max_output: int
    started: float = field(default_factory=time.monotonic)
    results: outputs.Results = field(init=False)
    stdout: outputs.Stream = field(init=False)
    stderr: outputs.Stream = field(init=False)
    error: dict[str, Any] | None = None
    execution_count: int | None = None
    user_expressions: Any = None  # as the kernel sent them: untrusted
    replied: bool = False
    idle: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    died: str | None = None

    def __post_init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.results = outputs.Results(self.max_output)
        self.stdout = outputs.Stream(self.max_output)
        self.stderr = outputs.Stream(self.max_output)

    def add(self, channel: str, msg: dict[str, Any]) -> None:
        """One message of the kernel's about this run (its parts are dicts: the link checks)."""
        kind = msg["header"].get("msg_type")
        content = msg["content"]
        if channel == "shell" and kind == "execute_reply":
            self.replied = True
            count = content.get("execution_count")
            self.execution_count = count if type(count) is int else None
            self.user_expressions = content.get("user_expressions")
            if content.get("status") == "aborted" and self.error is None:
                self.error = {
                    "name": "Aborted",
                    "value": "the kernel skipped this code because an earlier run failed",
                    "traceback": [],
                }
        elif kind == "status" and content.get("execution_state") == "idle":
            self.idle = True
        elif kind == "stream" and isinstance(text := content.get("text"), str):
            (self.stdout if content.get("name") == "stdout" else self.stderr).add(text)
        elif kind in ("execute_result", "display_data"):
            self.results.add(content.get("data"), kind == "execute_result")
        elif kind == "error":
            self.error = outputs.error(content, self.max_output)
        elif kind == "clear_output":
            self._clear()
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
            "results": self.results.to_api(),
            "stdout": self.stdout.text(),
            "stderr": self.stderr.text(),
            "error": error,
            "exit_code": 1 if error else 0,
            "execution_count": self.execution_count,
            "duration_ms": int((time.monotonic() - self.started) * 1000),
        }


class CodeRunner:
    """Runs code in the code contexts of one sandbox, and follows which of its kernels are
    busy (as their iopub ``status`` messages say, whoever asked them to run)."""

    def __init__(self, agent: AgentLink, on_change: Callable[[], None] | None = None) -> None:
        self._agent = agent
        self._session = Session(username="sandfork")
        self._runs: dict[str, _Run] = {}
        self._busy: set[str] = set()
        self._on_change = on_change  # called when a kernel turns busy or idle
        agent.add_listener(self._on_event)

    def busy(self) -> list[str]:
        """The contexts whose kernel is running something, sorted."""
        return sorted(self._busy)

    def _on_event(self, frame: dict[str, Any]) -> None:
        context = frame["context"]  # the link passes only events of the protocol's shape
        if frame["event"] == "kernel":
            msg = frame["msg"]
            if frame["channel"] == "iopub" and msg["header"].get("msg_type") == "status":
                self._kernel_state(context, msg["content"].get("execution_state") == "busy")
            msg_id = msg["parent_header"].get("msg_id")
            run = self._runs.get(msg_id) if isinstance(msg_id, str) else None
            if run is not None:
                run.add(frame["channel"], msg)
        else:  # context_status: dead or restarted, running nothing either way
            self._kernel_state(context, False)
            if frame["status"] == "dead":
                for run in self._runs.values():
                    if run.context == context:
                        run.kernel_died(frame["reason"] or "unknown reason")

    def _kernel_state(self, context: str, busy: bool) -> None:
        if busy == (context in self._busy):
            return
        if busy:
            self._busy.add(context)
        else:
            self._busy.discard(context)
        if self._on_change is not None:
            self._on_change()

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
            raise AgentErrorReply("KernelDied", f"the kernel died: {run.died}")
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
        except AgentErrorReply as e:
            if e.type == "NotFound":
                raise NotFound(f"no code context {context!r} in this sandbox") from e
            raise
