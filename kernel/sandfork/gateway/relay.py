"""Relaying an HTTP request to an engine, streamed both ways.

The request body goes to the engine chunk by chunk as the client sends it (an import, a file
upload), through a small queue: tornado reads no more of the client's body while the queue is
full. The answer's status and headers are relayed as they arrive, then its body chunk by chunk
(server-sent events of an exec stream, a logs follow, an export download), each flushed before
the engine's next chunk is read, so a slow client slows the engine's sending instead of
filling the gateway's memory. The client's key is replaced by the engine's own.

An answer that describes sandboxes or snapshots (:class:`~sandfork.gateway.routing.Target`
``learn``) is also kept, up to :data:`LEARN_LIMIT`, to learn who owns them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from tornado import httputil
from tornado.httpclient import HTTPRequest, HTTPResponse

from sandfork.client.keepalive import loop_client
from sandfork.gateway.base import GatewayHandler
from sandfork.gateway.fleet import Engine
from sandfork.gateway.routing import Target, target
from sandfork.http_relay import HOP_BY_HOP
from sandfork.protocol import EngineUnreachable, SandforkError
from sandfork.serving import CREDENTIALS

STREAM_TIMEOUT = 24 * 3600.0  # whole-request limit: streams and downloads may be long
LEARN_LIMIT = 8 * 2**20  # an answer kept to learn from is at most this large
_HOP_BY_HOP = HOP_BY_HOP | {"host"}  # the engine's own host, not the gateway's
_NO_BODY = ("GET", "HEAD", "DELETE", "OPTIONS")
_END = b""  # the end of a request body in the queue


def upstream_headers(
    headers: httputil.HTTPHeaders, engine: Engine, method: str = "GET"
) -> httputil.HTTPHeaders:
    """The request's headers as the engine gets them: its own key, no hop-by-hop ones."""
    dropped = _HOP_BY_HOP | set(CREDENTIALS)
    kept = httputil.HTTPHeaders()
    for name, value in headers.get_all():
        if name.lower() not in dropped:
            kept.add(name, value)
    kept["Authorization"] = f"Bearer {engine.api_key}"
    if method == "POST" and "Content-Type" not in kept:
        # tornado's client would call a POST body without one a form; this is what a
        # recipient assumes of it (RFC 9110, 8.3)
        kept["Content-Type"] = "application/octet-stream"
    return kept


def engine_request(
    handler: GatewayHandler, engine: Engine, body: bytes | None = None, **kwargs: Any
) -> HTTPRequest:
    """The request ``handler`` relays, addressed to ``engine`` (the same path and query)."""
    return HTTPRequest(
        engine.url + handler.request.uri,
        method=handler.request.method,
        headers=upstream_headers(handler.request.headers, engine, str(handler.request.method)),
        body=body,
        connect_timeout=handler.config.connect_timeout,
        request_timeout=STREAM_TIMEOUT,
        allow_nonstandard_methods=True,
        decompress_response=False,
        follow_redirects=False,
        **kwargs,
    )


async def fetch(handler: GatewayHandler, engine: Engine, request: HTTPRequest) -> HTTPResponse:
    """Send ``request``; a 502 naming the engine (now counted down) when it does not answer."""
    response = await loop_client().fetch(request)
    if response.code == 599 and not handler._headers_written:
        handler.fleet.unreachable(engine, response.error)
        raise EngineUnreachable(f"{engine.describe()} did not answer: {response.error}")
    return response


def start_answer(
    handler: GatewayHandler, code: int, reason: str, headers: httputil.HTTPHeaders
) -> None:
    """Give ``handler``'s answer the engine's status and headers."""
    handler.set_status(code, reason or None)
    handler.clear_header("Content-Type")
    seen: set[str] = set()
    for name, value in headers.get_all():
        lower = name.lower()
        if lower in _HOP_BY_HOP or lower in ("date", "server"):
            continue
        if lower in seen:
            handler.add_header(name, value)
        else:
            handler.set_header(name, value)
            seen.add(lower)


def learned(
    handler: GatewayHandler, engine: Engine, chosen: Target, code: int, body: bytes
) -> None:
    """Note what a successful answer says about ownership."""
    if code == 204 and chosen.killed:
        handler.fleet.killed(chosen.killed)
    if not chosen.learn or code >= 300 or not body:
        return
    try:
        handler.fleet.learn(engine, json.loads(body))
    except ValueError:
        pass  # not JSON after all: nothing to learn


