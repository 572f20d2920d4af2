"""The egress channel: the real guest agent's relay on the host, the engine's tunnel, and a
hostile guest speaking raw frames to the tunnel.

Only loopback traffic: the relayed destination is a server of this test on 127.0.0.1, reached
with a policy that allows loopback (the engine's never does).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from agent_client import AgentProcess
from origin import OriginServer
from sandfork.agent import channel
from sandfork.agent.channel import CLOSE, DATA, EOF, HELLO, OPEN, Decoder, FrameError, pack
from sandfork.engine.egress import EgressProxy
from sandfork.engine.egress_tunnel import EgressTunnel, StreamBudget

BIG = 16 * 2**20  # bytes of the large download: many windows' worth, and more than sockets hold
BODY = bytes(range(256)) * (BIG // 256)


def serving_origin() -> OriginServer:
    """``/big`` is :data:`BIG` bytes, anything else ``ok``."""
    return OriginServer(lambda path: BODY if path == "/big" else b"ok")


@pytest.fixture(scope="module")
def origin() -> Iterator[OriginServer]:
    server = serving_origin()
    yield server
    server.close()


@dataclass
class Guest:
    """The real agent on the host: its egress channel socket and its proxy address."""

    agent: AgentProcess
    channel: Path
    port: int

    async def open_channel(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(str(self.channel))

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the proxy address, as a program in the guest makes it."""
        return await asyncio.open_connection("127.0.0.1", self.port)


@pytest.fixture
def guest(tmp_path: Path) -> Iterator[Guest]:
    with running_guest(tmp_path) as running:
        yield running


@contextlib.contextmanager
def running_guest(tmp_path: Path) -> Iterator[Guest]:
    """The real agent, run on the host, with its egress relay up."""
    path = tmp_path / "egress.sock"
    agent = AgentProcess(
        tmp_path,
        extra_args=("--egress-listen-unix", str(path), "--egress-address", "127.0.0.1:0"),
    )
    agent.start()
    try:
        found = _wait_for(lambda: re.search(r"egress proxy listening on [\d.]+:(\d+)", agent.log()))
        yield Guest(agent, path, int(found.group(1)))
    finally:
        agent.stop()


def _wait_for(probe: Any, what: str = "the agent's egress relay") -> Any:
    """Poll ``probe`` until it returns something true (the agent process runs meanwhile)."""
    import time

    deadline = time.monotonic() + 60
    while not (found := probe()):
        assert time.monotonic() < deadline, f"{what} did not come up"
        time.sleep(0.01)
    return found


LOOPBACK_ALLOWED = EgressProxy(policy=lambda ip: None)  # to reach the test's own origin


def _tunnel(
    opener: Any,
    *,
    cap: int = 8,
    budget: StreamBudget | None = None,
    proxy: EgressProxy = LOOPBACK_ALLOWED,
) -> EgressTunnel:
    tunnel = EgressTunnel("test", opener, proxy, budget or StreamBudget(64), cap)
    tunnel.start()
    return tunnel


async def _request(guest: Guest, request: bytes) -> bytes:
    reader, writer = await guest.connect()
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    return answer


@pytest.mark.asyncio
async def test_streams_are_relayed_with_flow_control(guest: Guest, origin: OriginServer) -> None:
    tunnel = _tunnel(guest.open_channel)
    try:
        assert await tunnel.ready(60)
        expect = hashlib.sha256(BODY).hexdigest()
        connect = f"CONNECT 127.0.0.1:{origin.port} HTTP/1.1\r\n\r\n"
        inner = "GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        answers = await asyncio.gather(
            _request(guest, f"GET http://127.0.0.1:{origin.port}/big HTTP/1.1\r\n\r\n".encode()),
            _request(guest, (connect + inner).encode()),
            _request(guest, f"GET http://127.0.0.1:{origin.port}/small HTTP/1.1\r\n\r\n".encode()),
        )
        plain, tunnelled, small = answers
        assert hashlib.sha256(plain.split(b"\r\n\r\n", 1)[1]).hexdigest() == expect
        assert tunnelled.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.0 200")
        assert hashlib.sha256(tunnelled.split(b"\r\n\r\n", 2)[2]).hexdigest() == expect
        assert small.endswith(b"\r\n\r\nok")
        await _until(lambda: tunnel.open_streams == 0)
    finally:
        await tunnel.close()


