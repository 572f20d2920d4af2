"""``EngineClient``: the one asynchronous client of the engine's ``/v1`` API (REST and the
channels WebSocket), on tornado's HTTP client, usable from any event loop."""

from __future__ import annotations

import asyncio
import json as jsonlib
import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from sandfork.client.connection import Connection, resolve
from sandfork.client.keepalive import RESOLVER, loop_client
from sandfork.protocol import EngineUnreachable, SandforkError, error_for

Body = bytes | str | IO[bytes] | None
StreamCallback = Callable[[bytes], object]

STREAM_TIMEOUT = 24 * 3600.0  # whole-request limit of a streamed answer (exec stream, export)
_CHUNK = 1 << 20
_NO_BODY = ("GET", "DELETE", "HEAD", "OPTIONS")


@dataclass
class Response:
    """A finished answer of the engine (its status was below 400)."""

    status_code: int
    content: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The body as text (UTF-8)."""
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body decoded as JSON."""
        return jsonlib.loads(self.content)


class EngineClient:
    """An asynchronous client of one engine.

    The engine is the given one (``url`` and ``api_key``), else found by
    :func:`sandfork.client.connection.resolve` on first use: the environment, then the local
    engine, started if none runs. Every failure raises a :class:`sandfork.protocol.SandforkError`
    of the engine's error kind with its message (:class:`EngineUnreachable` when none
    answered). One instance may be used from several event loops (one HTTP client each).
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
        *,
        auto_start: bool = True,
    ) -> None:
        self._configured = Connection(url.rstrip("/"), api_key) if url and api_key else None
        self._connection = self._configured
        self.timeout = timeout
        self.auto_start = auto_start

    async def connection(self) -> Connection:
        """Where the engine is (resolved once; finding or starting one runs in a thread)."""
        if self._connection is None:
            try:
                self._connection = await asyncio.to_thread(resolve, self.auto_start)
            except SandforkError:
                raise
            except Exception as e:
                raise EngineUnreachable(f"no Sandfork engine to talk to: {e}") from e
        return self._connection

    def resolve_now(self) -> Connection:
        """:meth:`connection`, synchronously (for callers that want the URL up front)."""
        if self._connection is None:
            self._connection = resolve(self.auto_start)
        return self._connection

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send ``method /v1{path}`` (keywords as :meth:`fetch`); return the decoded JSON
        answer (None when it has no body)."""
        response = await self.fetch(method, path, **kwargs)
        return jsonlib.loads(response.content) if response.content else None

    async def fetch(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        data: Body = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        streaming_callback: StreamCallback | None = None,
    ) -> Response:
        """Send ``method /v1{path}`` and return the answer.

        ``json`` is sent as JSON; ``data`` as it is (bytes, text or a binary file, streamed).
        With ``streaming_callback``, the body goes there chunk by chunk as it arrives (and the
        request may run up to :data:`STREAM_TIMEOUT`) instead of into the response.
        """
        conn = await self.connection()
        url = f"{conn.url}/v1{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        all_headers = {"Authorization": f"Bearer {conn.api_key}", **(headers or {})}
        body: bytes | str | None = None
        producer = None
        if json is not None:
            body = jsonlib.dumps(json)
            all_headers.setdefault("Content-Type", "application/json")
        elif isinstance(data, bytes | str):
            body = data
        elif data is not None:
            producer = _file_producer(data)
            size = _size(data)
            if size is not None:
                all_headers["Content-Length"] = str(size)
        elif method not in _NO_BODY:
            body = b""
        status = _StatusWatch(streaming_callback)
        request = HTTPRequest(
            url,
            method=method,
            headers=all_headers,
            body=body,
            body_producer=producer,
            request_timeout=timeout or (STREAM_TIMEOUT if streaming_callback else self.timeout),
            streaming_callback=status.on_chunk if streaming_callback else None,
            header_callback=status.on_header if streaming_callback else None,
            allow_nonstandard_methods=True,
            decompress_response=False,
        )
        answer = await loop_client().fetch(request)
        if answer.code == 599:  # no answer: refused, reset, timed out
            raise self._unreachable(conn, answer.error)
        if answer.code >= 400:
            raise _error(answer.code, status.error_body or answer.body)
        return Response(answer.code, answer.body or b"", dict(answer.headers.get_all()))

    async def websocket(
        self,
        path: str,
        on_message: Callable[[str | bytes | None], None],
        max_message_size: int = 1 << 30,
    ) -> WebSocketClientConnection:
        """Connect the WebSocket at ``/v1{path}``; messages (None: closed) go to
        ``on_message``. A refusal raises the engine's error kind (``status`` tells which)."""
        conn = await self.connection()
        url = conn.url.replace("http", "ws", 1) + "/v1" + path
        headers = {"Authorization": f"Bearer {conn.api_key}"}
        try:
            return await websocket_connect(
                HTTPRequest(url, headers=headers),
                on_message_callback=on_message,
                max_message_size=max_message_size,
                resolver=RESOLVER,
            )
        except HTTPClientError as e:
            raise _error(e.code, e.response.body if e.response is not None else b"") from e
        except OSError as e:
            raise self._unreachable(conn, e) from e

    def _unreachable(self, conn: Connection, cause: object) -> EngineUnreachable:
        if self._configured is None:  # a local engine may have been restarted: look again
            self._connection = None
        return EngineUnreachable(f"could not reach the engine at {conn.url}: {cause}")


class _StatusWatch:
    """Passes a streamed body on, unless the answer is an error: that body is kept."""

    def __init__(self, on_chunk: StreamCallback | None) -> None:
        self._on_chunk = on_chunk
        self.status = 0
        self.error_body = b""

    def on_header(self, line: str) -> None:
        if line.startswith("HTTP/"):
            self.status = int(line.split()[1])

    def on_chunk(self, chunk: bytes) -> None:
        if self.status >= 400:
            self.error_body += chunk
        elif self._on_chunk is not None:
            self._on_chunk(chunk)


def _file_producer(f: IO[bytes]) -> Callable[[Callable[[bytes], Any]], Any]:
    async def produce(write: Callable[[bytes], Any]) -> None:
        while chunk := await asyncio.to_thread(f.read, _CHUNK):
            await write(chunk)

    return produce


def _size(f: IO[bytes]) -> int | None:
    try:
        return os.fstat(f.fileno()).st_size - f.tell()
    except (OSError, ValueError, AttributeError):
        return None


def _error(status: int, body: bytes | None) -> SandforkError:
    """The error of a failure answer: its JSON ``error`` and ``kind``, else its text."""
    try:
        answer = jsonlib.loads(body or b"")
        return error_for(status, str(answer["error"]), answer.get("kind"))
    except (ValueError, KeyError, TypeError, AttributeError):
        text = (body or b"").decode("utf-8", "replace").strip()
        return error_for(status, text or f"HTTP {status}")
