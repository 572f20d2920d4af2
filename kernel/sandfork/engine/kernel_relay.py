"""One client's Jupyter channels to one code context's kernel, relayed through the engine.

The client speaks Jupyter Server's JSON kernel-channel format: each frame is one message,
``{"channel", "header", "parent_header", "metadata", "content", "buffers"}`` with the buffers
as base64 strings. Frames from the client go to the context's kernel (``shell``, ``control``
or ``stdin``); every message the kernel sends (``iopub`` included) goes to every client of
the context. A kernel or sandbox that dies is reported as an iopub ``status`` message with
``execution_state: "dead"`` (the reason in its metadata), and the relay closes when the
sandbox is gone. The transport (a WebSocket) is the caller's: it hands frames in with
:meth:`KernelRelay.receive` and gets them out through ``deliver``.

A live stream, not stored, and not throttled; one kernel message costs the engine at most the
agent link's frame limit (:data:`sandfork.backends.agent_link.MAX_FRAME`, 64 MiB: a longer
one is dropped there unread) for its line and its parsed form, and one JSON copy per client
until the client's socket drains.
"""

from __future__ import annotations

import datetime
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from tornado.ioloop import PeriodicCallback

from sandfork.engine.errors import ApiError
from sandfork.engine.execution import ExecutionService

log = logging.getLogger(__name__)

CLIENT_CHANNELS = ("shell", "control", "stdin")
_LIVENESS_MS = 1000
NO_CONTEXT = 4004  # close code: the context does not exist
SANDBOX_GONE = 1011  # close code: the sandbox stopped answering or is not running


def status_message(state: str, session: str, reason: str = "") -> dict[str, Any]:
    """An iopub ``status`` frame of the channel protocol, not a reply to any request."""
    return {
        "channel": "iopub",
        "header": {
            "msg_id": uuid.uuid4().hex,
            "msg_type": "status",
            "username": "sandfork",
            "session": session,
            "date": datetime.datetime.now(datetime.UTC).isoformat(),
            "version": "5.3",
        },
        "parent_header": {},
        "metadata": {"reason": reason} if reason else {},
        "content": {"execution_state": state},
        "buffers": [],
    }


class KernelRelay:
    """Relays one client's messages to a context's kernel and the kernel's back to it."""

    def __init__(
        self,
        execution: ExecutionService,
        sandbox_id: str,
        context: str,
        deliver: Callable[[dict[str, Any]], None],
        close: Callable[[int, str], None],
    ) -> None:
        self.execution = execution
        self.sandbox_id = sandbox_id
        self.context = context
        self._deliver = deliver
        self._close = close
        self._session = uuid.uuid4().hex
        self._unsubscribe = execution.subscribe(sandbox_id, self._on_event)
        self._watch = PeriodicCallback(self._check_alive, _LIVENESS_MS)
        self._watch.start()

    async def receive(self, message: str | bytes) -> None:
        """A frame from the client: checked, then handed to the kernel."""
        try:
            frame = json.loads(message)
        except (ValueError, RecursionError):
            log.debug("dropping a channel frame that is not JSON")
            return
        if not isinstance(frame, dict) or frame.get("channel") not in CLIENT_CHANNELS:
            log.debug("dropping a channel frame without a client channel")
            return
        msg = {key: frame.get(key) or {} for key in ("header", "parent_header", "metadata")}
        msg["content"] = frame.get("content") or {}
        msg["buffers"] = frame.get("buffers") or []
        try:
            await self.execution.send_to_kernel(
                self.sandbox_id, self.context, frame["channel"], msg
            )
        except ApiError as e:
            self._report_dead(e.message)
            if e.status == 404:
                self._close(NO_CONTEXT, f"no code context {self.context!r} in this sandbox")
            elif e.status in (409, 504):
                self._close(SANDBOX_GONE, f"sandbox {self.sandbox_id} did not answer")

    def stop(self) -> None:
        """The client went: stop relaying."""
        self._unsubscribe()
        self._watch.stop()

    def _on_event(self, frame: dict[str, Any]) -> None:
        if frame.get("context") != self.context:
            return
        if frame.get("event") == "kernel":
            self._deliver({"channel": frame.get("channel"), **(frame.get("msg") or {})})
        elif frame.get("event") == "context_status" and frame.get("status") == "dead":
            self._report_dead(f"the kernel died: {frame.get('reason', 'unknown reason')}")

    def _report_dead(self, reason: str) -> None:
        self._deliver(status_message("dead", self._session, reason))

    def _check_alive(self) -> None:
        try:
            self.execution.sandboxes.live(self.sandbox_id)
        except ApiError as e:
            self._report_dead(e.message)
            self._close(SANDBOX_GONE, "the sandbox is not running")
