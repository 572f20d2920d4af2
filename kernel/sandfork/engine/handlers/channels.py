"""``/v1/sandboxes/{id}/repl/sessions/{ctx}/channels``: a code context's Jupyter channels.

A WebSocket in Jupyter Server's JSON kernel-channel format: each frame is one message,
``{"channel", "header", "parent_header", "metadata", "content", "buffers"}`` with the buffers
as base64 strings. Frames from the client go to the context's kernel (``shell``, ``control``
or ``stdin``); every message the kernel sends (``iopub`` included) goes to every socket open
on the context. A kernel or sandbox that dies is reported as an iopub ``status`` message with
``execution_state: "dead"`` (the reason in its metadata); the socket closes when the sandbox
is gone.
"""

from __future__ import annotations

import datetime
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from jupyter_client.jsonutil import json_default
from tornado import websocket
from tornado.ioloop import PeriodicCallback

from sandfork.backends.channel import AgentError, AgentTimeout, AgentUnavailable, default_wait
from sandfork.engine.errors import ApiError
from sandfork.engine.handlers.base import API_KEY_REQUIRED, has_api_key
from sandfork.engine.manager import Live, SandboxManager

log = logging.getLogger(__name__)

CLIENT_CHANNELS = ("shell", "control", "stdin")
_LIVENESS_MS = 1000


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


class ChannelsHandler(websocket.WebSocketHandler):
    """One client's connection to the Jupyter channels of one code context."""

    _live: Live
    _sandbox_id: str
    _context: str
    _session: str
    _unsubscribe: Callable[[], None] | None = None
    _watch: PeriodicCallback | None = None

    @property
    def manager(self) -> SandboxManager:
        return self.settings["manager"]  # type: ignore[no-any-return]

    def prepare(self) -> None:
        """Refuse, before the upgrade, a request without the key or to a sandbox not running."""
        if not has_api_key(self.request, self.settings["api_key"]):
            self._refuse(401, API_KEY_REQUIRED)
            return
        try:
            self._live = self.manager.live(self.path_args[0])
        except ApiError as e:
            self._refuse(e.status, e.message)

    def _refuse(self, status: int, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))

    def check_origin(self, origin: str) -> bool:
        """Clients authenticate with the API key in a header, never a cookie: any origin."""
        return True

    def check_xsrf_cookie(self) -> None:
        """API clients authenticate with a header, not cookies: no XSRF token applies."""

    def open(self, sandbox_id: str, context: str) -> None:  # type: ignore[override]
        self._sandbox_id, self._context = sandbox_id, context
        self._session = uuid.uuid4().hex
        self._unsubscribe = self._live.instance.agent.add_listener(self._on_event)
        self._watch = PeriodicCallback(self._check_alive, _LIVENESS_MS)
        self._watch.start()

    async def on_message(self, message: str | bytes) -> None:
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
        args = {"context": self._context, "channel": frame["channel"], "msg": msg}
        try:
            wait = default_wait("ctx.send", self.manager.agent_timeout)
            await self._live.instance.agent.request("ctx.send", args, wait=wait)
        except AgentError as e:
            self._report_dead(f"{e.type}: {e.message}")
            if e.type == "NotFound":
                self.close(4004, f"no code context {self._context!r} in this sandbox")
        except (AgentUnavailable, AgentTimeout) as e:
            self._report_dead(str(e))
            self.close(1011, f"sandbox {self._sandbox_id} did not answer")

    def _on_event(self, frame: dict[str, Any]) -> None:
        if frame.get("context") != self._context:
            return
        if frame.get("event") == "kernel":
            self._write({"channel": frame.get("channel"), **(frame.get("msg") or {})})
        elif frame.get("event") == "context_status" and frame.get("status") == "dead":
            self._report_dead(f"the kernel died: {frame.get('reason', 'unknown reason')}")

    def _report_dead(self, reason: str) -> None:
        self._write(status_message("dead", self._session, reason))

    def _write(self, frame: dict[str, Any]) -> None:
        try:
            self.write_message(json.dumps(frame, default=json_default))
        except websocket.WebSocketClosedError:
            pass

    def _check_alive(self) -> None:
        try:
            self.manager.live(self._sandbox_id)
        except ApiError as e:
            self._report_dead(e.message)
            self.close(1011, "the sandbox is not running")

    def on_close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._watch is not None:
            self._watch.stop()
