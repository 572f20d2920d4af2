"""The kernel's connection to one code context of a sandbox: the engine's WebSocket channels
(Jupyter messages both ways) plus its REST interrupt and restart."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tornado.websocket import WebSocketClientConnection, WebSocketClosedError

from sandfork.client import EngineClient
from sandfork.protocol import SandforkError, routes

log = logging.getLogger(__name__)

_RECONNECT_FOR = 60.0  # seconds the kernel tries to get its channels back after a drop
_MAX_MESSAGE = 1 << 30  # tornado's default (10 MiB) would drop the link on a large output
_DECODER = json.JSONDecoder()
_PARTS = ("header", "parent_header", "metadata", "content")


@dataclass
class GuestMessage:
    """A message of the guest kernel, as a frame of the channels carried it."""

    channel: str
    header: dict[str, Any]
    parent_header: dict[str, Any]
    parts: list[bytes]  # header, parent header, metadata and content: JSON, as in the frame
    buffers: list[bytes]


FrameHandler = Callable[[GuestMessage], None]


def encode_buffers(buffers: Sequence[Any]) -> list[str]:
    """Binary message buffers as the base64 strings the channels carry."""
    return [base64.b64encode(b).decode() for b in buffers]


def parse_frame(text: str | bytes) -> GuestMessage:
    """A frame of the channels, its message parts kept as the JSON text they are in the frame
    (the relay re-signs them; decoding and encoding them again would only cost time)."""
    if isinstance(text, bytes):
        text = text.decode()
    values: dict[str, Any] = {}
    parts = dict.fromkeys(_PARTS, "{}")  # the JSON text of each part
    i = _skip_space(text, 0)
    if text[i : i + 1] != "{":
        raise ValueError("the frame is not a JSON object")
    i = _skip_space(text, i + 1)
    while text[i : i + 1] != "}":
        key, i = _DECODER.raw_decode(text, i)
        i = _skip_space(text, i)
        if text[i : i + 1] != ":":
            raise ValueError(f"the frame has no ':' at {i}")
        start = _skip_space(text, i + 1)
        values[key], i = _DECODER.raw_decode(text, start)
        if key in parts:
            parts[key] = text[start:i]
        i = _skip_space(text, i)
        if text[i : i + 1] == ",":
            i = _skip_space(text, i + 1)
    return GuestMessage(
        channel=values.get("channel") or "iopub",
        header=values.get("header") or {},
        parent_header=values.get("parent_header") or {},
        parts=[parts[name].encode() for name in _PARTS],
        buffers=[base64.b64decode(b) for b in values.get("buffers") or []],
    )


def _skip_space(text: str, i: int) -> int:
    while text[i : i + 1].isspace():
        i += 1
    return i


class SandboxLink:
    """The channels of ``context`` in ``sandbox_id``; frames go to ``on_frame``.

    Frames are handled as they arrive, in tornado's read loop: no queue, no task per frame.
    REST calls and the WebSocket go through ``client``, the engine's asynchronous client.
    """

    def __init__(
        self, client: EngineClient, sandbox_id: str, context: str, on_frame: FrameHandler
    ) -> None:
        self.client = client
        self.sandbox_id = sandbox_id
        self.context = context
        self._on_frame = on_frame
        self._ws: WebSocketClientConnection | None = None
        self.closed = asyncio.Event()

    async def open(self) -> None:
        """Connect the channels; raises the engine's error (``status`` 404: no such sandbox
        or context, 409: its VM is gone) or ``EngineUnreachable``."""
        self._ws = None
        self.closed.clear()  # before connecting: a close may arrive before this resumes
        try:
            self._ws = await self.client.websocket(
                routes.context(self.sandbox_id, self.context, "channels"),
                self._on_message,
                _MAX_MESSAGE,
            )
        except BaseException:
            self.closed.set()
            raise
        if self._ws.protocol is not None:  # None if the engine has closed it already
            self._ws.protocol.set_nodelay(True)  # a frame per request: never wait for an ACK

    @property
    def connected(self) -> bool:
        """True while the channels are open."""
        return self._ws is not None and not self.closed.is_set()

    def _on_message(self, raw: str | bytes | None) -> None:
        if raw is None:
            self.closed.set()
            return
        try:
            message = parse_frame(raw)
        except ValueError as e:
            log.warning("dropping a frame of the channels that is not a message: %s", e)
            return
        self._on_frame(message)

    def send(self, channel: str, parts: Sequence[bytes], buffers: Sequence[Any]) -> None:
        """Send one message to the context's kernel on ``channel``.

        ``parts`` are its header, parent header, metadata and content, each already JSON (as
        on the wire of ZMQ): they are spliced into the frame, not decoded and encoded again.
        """
        ws = self._ws
        if ws is None or self.closed.is_set():
            raise ConnectionError(f"the channels of sandbox {self.sandbox_id} are closed")
        header, parent, metadata, content = (p.decode("utf8", "replace") for p in parts)
        frame = (
            f'{{"channel":"{channel}","header":{header},"parent_header":{parent},'
            f'"metadata":{metadata},"content":{content},'
            f'"buffers":{json.dumps(encode_buffers(buffers))}}}'
        )
        try:
            written = ws.write_message(frame)
        except WebSocketClosedError as e:
            raise ConnectionError(f"the channels of sandbox {self.sandbox_id} closed") from e
        # A write that fails later means the connection dropped, which closes the link too.
        written.add_done_callback(lambda f: None if f.cancelled() else f.exception())

    async def interrupt(self) -> None:
        """Interrupt the code running in the context."""
        await self.client.request(
            "POST", routes.context(self.sandbox_id, self.context, "interrupt")
        )

    async def restart(self) -> None:
        """Restart the context's kernel (same sandbox, fresh interpreter)."""
        await self.client.request("POST", routes.context(self.sandbox_id, self.context, "restart"))

    def close(self) -> None:
        """Close the channels; the sandbox is left as it is."""
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.close()
        self.closed.set()


async def keep_linked(
    current: Callable[[], SandboxLink], closing: Callable[[], bool], gone: Callable[[str], None]
) -> None:
    """Reopen the ``current()`` link's channels when they drop (an engine restart) until
    ``closing()``; call ``gone`` with the reason when its sandbox is gone for good. A link
    replaced meanwhile (``%restore``, hibernation) is left to whoever replaced it."""
    while True:
        link = current()
        await link.closed.wait()
        if closing():
            return
        if link is not current():
            continue
        log.warning("lost the channels of sandbox %s; reconnecting", link.sandbox_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _RECONNECT_FOR
        while link is current() and not link.connected and loop.time() < deadline:
            try:
                await link.open()
            except SandforkError as e:
                # 404: deleted; 409: its VM died (an engine answers only once it has
                # adopted its running sandboxes): either way there is nothing to wait for
                if e.status in (404, 409):
                    break
                log.debug("reconnect failed: %s", e)
                await asyncio.sleep(1.0)
        if link is current() and not link.connected:
            reason = f"sandbox {link.sandbox_id} is gone; restart the kernel"
            log.error(reason)
            gone(reason)
            return
