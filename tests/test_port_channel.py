"""The host's streams to a port of the guest (``CONNECT``): the real agent on the host connects
them to its loopback (here the host's, where the test's origin listens), and a raw guest
shows what the engine does with an old agent and with answers it did not ask for."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from origin import OriginServer
from sandfork.agent.channel import CLOSE, CONNECT, FEATURE_CONNECT, HOST_STREAM, OPEN, pack
from sandfork.engine.egress_stream import TunnelStream
from sandfork.engine.egress_tunnel import PortUnreachable, StreamBudget
from test_egress_tunnel import (
    BODY,
    Guest,
    RawGuest,
    _tunnel,
    _until,
    read_frames,
    running_guest,
    serving_origin,
    serving_raw_guest,
)


@pytest.fixture(scope="module")
def origin() -> Iterator[OriginServer]:
    server = serving_origin()
    yield server
    server.close()


@pytest.fixture
def guest(tmp_path: Path) -> Iterator[Guest]:
    with running_guest(tmp_path) as running:
        yield running


@pytest_asyncio.fixture
async def raw_guest(tmp_path: Path) -> AsyncIterator[RawGuest]:
    async with serving_raw_guest(tmp_path) as raw:
        yield raw


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.asyncio
async def test_the_host_reaches_a_port_of_the_guest(guest: Guest, origin: OriginServer) -> None:
    budget = StreamBudget(64)
    tunnel = _tunnel(guest.open_channel, budget=budget)
    try:
        assert await tunnel.ready(60)
        streams = await asyncio.gather(*(tunnel.connect(origin.port) for _ in range(3)))
        for stream in streams:
            stream.write(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answers = await asyncio.gather(*(_read_all(stream) for stream in streams))
        for answer in answers:
            assert answer.startswith(b"HTTP/1.0 200")
            body = answer.split(b"\r\n\r\n", 1)[1]
            assert hashlib.sha256(body).digest() == hashlib.sha256(BODY).digest()
        for stream in streams:
            stream.close()
        with pytest.raises(PortUnreachable, match=r"nothing listens on port \d+"):
            await tunnel.connect(_free_port())
        await _until(lambda: tunnel.open_streams == 0)
        assert budget.used == 0
    finally:
        await tunnel.close()


async def _read_all(stream: TunnelStream) -> bytes:
    chunks = []
    while data := await stream.read(65536):
        chunks.append(data)
    return b"".join(chunks)


@pytest.mark.asyncio
async def test_an_old_agent_is_told_apart_and_unasked_answers_are_closed(
    raw_guest: RawGuest,
) -> None:
    tunnel = _tunnel(raw_guest.open)
    try:
        await raw_guest.session(features=0)  # an agent from before ports
        assert await tunnel.ready(60)
        with pytest.raises(PortUnreachable, match="predates ports"):
            await tunnel.connect(8000)
    finally:
        await tunnel.close()
    tunnel = _tunnel(raw_guest.open)
    try:
        decoder, reader, writer, _ = await raw_guest.session(features=FEATURE_CONNECT)
        assert await tunnel.ready(60)
        connecting = asyncio.create_task(tunnel.connect(8000))
        (asked,) = await read_frames(decoder, reader, 1)
        assert asked.kind == CONNECT and asked.stream & HOST_STREAM and asked.port == 8000
        writer.write(pack(HOST_STREAM | 77, OPEN))  # an answer to nothing the host asked
        (answer,) = await read_frames(decoder, reader, 1)
        assert (answer.stream, answer.kind) == (HOST_STREAM | 77, CLOSE)
        writer.write(pack(asked.stream, CLOSE))  # refused: nothing listens there
        with pytest.raises(PortUnreachable, match="nothing listens on port 8000"):
            await connecting
        assert tunnel.sessions == 1 and tunnel.open_streams == 0
    finally:
        await tunnel.close()


@pytest.mark.asyncio
async def test_a_guests_connect_is_ignored_and_the_caps_hold(raw_guest: RawGuest) -> None:
    budget = StreamBudget(64)
    tunnel = _tunnel(raw_guest.open, cap=2, budget=budget)
    try:
        decoder, reader, writer, _ = await raw_guest.session(features=FEATURE_CONNECT)
        assert await tunnel.ready(60)
        writer.write(pack(HOST_STREAM | 5, CONNECT, b"\x00\x16"))  # the guest asks for 22
        pending = [asyncio.create_task(tunnel.connect(8000)) for _ in range(2)]
        asked = await read_frames(decoder, reader, 2)
        assert [f.kind for f in asked] == [CONNECT, CONNECT]  # and nothing for the guest's
        with pytest.raises(PortUnreachable, match="too many connections"):
            await tunnel.connect(8000)
        for frame in asked:
            writer.write(pack(frame.stream, OPEN))
        streams = await asyncio.gather(*pending)
        assert tunnel.open_streams == 2 and budget.used == 2 and tunnel.sessions == 1
        for stream in streams:
            stream.close()
        assert tunnel.open_streams == 0 and budget.used == 0
    finally:
        await tunnel.close()
