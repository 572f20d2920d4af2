"""The kernel's connection to one code context of a sandbox: the engine's WebSocket channels
(Jupyter messages both ways) plus its REST interrupt and restart."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

from jupyter_client.jsonutil import json_default
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from sandfork.sdk import Client

FrameHandler = Callable[[dict[str, Any]], None]
"""Called with each frame of the channels: ``{"channel", "header", ..., "buffers"}``."""


def encode_buffers(buffers: list[Any]) -> list[str]:
    """Binary message buffers as the base64 strings the channels carry."""
    return [base64.b64encode(bytes(b)).decode() for b in buffers]


def decode_buffers(buffers: list[str]) -> list[bytes]:
    """The channels' base64 buffers as bytes."""
    return [base64.b64decode(b) for b in buffers]


class SandboxLink:
    """The channels of ``context`` in ``sandbox_id``; frames go to ``on_frame``."""

    def __init__(
        self, client: Client, sandbox_id: str, context: str, on_frame: FrameHandler
    ) -> None:
        self.client = client
        self.sandbox_id = sandbox_id
        self.context = context
        self._on_frame = on_frame
        self._ws: WebSocketClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()

    @property
    def _path(self) -> str:
        return f"/sandboxes/{self.sandbox_id}/repl/sessions/{self.context}"

    async def open(self) -> None:
        """Connect the channels (raises when the engine refuses or cannot be reached)."""
        url = self.client.url.replace("http", "ws", 1) + "/v1" + self._path + "/channels"
        headers = {"Authorization": str(self.client.session.headers["Authorization"])}
        self._ws = await websocket_connect(HTTPRequest(url, headers=headers))
        self.closed.clear()
        self._reader = asyncio.create_task(self._read(self._ws))

    @property
    def connected(self) -> bool:
        """True while the channels are open."""
        return self._ws is not None and not self.closed.is_set()

    async def _read(self, ws: WebSocketClientConnection) -> None:
        try:
            while (raw := await ws.read_message()) is not None:
                self._on_frame(json.loads(raw))
        finally:
            self.closed.set()

    async def send(self, channel: str, msg: dict[str, Any], buffers: list[Any]) -> None:
        """Send one message to the context's kernel on ``channel``."""
        if self._ws is None or self.closed.is_set():
            raise ConnectionError(f"the channels of sandbox {self.sandbox_id} are closed")
        frame = {
            "channel": channel,
            "header": msg["header"],
            "parent_header": msg["parent_header"],
            "metadata": msg["metadata"],
            "content": msg["content"],
            "buffers": encode_buffers(buffers),
        }
        await self._ws.write_message(json.dumps(frame, default=json_default))

    async def interrupt(self) -> None:
        """Interrupt the code running in the context."""
        await asyncio.to_thread(self.client.request, "POST", self._path + "/interrupt")

    async def restart(self) -> None:
        """Restart the context's kernel (same sandbox, fresh interpreter)."""
        await asyncio.to_thread(self.client.request, "POST", self._path + "/restart")

    async def close(self) -> None:
        """Close the channels; the sandbox is left as it is."""
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        self.closed.set()
