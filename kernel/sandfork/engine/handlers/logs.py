"""``GET /v1/sandboxes/{id}/logs?stream=both&follow=false`` (PandaStack's ``logs``): the
sandbox's console (:mod:`sandfork.engine.console`) as text, or with ``follow=true`` its last
lines and then each new one as a server-sent event ``data: {"line": …}``, until the client
goes or the sandbox ends. A sandbox has one console: ``stream`` (``both``, ``stdout``,
``stderr``) is accepted for PandaStack's SDKs and names the same lines.
"""

from __future__ import annotations

import json

from tornado.iostream import StreamClosedError

from sandfork.engine import console
from sandfork.engine.errors import BadRequest
from sandfork.engine.handlers.base import ApiHandler

_STREAMS = ("both", "stdout", "stderr")


class LogsHandler(ApiHandler):
    """``GET``: the console's last lines (text), or with ``follow`` a stream of them."""

    async def get(self, sandbox_id: str) -> None:
        stream = self.get_query_argument("stream", "both")
        follow = self.get_query_argument("follow", "false")
        follow = {"1": "true", "0": "false"}.get(follow, follow)  # @pandastack/sdk sends 1/0
        if stream not in _STREAMS:
            raise BadRequest(f"stream must be one of {', '.join(_STREAMS)}, not {stream[:32]!r}")
        if follow not in ("true", "false"):
            raise BadRequest(f"follow must be true or false (or 1 or 0), not {follow[:32]!r}")
        instance = self.sandboxes.live(sandbox_id, paused=True).instance
        path = instance.console_path()
        lines, offset = console.tail(path)
        if follow == "false":
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish("".join(line + "\n" for line in lines))
            return
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        try:
            for line in lines:
                await self._send(line)
            async for line in console.follow(path, offset, instance.is_alive):
                await self._send(line)
        except StreamClosedError:
            return
        self.finish()

    async def _send(self, line: str) -> None:
        self.write(f"data: {json.dumps({'line': line})}\n\n")
        await self.flush()
