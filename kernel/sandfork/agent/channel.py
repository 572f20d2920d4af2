"""The egress channel's framing: many TCP streams multiplexed over one byte channel.

Shared by the guest (``egress.py``) and the engine (``sandfork.engine.egress_tunnel``), and
standard library only, like the rest of the agent. See docs/agent-protocol.md, "Egress channel".

A frame is a 9-byte header, ``stream`` (u32), ``kind`` (u8), ``length`` (u32), all big-endian,
then ``length`` bytes of payload (at most :data:`MAX_PAYLOAD`). A session starts with the
host's ``HELLO`` and the guest's echo of it; a reader that is not in a session yet (or has lost
track of the framing) skips every byte until it sees the start of a ``HELLO``, so bytes left
over from an earlier session (a restored guest's buffers, a half-written frame of a killed
engine) are never taken for frames.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER = struct.Struct(">IBI")
MAX_PAYLOAD = 64 * 1024
TO_GUEST_WINDOW = 1024 * 1024
"""Bytes the engine may send on one stream before the guest grants more (``CREDIT``): the
guest buffers them, so a download is not held to one small window per round trip."""
TO_HOST_WINDOW = 128 * 1024
"""Bytes the guest may send on one stream before the engine grants more: what the engine
buffers per stream at most (it has many sandboxes' streams to hold)."""
HOST_STREAM_WINDOW = 1024 * 1024
"""The same, on a stream the host opened (``CONNECT``): a port's server answering a request of
the engine's, whose download is not to be held to one small window per round trip."""

HELLO = 0  # stream 0: MAGIC, an 8-byte session id, then u32 (host: its stream cap; guest: FEATURES)
OPEN = 1  # guest -> host: a new stream (a connection accepted in the guest), or CONNECT's answer
DATA = 2  # payload: 1 to MAX_PAYLOAD bytes of the stream, counted against the window
EOF = 3  # the sender sends no more data on the stream (TCP half-close)
CLOSE = 4  # the stream is gone; data for a stream the receiver does not know gets a CLOSE
CREDIT = 5  # payload: u32, bytes the sender consumed; the other side may send that many more
CONNECT = 6  # host -> guest: a stream to the guest's loopback port (u16); answered OPEN or CLOSE
KINDS = frozenset({HELLO, OPEN, DATA, EOF, CLOSE, CREDIT, CONNECT})

HOST_STREAM = 0x80000000
"""The bit of every stream id the host opens (``CONNECT``); the guest's ids never have it."""
FEATURE_CONNECT = 1
"""A bit of the guest's ``HELLO`` number: it answers ``CONNECT`` (an older agent's is 0)."""
FEATURES = FEATURE_CONNECT

MAGIC = b"SFKEGRS1"
_HELLO_BODY = struct.Struct(">8sQI")
_U32 = struct.Struct(">I")
_PORT = struct.Struct(">H")
_FIXED = {HELLO: _HELLO_BODY.size, OPEN: 0, EOF: 0, CLOSE: 0, CREDIT: _U32.size, CONNECT: 2}


class FrameError(ValueError):
    """Bytes that are not a valid frame: the session is lost."""


@dataclass(frozen=True)
class Frame:
    """One decoded frame."""

    stream: int
    kind: int
    payload: bytes = b""

    @property
    def credit(self) -> int:
        """The byte count of a ``CREDIT`` frame."""
        value: int = _U32.unpack(self.payload)[0]
        return value

    @property
    def port(self) -> int:
        """The port of a ``CONNECT`` frame."""
        value: int = _PORT.unpack(self.payload)[0]
        return value

    def hello(self) -> tuple[int, int]:
        """(session id, number) of a ``HELLO`` frame."""
        magic, session, number = _HELLO_BODY.unpack(self.payload)
        if magic != MAGIC:
            raise FrameError("HELLO without the magic")
        return session, number


def pack(stream: int, kind: int, payload: bytes = b"") -> bytes:
    """One frame as bytes."""
    return HEADER.pack(stream, kind, len(payload)) + payload


def credit(stream: int, count: int) -> bytes:
    """A ``CREDIT`` frame granting ``count`` more bytes on ``stream``."""
    return pack(stream, CREDIT, _U32.pack(count))


def connect(stream: int, port: int) -> bytes:
    """A ``CONNECT`` frame opening ``stream`` to the guest's ``port``."""
    return pack(stream, CONNECT, _PORT.pack(port))


def hello(session: int, number: int) -> bytes:
    """A ``HELLO`` frame of session ``session``."""
    return pack(0, HELLO, _HELLO_BODY.pack(MAGIC, session, number))


def hello_prefix(session: int | None = None) -> bytes:
    """The bytes every ``HELLO`` (of ``session``, if given) starts with."""
    head = HEADER.pack(0, HELLO, _HELLO_BODY.size) + MAGIC
    return head if session is None else head + session.to_bytes(8, "big")


class Decoder:
    """Incremental frame parser that (re)synchronises on a ``HELLO``.

    Unsynchronised (at first, and after :meth:`resync`), input is skipped up to the first
    occurrence of ``sync`` (the start of a ``HELLO``); after that, frames are parsed and a
    malformed header raises :class:`FrameError`. At most one partial frame is buffered.
    """

    def __init__(self, sync: bytes) -> None:
        self._sync = sync
        self._buf = bytearray()
        self.synced = False

    def resync(self, sync: bytes | None = None) -> None:
        """Drop buffered input and skip to the next ``HELLO`` (starting with ``sync``)."""
        if sync is not None:
            self._sync = sync
        self._buf.clear()
        self.synced = False

    def feed(self, data: bytes) -> list[Frame]:
        """The complete frames ``data`` finishes; raises :class:`FrameError` on garbage."""
        self._buf += data
        frames: list[Frame] = []
        while True:
            if not self.synced:
                at = self._buf.find(self._sync)
                if at < 0:
                    del self._buf[: max(0, len(self._buf) - len(self._sync) + 1)]
                    return frames
                del self._buf[:at]
                self.synced = True
            if len(self._buf) < HEADER.size:
                return frames
            stream, kind, length = HEADER.unpack_from(self._buf)
            _check(stream, kind, length)
            end = HEADER.size + length
            if len(self._buf) < end:
                return frames
            frames.append(Frame(stream, kind, bytes(self._buf[HEADER.size : end])))
            del self._buf[:end]


def _check(stream: int, kind: int, length: int) -> None:
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if length > MAX_PAYLOAD:
        raise FrameError(f"frame of {length} bytes (at most {MAX_PAYLOAD})")
    fixed = _FIXED.get(kind)
    if fixed is not None and length != fixed:
        raise FrameError(f"frame kind {kind} with {length} bytes of payload (needs {fixed})")
    if kind == DATA and length == 0:
        raise FrameError("empty DATA frame")
    if (stream == 0) != (kind == HELLO):
        raise FrameError(f"frame kind {kind} on stream {stream}")


def http_error(status: int, reason: str, message: str) -> bytes:
    """A complete HTTP/1.1 error response whose body is ``message`` (the proxy's refusals)."""
    body = f"sandfork egress proxy: {message}\n".encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body
