"""The clients' kept HTTP connections (sandfork.client.keepalive), against real servers on
loopback: a tornado server, and a raw one that misbehaves on purpose.

A second request goes over the first one's connection; a connection the server closed while
it was kept is not used; one that closes as a request goes out gets the request again on a
new one, unless its body was streamed and cannot be sent again; the head comes to
``header_callback`` as tornado's own client gives it; a slow streaming reader holds the body
back.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
from tornado.httpclient import HTTPRequest
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application, RequestHandler

from sandfork.client.keepalive import KeepAliveClient

pytestmark = pytest.mark.asyncio


class _Port(RequestHandler):
    """Answers with the client's port: one port for two requests means one connection."""

    def get(self) -> None:
        self.write(str(self.request.connection.stream.socket.getpeername()[1]))  # type: ignore[union-attr]

    def post(self) -> None:
        self.write(self.request.body)


@pytest_asyncio.fixture
async def server() -> AsyncIterator[tuple[HTTPServer, str]]:
    sockets = bind_sockets(0, "127.0.0.1")
    http = HTTPServer(Application([(r"/port", _Port), (r"/echo", _Port)]))
    http.add_sockets(sockets)
    yield http, f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    http.stop()
    await http.close_all_connections()


@pytest_asyncio.fixture
async def client() -> AsyncIterator[KeepAliveClient]:
    """A client whose kept connections are closed after the test."""
    made = KeepAliveClient()
    yield made
    made.close()


async def test_a_second_request_goes_over_the_first_ones_connection(
    server: tuple[HTTPServer, str], client: KeepAliveClient
) -> None:
    _, url = server
    first = await client.fetch(HTTPRequest(url + "/port"))
    second = await client.fetch(HTTPRequest(url + "/port"))
    assert first.code == second.code == 200
    assert first.body == second.body, "each request had a connection of its own"
    echoed = await client.fetch(HTTPRequest(url + "/echo", method="POST", body=b"x" * 10))
    assert echoed.body == b"x" * 10


async def test_a_kept_connection_the_server_closed_is_not_used(
    server: tuple[HTTPServer, str], client: KeepAliveClient
) -> None:
    http, url = server
    first = await client.fetch(HTTPRequest(url + "/port"))
    await http.close_all_connections()
    second = await client.fetch(HTTPRequest(url + "/port"))
    assert second.code == 200 and second.body != first.body


async def test_the_head_comes_line_by_line_as_tornados_client_gives_it(
    server: tuple[HTTPServer, str], client: KeepAliveClient
) -> None:
    _, url = server
    lines: list[str] = []
    chunks: list[bytes] = []
    answer = await client.fetch(
        HTTPRequest(url + "/port", header_callback=lines.append, streaming_callback=chunks.append)
    )
    assert answer.code == 200 and answer.body == b""
    assert lines[0] == "HTTP/1.1 200 OK\r\n" and lines[-1] == "\r\n"
    assert any(line.lower().startswith("content-length:") for line in lines)
    assert b"".join(chunks).isdigit()


class _ClosesTheSecondRequest:
    """A raw HTTP/1.1 server: on each connection it answers the first request and closes
    the connection on the next one without answering (as a server closing an idle
    connection does when a request crosses its close)."""

    def __init__(self) -> None:
        self.connections = 0
        self.answered = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        sock: socket.socket = self.server.sockets[0]
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await _read_request(reader)
        self.answered += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await _read_request(reader)  # the next one: closed unanswered
        writer.close()


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
        if line.lower().startswith(b"transfer-encoding:"):
            await reader.readuntil(b"0\r\n\r\n")


@pytest_asyncio.fixture
async def closing() -> AsyncIterator[tuple[_ClosesTheSecondRequest, str, KeepAliveClient]]:
    """The misbehaving server, its URL and a client of it; all closed after the test."""
    far = _ClosesTheSecondRequest()
    url = await far.start()
    made = KeepAliveClient()
    yield far, url, made
    made.close()
    assert far.server is not None
    far.server.close()


@pytest.mark.parametrize("body", [None, b"payload"])
async def test_a_request_the_kept_connection_dropped_goes_again_on_a_new_one(
    body: bytes | None, closing: tuple[_ClosesTheSecondRequest, str, KeepAliveClient]
) -> None:
    far, url, client = closing
    method = "GET" if body is None else "POST"
    assert (await client.fetch(HTTPRequest(url, method=method, body=body))).code == 200
    again = await client.fetch(HTTPRequest(url, method=method, body=body))
    assert again.code == 200 and again.body == b"ok"
    assert (far.connections, far.answered) == (2, 2)


async def test_a_streamed_body_is_not_sent_twice(
    closing: tuple[_ClosesTheSecondRequest, str, KeepAliveClient],
) -> None:
    far, url, client = closing

    def streamed() -> Callable[[Callable[[bytes], object]], asyncio.Future[None]]:
        async def produce(write: Callable[[bytes], object]) -> None:
            result = write(b"part")
            if asyncio.isfuture(result):
                await result

        return produce  # type: ignore[return-value]

    first = HTTPRequest(url, method="POST", body_producer=streamed())
    assert (await client.fetch(first)).code == 200
    second = HTTPRequest(url, method="POST", body_producer=streamed())
    failed = await client.fetch(second)
    assert failed.code == 599, "a streamed body was sent a second time"
    assert far.answered == 1


async def test_no_answer_in_time_is_a_599() -> None:
    quiet = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = quiet.sockets[0].getsockname()[1]
    client = KeepAliveClient()
    try:
        answer = await client.fetch(HTTPRequest(f"http://127.0.0.1:{port}/", request_timeout=0.2))
        assert answer.code == 599 and "Timeout" in str(answer.error)
    finally:
        client.close()
        quiet.close()


async def test_a_slow_reader_holds_the_next_chunk_back() -> None:
    """While the streaming callback's awaitable is pending, no more of the body is read: the
    sender's data waits in its own buffers (as with tornado's own client, which the gateway's
    relay of a stream to a slow client relies on)."""
    size = 64 * 2**20
    sender: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        sender.append(writer)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        writer.write(b"x" * size)
        await writer.drain()
        writer.close()

    far = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{far.sockets[0].getsockname()[1]}/"
    held: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    got: list[int] = []

    def on_chunk(chunk: bytes) -> asyncio.Future[None]:
        got.append(len(chunk))
        return held

    client = KeepAliveClient()
    fetching = asyncio.ensure_future(
        client.fetch(HTTPRequest(url, streaming_callback=on_chunk, request_timeout=600))
    )
    try:
        # The sender's buffer fills at once; the first chunk read holds the reader, so the
        # buffer stays full (the first chunk may come before or after it fills).
        for _ in range(60_000):  # a hang's bound, not a speed: each turn yields to the loop
            if got and sender and sender[0].transport.get_write_buffer_size() > size // 2:
                break
            await asyncio.sleep(0.001)
        else:
            pytest.fail(f"the body was read on: {sum(got)} bytes taken while held")
        assert len(got) == 1
        held.set_result(None)
        done = await fetching
        assert done.code == 200
    finally:
        client.close()
        far.close()
