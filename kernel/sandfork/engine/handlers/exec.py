"""``/v1/sandboxes/{id}/exec``: run shell commands, plain or streamed (server-sent events)."""

from __future__ import annotations

import json
from typing import Any

from tornado.iostream import StreamClosedError

from sandfork.engine.errors import ApiError, BadRequest
from sandfork.engine.handlers.base import ApiHandler
from sandfork.engine.handlers.validate import (
    MAX_PATH_CHARS,
    env_field,
    text_field,
    timeout_field,
)


def _exec_args(body: dict[str, Any]) -> dict[str, Any]:
    cmd = text_field(body, "cmd", 2**20)
    if not cmd:
        raise BadRequest("field 'cmd' is required: the shell command to run")
    return {
        "cmd": cmd,
        "timeout": timeout_field(body, "timeout_seconds"),
        "env": env_field(body),
        "cwd": text_field(body, "cwd", MAX_PATH_CHARS),
    }


class ExecHandler(ApiHandler):
    """``POST``: run a command and answer with its output and exit code."""

    async def post(self, sandbox_id: str) -> None:
        body = self.json_body()
        call = self.manager.exec(sandbox_id, **_exec_args(body))
        self.write_json(await self.manager.ledgered(sandbox_id, "exec", body, call))


class ExecStreamHandler(ApiHandler):
    """``POST``: run a command, streaming ``stdout``/``stderr`` events, then ``exit``."""

    async def post(self, sandbox_id: str) -> None:
        args = _exec_args(self.json_body())
        self.manager.live(sandbox_id)  # a 404/409 before the stream starts
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        try:
            async for event in self.manager.exec_stream(sandbox_id, **args):
                kind = event["event"]
                if kind in ("stdout", "stderr"):
                    await self._send(kind, {"chunk": event["data"]})
                elif kind == "result":
                    if event.get("timed_out"):
                        await self._send("error", {"error": "timeout: the command was killed"})
                    else:
                        await self._send("exit", {"exit_code": event["exit_code"]})
        except ApiError as e:
            await self._send("error", {"error": e.message})
        except StreamClosedError:
            return
        self.finish()

    async def _send(self, event: str, data: dict[str, Any]) -> None:
        self.write(f"event: {event}\ndata: {json.dumps(data)}\n\n")
        await self.flush()
