"""``/v1/sandboxes/{id}/repl/sessions/{ctx}/channels``: a code context's Jupyter channels,
as a WebSocket carrying :mod:`sandfork.engine.kernel_relay`'s frames."""

from __future__ import annotations

import json
from typing import Any

from jupyter_client.jsonutil import json_default
from tornado import websocket

from sandfork.engine.errors import ApiError
from sandfork.engine.handlers.base import (
    API_KEY_REQUIRED,
    EngineAccess,
    error_answer,
    has_api_key,
)
from sandfork.engine.kernel_relay import KernelRelay


class ChannelsHandler(EngineAccess, websocket.WebSocketHandler):
    """One client's WebSocket to the Jupyter channels of one code context."""

    _relay: KernelRelay | None = None

    async def prepare(self) -> None:
        """Refuse, before the upgrade, a request without the key or to a sandbox not running."""
        if not has_api_key(self.request, self.settings["api_key"]):
            self._refuse(ApiError(API_KEY_REQUIRED, 401))
            return
        try:
            await self.sandboxes.awake(self.path_args[0])
        except ApiError as e:
            self._refuse(e)

    def _refuse(self, error: ApiError) -> None:
        self.set_status(error.status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(error_answer(error.message, error.kind)))

    def check_origin(self, origin: str) -> bool:
        """Clients authenticate with the API key in a header, never a cookie: any origin."""
        return True

    def check_xsrf_cookie(self) -> None:
        """API clients authenticate with a header, not cookies: no XSRF token applies."""

    def open(self, sandbox_id: str, context: str) -> None:  # type: ignore[override]
        self._relay = KernelRelay(self.execution, sandbox_id, context, self._write, self.close)

    async def on_message(self, message: str | bytes) -> None:
        if self._relay is not None:
            await self._relay.receive(message)

    def _write(self, frame: dict[str, Any]) -> None:
        try:
            self.write_message(json.dumps(frame, default=json_default))
        except websocket.WebSocketClosedError:
            pass

    def on_close(self) -> None:
        if self._relay is not None:
            self._relay.stop()