class _BodyPipe:
    """The client's request body on its way to the engine (bounded: back-pressure)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=8)
        self._closed = False

    async def put(self, chunk: bytes) -> None:
        if not self._closed:
            await self._queue.put(chunk)

    def close(self) -> None:
        """The engine takes no more: drop what waits, and what comes."""
        self._closed = True
        while not self._queue.empty():
            self._queue.get_nowait()

    async def produce(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        while (chunk := await self._queue.get()) != _END:
            await write(chunk)


class RelayHandler(GatewayHandler):
    """Any request the gateway does not answer itself: relayed to its engine, streamed."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

    _pipe: _BodyPipe | None = None
    _relayed: asyncio.Future[None] | None = None
    _answer: dict[str, Any] | None = None

    async def prepare(self) -> None:  # type: ignore[override]
        super().prepare()
        if self.refused:
            return
        try:
            chosen = await target(self.fleet, str(self.request.method), self.request.path)
        except SandforkError as e:
            self.refuse(e)
            return
        if chosen.engine is None:
            self._answer = chosen.answer
            return
        headers = self.request.headers
        declared = headers.get("Content-Length", "0").strip()  # tornado checked its form
        has_body = declared not in ("", "0") or "Transfer-Encoding" in headers
        self._pipe = _BodyPipe() if has_body else None
        self._relayed = asyncio.ensure_future(self._forward(chosen.engine, chosen))

    async def data_received(self, chunk: bytes) -> None:  # type: ignore[override]
        if self._pipe is not None and not self.refused:
            await self._pipe.put(chunk)

    async def relay(self, *_args: str) -> None:
        if self._answer is not None:
            self.write_json(self._answer)
            return
        assert self._relayed is not None
        if self._pipe is not None:
            await self._pipe.put(_END)
        try:
            await self._relayed
        except EngineUnreachable:
            if self._headers_written:
                raise
            # Its engine now counts as down: a sandbox's record says so, any other call is
            # a 409 naming the engine (target raises it); elsewhere the 502 stands.
            again = await target(self.fleet, str(self.request.method), self.request.path)
            if again.answer is None:
                raise
            self.write_json(again.answer)

    get = head = post = put = patch = delete = options = relay

    async def _forward(self, engine: Engine, chosen: Target) -> None:
        answer = _StreamedAnswer(self, chosen.learn)
        bodiless = self._pipe is not None or self.request.method in _NO_BODY
        request = engine_request(
            self,
            engine,
            None if bodiless else b"",
            body_producer=self._pipe.produce if self._pipe is not None else None,
            header_callback=answer.on_header,
            streaming_callback=answer.on_chunk,
        )
        try:
            response = await fetch(self, engine, request)
        finally:
            if self._pipe is not None:
                self._pipe.close()
        if response.code == 599:  # the engine went away in the middle of its answer
            self.request.connection.close()  # type: ignore[union-attr]
            return
        learned(self, engine, chosen, response.code, answer.kept())
        if not self._finished:
            self.finish()


class _StreamedAnswer:
    """The engine's answer, relayed to the client as it comes."""

    def __init__(self, handler: GatewayHandler, keep: bool) -> None:
        self._handler = handler
        self._keep = keep
        self._kept: list[bytes] | None = None
        self._size = 0
        self._code = 0
        self._reason = ""
        self._headers = httputil.HTTPHeaders()

    def on_header(self, line: str) -> None:
        if line.startswith("HTTP/"):
            parts = line.rstrip("\r\n").split(" ", 2)
            self._code, self._reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
            self._headers = httputil.HTTPHeaders()
        elif line.strip():
            self._headers.parse_line(line)
        else:
            start_answer(self._handler, self._code, self._reason, self._headers)
            json_answer = self._headers.get("Content-Type", "").startswith("application/json")
            self._kept = [] if self._keep and json_answer and self._code < 300 else None

    def on_chunk(self, chunk: bytes) -> Awaitable[None]:
        if self._kept is not None:
            self._size += len(chunk)
            if self._size > LEARN_LIMIT:
                self._kept = None
            else:
                self._kept.append(chunk)
        self._handler.write(chunk)
        return self._handler.flush()

    def kept(self) -> bytes:
        """The answer's body, when it was kept to learn from."""
        return b"".join(self._kept or ())
