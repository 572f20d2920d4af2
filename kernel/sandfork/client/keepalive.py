"""HTTP/1.1 with connections kept open, for the engine's clients and the gateway.

Tornado's own client opens a TCP connection for every request and closes it after: on this
project's 2-core machine that was 2.2 ms of each call the gateway relayed (the connect, the
engine's accept, the handshake) and the same again on every SDK call. This client sends each
request over tornado's :class:`~tornado.http1connection.HTTP1Connection` on a connection
kept from an earlier request to the same host when there is one, and keeps the connection
afterwards when the answer allows it (HTTP/1.1, no ``Connection: close``, its body fully
read). It takes tornado's :class:`~tornado.httpclient.HTTPRequest` (body or
``body_producer``, ``header_callback``, ``streaming_callback``, timeouts) and gives a
:class:`~tornado.httpclient.HTTPResponse` (599 when there is no answer), so callers keep
tornado's model. A ``streaming_callback`` that returns an awaitable holds the reading of the
next chunk until it is done: a slow reader slows the sender.

A kept connection the far end closed meanwhile (a restarted engine, an idle timeout) is
seen before it is used; one that closes just as a request goes out gets that request once
more on a new connection, when nothing of an answer came and its body can be sent again.
"""

from __future__ import annotations

import asyncio
import select
import ssl
import time
import weakref
from collections.abc import Awaitable
from io import BytesIO
from urllib.parse import SplitResult, urlsplit

from tornado import httputil
from tornado.http1connection import HTTP1Connection, HTTP1ConnectionParameters
from tornado.httpclient import HTTPRequest, HTTPResponse
from tornado.iostream import IOStream, StreamClosedError
from tornado.simple_httpclient import HTTPTimeoutError
from tornado.tcpclient import TCPClient

from sandfork.client.resolver import NumericFirstResolver

MAX_BODY = 1 << 40  # the far end bounds what it sends; tornado's default is 100 MB
RESOLVER = NumericFirstResolver()  # an engine's numeric address needs no executor thread
MAX_IDLE = 32  # connections kept per host beyond that are closed
_DEFAULT_TIMEOUT = 20.0  # seconds, tornado's client's default for both
_Key = tuple[str, str, int]


class KeepAliveClient:
    """Requests over kept connections, on the event loop it was made on."""

    def __init__(self) -> None:
        self._tcp = TCPClient(resolver=RESOLVER)
        self._idle: dict[_Key, list[IOStream]] = {}

    async def fetch(self, request: HTTPRequest) -> HTTPResponse:
        """Send ``request``; its answer, whatever its status (599: none came)."""
        started = time.monotonic()
        url = urlsplit(request.url)
        key = (url.scheme, url.hostname or "", url.port or (443 if url.scheme == "https" else 80))
        for attempt in range(2):
            stream, kept = self._take(key)
            answer = _Answer(request)
            error: BaseException | None = None
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation
                # that comes as the awaited work ends (gh-86296), and the caller runs on.
                async with asyncio.timeout(request.request_timeout or _DEFAULT_TIMEOUT):
                    if stream is None:
                        stream = await self._connect(key, request)
                    await _exchange(stream, request, url, answer)
            except TimeoutError:
                error = HTTPTimeoutError("Timeout")
            except (OSError, httputil.HTTPInputError) as e:  # StreamClosedError is an OSError
                error = e
            finally:  # a failed or cancelled exchange leaves its connection unusable
                if stream is not None and (error is not None or not answer.done):
                    stream.close()
            if error is None:
                assert stream is not None
                self._keep(key, stream, answer)
                return answer.response(time.monotonic() - started)
            closed = isinstance(error, StreamClosedError | ConnectionError)
            resend = request.body_producer is None and not answer.started
            if closed and kept and attempt == 0 and resend:
                continue  # the kept connection had closed: nothing was answered
            return _failed(request, error, started)
        raise AssertionError("unreachable: the second attempt returns")

    async def _connect(self, key: _Key, request: HTTPRequest) -> IOStream:
        scheme, host, port = key
        tls = ssl.create_default_context() if scheme == "https" else None
        async with asyncio.timeout(request.connect_timeout or _DEFAULT_TIMEOUT):
            return await self._tcp.connect(host, port, ssl_options=tls, max_buffer_size=MAX_BODY)

    def _take(self, key: _Key) -> tuple[IOStream | None, bool]:
        """A kept connection that is still open and idle, if there is one."""
        idle = self._idle.get(key, [])
        while idle:
            stream = idle.pop()
            if _open_and_quiet(stream):
                return stream, True
            stream.close()
        return None, False

    def _keep(self, key: _Key, stream: IOStream, answer: _Answer) -> None:
        idle = self._idle.setdefault(key, [])
        if stream.closed() or not answer.keeps_connection() or len(idle) >= MAX_IDLE:
            stream.close()
        else:
            idle.append(stream)

    def close(self) -> None:
        """Close every kept connection."""
        for idle in self._idle.values():
            for stream in idle:
                stream.close()
        self._idle.clear()