@pytest.mark.asyncio
async def test_a_guest_that_does_not_read_holds_one_window(
    guest: Guest, origin: OriginServer
) -> None:
    """Backpressure: a client that stops reading stops the upstream download."""
    tunnel = _tunnel(guest.open_channel)
    try:
        assert await tunnel.ready(60)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # it holds little
        client.connect(("127.0.0.1", guest.port))
        reader, writer = await asyncio.open_connection(sock=client)
        writer.write(f"GET http://127.0.0.1:{origin.port}/big HTTP/1.1\r\n\r\n".encode())
        await writer.drain()
        first = await reader.read(1)  # the download has started; now nobody reads
        assert first == b"H"
        stream = next(iter(tunnel._streams.values()))[0]
        # The engine's side of the stream stops at the guest's window: it holds one write.
        await _until(lambda: stream._credit == 0)
        assert len(stream._out) <= 65536
        rest = await asyncio.wait_for(reader.read(), 60)  # reading again finishes it
        assert len(first + rest) > BIG
        writer.close()
    finally:
        await tunnel.close()


async def _until(probe: Any) -> None:
    while not probe():
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_without_a_session_the_guest_refuses_at_once(guest: Guest) -> None:
    answer = await _request(guest, b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
    assert b"channel to the engine is not connected" in answer
    assert b"socat" not in answer and str(guest.agent.pid).encode() not in answer


@pytest.mark.asyncio
async def test_a_new_session_closes_the_old_sessions_connections(guest: Guest) -> None:
    first = _tunnel(guest.open_channel)
    assert await first.ready(60)
    reader, writer = await guest.connect()
    writer.write(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n")  # a head not finished: the stream waits
    await writer.drain()
    await _until(lambda: first.open_streams == 1)
    await first.close()
    second = _tunnel(guest.open_channel, proxy=EgressProxy())  # the engine's own policy
    try:
        assert await second.ready(60)
        with contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(reader.read(), 60) == b""
        writer.close()
        assert second.open_streams == 0
        answer = await _request(guest, b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 403 Forbidden"), answer
    finally:
        await second.close()


@pytest.mark.asyncio
async def test_the_guest_refuses_past_the_engines_cap(guest: Guest) -> None:
    tunnel = _tunnel(guest.open_channel, cap=3)
    try:
        assert await tunnel.ready(60)
        held = [await guest.connect() for _ in range(3)]
        await _until(lambda: tunnel.open_streams == 3)
        answer = await _request(guest, b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
        assert b"at most 3 at once per sandbox" in answer
        for _, writer in held:
            writer.close()
    finally:
        await tunnel.close()


# -- a hostile guest: raw frames on the channel --------------------------------------------


class RawGuest:
    """A channel server speaking the framing by hand, as guest code that took over the port
    could: it answers the HELLO, then sends whatever a test tells it to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.connections: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        self.connections = asyncio.Queue()
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self.connections.put((reader, writer))

        self.server = await asyncio.start_unix_server(accepted, str(self.path))

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(str(self.path))

    async def session(
        self, features: int = 0
    ) -> tuple[Decoder, asyncio.StreamReader, asyncio.StreamWriter, int]:
        """Accept the tunnel's next connection and answer its HELLO (saying ``features``):
        (decoder, reader, writer, the cap the engine announced)."""
        reader, writer = await asyncio.wait_for(self.connections.get(), 60)
        decoder = Decoder(channel.hello_prefix())
        frames = await read_frames(decoder, reader, 1)
        session, cap = frames[0].hello()
        writer.write(channel.hello(session, features))
        return decoder, reader, writer, cap


async def read_frames(decoder: Decoder, reader: asyncio.StreamReader, count: int) -> list[Any]:
    """The next ``count`` frames (repeated HELLOs skipped)."""
    frames: list[Any] = []
    while len(frames) < count:
        data = await asyncio.wait_for(reader.read(65536), 60)
        assert data, "the tunnel closed the channel"
        frames += [f for f in decoder.feed(data) if f.kind != HELLO or not frames]
    return frames


@pytest_asyncio.fixture
async def raw_guest(tmp_path: Path) -> AsyncIterator[RawGuest]:
    async with serving_raw_guest(tmp_path) as raw:
        yield raw


@contextlib.asynccontextmanager
async def serving_raw_guest(tmp_path: Path) -> AsyncIterator[RawGuest]:
    """A :class:`RawGuest` listening on a socket in ``tmp_path``."""
    guest = RawGuest(tmp_path / "raw.sock")
    await guest.start()
    yield guest
    assert guest.server is not None
    guest.server.close()


@pytest.mark.asyncio
async def test_two_thousand_streams_cost_at_most_the_cap(raw_guest: RawGuest) -> None:
    budget = StreamBudget(6)
    tunnels: list[EgressTunnel] = []
    try:
        for _ in range(2):  # one after the other: each takes the next connection
            tunnel = _tunnel(raw_guest.open, cap=4, budget=budget)
            tunnels.append(tunnel)
            decoder, reader, writer, cap = await raw_guest.session()
            assert cap == 4
            assert await tunnel.ready(60)
            writer.write(b"".join(pack(i, OPEN) for i in range(1, 2001)))
            refused = 2000 - (4 if len(tunnels) == 1 else 2)
            frames = await read_frames(decoder, reader, 3 * refused)
            closed = [f.stream for f in frames if f.kind == CLOSE]
            assert len(closed) == refused
            texts = {f.payload.split(b"\r\n", 1)[0] for f in frames if f.kind == DATA}
            assert texts == {b"HTTP/1.1 503 Service Unavailable"}
            assert {f.kind for f in frames} == {DATA, EOF, CLOSE}
            writer.write(pack(3000, DATA, b"x"))  # data for a stream it does not have
            (answer,) = await read_frames(decoder, reader, 1)
            assert (answer.stream, answer.kind) == (3000, CLOSE)
        assert [t.open_streams for t in tunnels] == [4, 2] and budget.used == 6
        message = next(f.payload for f in frames if f.kind == DATA)
        assert b"at most 6 at once for all sandboxes of this engine" in message
    finally:
        for tunnel in tunnels:
            await tunnel.close()
    assert budget.used == 0


class Stalled(EgressProxy):
    """A proxy that never reads its streams: the guest's window is all it may send."""

    async def serve(self, reader: Any, writer: Any) -> None:
        await asyncio.Event().wait()


@pytest.mark.parametrize(
    "garbage",
    [
        pack(1, 99),  # unknown kind
        channel.HEADER.pack(1, DATA, 2**31),  # a huge length
        pack(1, OPEN) + pack(1, OPEN),  # a stream opened twice
        pack(1, OPEN) + pack(1, DATA, b"x" * 65536) * 3,  # past the window
        channel.hello(1, 0),  # another session's HELLO
    ],
    ids=["kind", "length", "reopen", "window", "hello"],
)
@pytest.mark.asyncio
async def test_bad_frames_drop_the_channel_which_comes_back(
    raw_guest: RawGuest, garbage: bytes
) -> None:
    budget = StreamBudget(64)
    tunnel = _tunnel(raw_guest.open, budget=budget, proxy=Stalled())
    try:
        _, reader, writer, _ = await raw_guest.session()
        assert await tunnel.ready(60)
        writer.write(garbage)
        while await asyncio.wait_for(reader.read(65536), 60):
            pass  # the engine drops the channel ...
        await raw_guest.session()  # ... and connects again, with a new session
        await _until(lambda: tunnel.sessions == 2)
        assert budget.used == 0
    finally:
        await tunnel.close()


def test_the_decoder_skips_to_the_next_hello() -> None:
    """A guest restored in the middle of a frame, or a half-written frame of a killed engine:
    whatever comes before a HELLO is skipped, and an out-of-step parse finds the next one."""
    decoder = Decoder(channel.hello_prefix())
    hello = channel.hello(7, 64)
    frames = decoder.feed(b"\x00stale half frame" + hello[:10])
    assert frames == []
    (frame,) = decoder.feed(hello[10:] + pack(5, OPEN))[:1]
    assert frame.kind == HELLO and frame.hello() == (7, 64)
    # Synchronised, a stale DATA header eats the next HELLO; the next header is garbage.
    decoder = Decoder(channel.hello_prefix())
    decoder.feed(hello)
    with pytest.raises(FrameError):
        decoder.feed(channel.HEADER.pack(5, DATA, 20) + hello + b"\xff" * 9)
    decoder.resync()
    assert [f.kind for f in decoder.feed(hello + pack(9, OPEN))] == [HELLO, OPEN]
