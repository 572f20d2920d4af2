"""Server push for the lineage panel: an event on Jupyter Server's event bus
(``urn:sandfork:lineage:v1``) whenever what the panel draws may have changed, which
JupyterLab receives over the bus's WebSocket (``/api/events/subscribe``) instead of polling.

Three sources: the engine's change feed (``GET /v1/changes``, long-polled: snapshots and
sandboxes changed by anyone, checkpoints and hibernation included); kernels of this server
that start or restart (Jupyter Server's own ``kernel_actions`` event; ours follows once the
kernel has attached to its sandbox); and the notebooks a restore or fork opens, once their
session joins the kernel to the notebook's path (which the panel shows, and which Jupyter
Server announces by no event: it comes after the kernel attached).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from sandfork.client import EngineClient
from sandfork.jupyter.kernels import wait_attached
from sandfork.protocol import SandforkError, routes

SCHEMA_ID = "urn:sandfork:lineage:v1"
KERNEL_ACTIONS = "https://events.jupyter.org/jupyter_server/kernel_actions/v1"
SCHEMA: dict[str, Any] = {
    "$id": SCHEMA_ID,
    "version": "1",
    "title": "Sandfork lineage changed",
    "description": "Snapshots, sandboxes or the kernels attached to them changed: reload them.",
    "type": "object",
    "required": ["reason"],
    "properties": {
        "reason": {
            "title": "Why",
            "description": "'engine': the engine's snapshots or sandboxes changed; "
            "'kernel': a kernel of this server attached to its sandbox; "
            "'session': a restored or branch notebook's session was made.",
            "enum": ["engine", "kernel", "session"],
        }
    },
}
_RETRY_S = 2.0  # after the engine could not be reached
_WAIT_S = 25.0  # one long poll


class LineageEvents:
    """Emits :data:`SCHEMA_ID` events on ``event_logger`` while started."""

    def __init__(self, event_logger: Any, engine: EngineClient, kernels: Any) -> None:
        self.event_logger = event_logger
        self.engine = engine
        self.kernels = kernels
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False
        event_logger.register_event_schema(SCHEMA)

    def start(self) -> None:
        """Follow the engine and the server's kernels (on the running event loop)."""
        self._spawn(self._follow_engine())
        self.event_logger.add_listener(schema_id=KERNEL_ACTIONS, listener=self._kernel_action)

    async def stop(self) -> None:
        """Stop following (even if a cancellation is lost on the way: the follower also
        looks at the flag, or a server's shutdown would wait on it for ever)."""
        self._stopped = True
        self.event_logger.remove_listener(schema_id=KERNEL_ACTIONS, listener=self._kernel_action)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def emit(self, reason: str) -> None:
        """Tell every subscriber to reload."""
        self.event_logger.emit(schema_id=SCHEMA_ID, data={"reason": reason})

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow_engine(self) -> None:
        cursor: str | None = None
        while not self._stopped:
            params = {"wait": str(_WAIT_S)} | ({"after": cursor} if cursor else {})
            try:
                answer = await self.engine.request(
                    "GET", routes.CHANGES, params=params, timeout=_WAIT_S + 10
                )
            except SandforkError as e:
                logging.getLogger(__name__).debug("the engine's change feed: %s", e)
                await asyncio.sleep(_RETRY_S)
                continue
            if cursor is not None and answer["cursor"] != cursor:
                self.emit("engine")
            cursor = answer["cursor"]

    async def _kernel_action(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        if data.get("action") in ("start", "restart") and data.get("kernel_id"):
            self._spawn(self._attached(str(data["kernel_id"])))
        elif data.get("action") == "shutdown":
            self.emit("kernel")

    async def _attached(self, kernel_id: str) -> None:
        with contextlib.suppress(Exception):  # not a Sandfork kernel, or it died: no event
            await wait_attached(self.kernels, kernel_id)
            self.emit("kernel")