def _open_and_quiet(stream: IOStream) -> bool:
    """Whether a kept connection is open with nothing to read on it: the far end's close,
    or bytes nobody asked for, would make it readable."""
    if stream.closed():
        return False
    try:
        readable, _, _ = select.select([stream.socket], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


async def _exchange(
    stream: IOStream, request: HTTPRequest, parts: SplitResult, answer: _Answer
) -> None:
    connection = HTTP1Connection(
        stream,
        True,
        HTTP1ConnectionParameters(
            no_keep_alive=False,
            max_body_size=MAX_BODY,
            decompress=bool(request.decompress_response),
        ),
    )
    headers = httputil.HTTPHeaders(request.headers)
    headers.setdefault("Host", parts.netloc)
    body = request.body if request.body_producer is None else None
    if body is not None and request.method not in ("GET", "HEAD"):
        headers["Content-Length"] = str(len(body))
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection.write_headers(httputil.RequestStartLine(request.method, path, "HTTP/1.1"), headers)
    if request.body_producer is not None:
        await request.body_producer(connection.write)  # type: ignore[arg-type]
    elif body:
        await connection.write(body)
    connection.finish()
    await connection.read_response(answer)
    connection.detach()


class _Answer(httputil.HTTPMessageDelegate):
    """The answer as it comes: its head to ``header_callback`` (as tornado's client gives it,
    line by line), its body to ``streaming_callback`` or kept."""

    def __init__(self, request: HTTPRequest) -> None:
        self.request = request
        self.started = False
        self.done = False
        self.start_line = httputil.ResponseStartLine("HTTP/1.1", 0, "")
        self.headers = httputil.HTTPHeaders()
        self._chunks: list[bytes] = []

    def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> None:
        assert isinstance(start_line, httputil.ResponseStartLine)
        self.started = True
        self.start_line, self.headers = start_line, headers
        on_header = self.request.header_callback
        if on_header is not None:
            on_header(f"{start_line.version} {start_line.code} {start_line.reason}\r\n")
            for name, value in headers.get_all():
                on_header(f"{name}: {value}\r\n")
            on_header("\r\n")

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        if self.request.streaming_callback is not None:
            result = self.request.streaming_callback(chunk)
            return result if isinstance(result, Awaitable) else None  # type: ignore[unreachable]
        self._chunks.append(chunk)
        return None

    def finish(self) -> None:
        self.done = True

    def keeps_connection(self) -> bool:
        """Whether the connection may carry another request."""
        asked_close = self.request.headers.get("Connection", "").lower() == "close"
        told_close = self.headers.get("Connection", "").lower() == "close"
        return self.start_line.version == "HTTP/1.1" and not (asked_close or told_close)

    def response(self, seconds: float) -> HTTPResponse:
        """The answer as tornado's client gives it."""
        return HTTPResponse(
            self.request,
            self.start_line.code,
            reason=self.start_line.reason,
            headers=self.headers,
            buffer=BytesIO(b"".join(self._chunks)),
            effective_url=self.request.url,
            request_time=seconds,
        )


def _failed(request: HTTPRequest, error: BaseException, started: float) -> HTTPResponse:
    return HTTPResponse(request, 599, error=error, request_time=time.monotonic() - started)


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, KeepAliveClient] = (
    weakref.WeakKeyDictionary()
)


def loop_client() -> KeepAliveClient:
    """The running loop's client (connections belong to the loop they were made on)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = KeepAliveClient()
    return client
