"""``/v1/sandboxes/{id}/exec``: run shell commands, plain or streamed (server-sent events)."""

from __future__ import annotations

import json
from typing import Any

from tornado.iostream import StreamClosedError

from sandfork.engine.errors import ApiError, BadRequest
from sandfork.engine.execution import ShellCommand
from sandfork.engine.handlers.base import ApiHandler, error_answer
from sandfork.engine.handlers.validate import (
    MAX_PATH_CHARS,
    env_field,
    text_field,
    timeout_field,
)


def command_field(body: dict[str, Any]) -> ShellCommand:
    """The shell command of an exec request body."""
    cmd = text_field(body, "cmd", 2**20)
    if not cmd:
        raise BadRequest("field 'cmd' is required: the shell command to run")
    return ShellCommand(
        cmd=cmd,
        timeout=timeout_field(body, "timeout_seconds"),
        env=env_field(body),
        cwd=text_field(body, "cwd", MAX_PATH_CHARS),
    )


class ExecHandler(ApiHandler):
    """``POST``: run a command and answer with its output and exit code."""

    async def post(self, sandbox_id: str) -> None:
        body = self.json_body()
        self.write_json(await self.execution.exec(sandbox_id, command_field(body), body))


class ExecStreamHandler(ApiHandler):
    """``POST``: run a command, streaming ``stdout``/``stderr`` events, then ``exit``
    (server-sent events; a failure is an ``error`` event, ``{"error", "kind"}`` as a failure
    answer's body: a command killed at its timeout has kind ``timeout``)."""

    #: Recorded in the ledger like ``POST /exec`` (its ``exit`` then carries ``seq``,
    #: ``duration_ms`` and ``truncated``), so that a resume replays it like any other call.
    recorded = False

    async def post(self, sandbox_id: str) -> None:
        body = self.json_body()
        command = command_field(body)
        await self.sandboxes.awake(sandbox_id)  # a 404/409 before the stream starts
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        try:
            request = body if self.recorded else None
            async for event in self.execution.exec_stream(sandbox_id, command, request):
                await self._relay(event)
        except ApiError as e:
            await self._send("error", error_answer(e.message, e.kind))
        except StreamClosedError:
            return
        self.finish()

    async def _relay(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind in ("stdout", "stderr"):
            await self._send(kind, {"chunk": event["data"]})
        elif kind == "result":
            keys = ("exit_code", "seq", "duration_ms", "truncated") if self.recorded else ()
            await self._send(
                "exit", {"exit_code": event["exit_code"]} | {k: event[k] for k in keys}
            )

    async def _send(self, event: str, data: dict[str, Any]) -> None:
        self.write(f"event: {event}\ndata: {json.dumps(data)}\n\n")
        await self.flush()


class RecordedExecStreamHandler(ExecStreamHandler):
    """``POST``: ``/exec/stream``'s events, the call recorded in the ledger like ``/exec``."""

    recorded = True
