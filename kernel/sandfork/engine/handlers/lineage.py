"""What the SDKs' ``explore``/``promote`` and recorded streaming need from the engine.

- ``POST /v1/sandboxes/{id}/promote``: a fork child takes over from its parent. The parent
  (unless ``kill_parent`` is false) and, with ``kill_siblings``, the parent's other fork
  children are killed; the child loses its ``fork_parent_id`` and gets ``promoted_from``.
- ``POST /v1/sandboxes/{id}/exec/stream/ledgered``: the streamed exec, recorded in the
  ledger like ``POST /exec`` (same request, same result; ``exit`` carries ``exit_code``,
  ``seq``, ``duration_ms`` and ``truncated``), so that a resume replays it like any other.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from tornado.iostream import StreamClosedError

from sandfork.engine.errors import ApiError, BadRequest, NotFound, Timeout
from sandfork.engine.handlers.base import ApiHandler
from sandfork.engine.handlers.exec import _exec_args
from sandfork.engine.handlers.validate import field

FORK_PARENT = "fork_parent_id"
PROMOTED_FROM = "promoted_from"
_RESULT_FIELDS = ("stdout", "stderr", "exit_code", "duration_ms", "truncated")


class PromoteHandler(ApiHandler):
    """``POST {"kill_parent"?: true, "kill_siblings"?: false}``: promote a fork child."""

    async def post(self, sandbox_id: str) -> None:
        body = self.json_body()
        kill_parent = field(body, "kill_parent", bool, True)
        kill_siblings = field(body, "kill_siblings", bool, False)
        child = self.manager.get(sandbox_id)
        parent_id = child.metadata.get(FORK_PARENT)
        if parent_id is None:
            raise BadRequest(f"sandbox {sandbox_id} is not a fork child: nothing to promote")
        self.manager.live(sandbox_id)  # promoting a dead child would leave nothing running
        doomed = [parent_id] if kill_parent else []
        if kill_siblings:
            doomed += [
                r.id
                for r in self.manager.list()
                if r.metadata.get(FORK_PARENT) == parent_id and r.id != sandbox_id
            ]
        killed = []
        for victim in doomed:
            try:
                await self.manager.kill(victim)
            except NotFound:
                continue  # already gone
            killed.append(victim)
        child.metadata = {
            **{k: v for k, v in child.metadata.items() if k != FORK_PARENT},
            PROMOTED_FROM: parent_id,
        }
        self.manager.db.put(child)
        self.write_json({"sandbox": child.to_api(), "killed": killed})


class LedgeredExecStreamHandler(ApiHandler):
    """``POST``: ``/exec/stream``'s events, the call recorded in the ledger like ``/exec``."""

    async def post(self, sandbox_id: str) -> None:
        body = self.json_body()
        args = _exec_args(body)
        self.manager.live(sandbox_id)  # a 404/409 before the stream starts
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        try:
            call = self._relay(self.manager.exec_stream(sandbox_id, **args))
            result = await self.manager.ledgered(sandbox_id, "exec", body, call)
            keys = ("exit_code", "seq", "duration_ms", "truncated")
            await self._send("exit", {k: result[k] for k in keys})
        except ApiError as e:
            await self._send("error", {"error": e.message})
        except StreamClosedError:
            return
        self.finish()

    async def _relay(self, events: AsyncIterator[dict[str, Any]]) -> dict[str, Any]:
        """Send the output events on; return the result as ``POST /exec`` answers it."""
        async for event in events:
            kind = event["event"]
            if kind in ("stdout", "stderr"):
                await self._send(kind, {"chunk": event["data"]})
            elif kind == "result":
                if event.get("timed_out"):
                    raise Timeout("timeout: the command was killed")
                return {k: event[k] for k in _RESULT_FIELDS}
        raise ApiError("the exec stream ended without a result", 502)

    async def _send(self, event: str, data: dict[str, Any]) -> None:
        self.write(f"event: {event}\ndata: {json.dumps(data)}\n\n")
        await self.flush()
