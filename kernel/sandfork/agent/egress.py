"""The guest end of the egress channel: the sandbox's HTTP proxy address, ``127.0.0.1:3128``.

Every connection accepted there becomes a stream over one byte channel to the engine (the
``sandfork.egress`` virtio port in a VM; see :mod:`.channel` for the framing), where the
engine's proxy serves it. The other way, the engine's port proxy opens streams (``CONNECT``)
to a port of the guest's loopback: a server the sandbox runs, reached from the host without
the guest reaching anything. Nothing here interprets HTTP: the engine decides where a stream
may go. The guest only refuses locally, with a ``503``, what the engine would refuse anyway:
connections while no engine is connected, and connections past the engine's stream cap
(which the engine announces in its ``HELLO`` and enforces itself too).

When the engine (re)connects, or after a restore or fork, the streams of the old session
are over: every local connection of it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from .channel import (
    CLOSE,
    CONNECT,
    CREDIT,
    DATA,
    EOF,
    FEATURES,
    HELLO,
    HOST_STREAM,
    HOST_STREAM_WINDOW,
    MAX_PAYLOAD,
    OPEN,
    TO_GUEST_WINDOW,
    TO_HOST_WINDOW,
    Decoder,
    Frame,
    FrameError,
    credit,
    hello,
    hello_prefix,
    http_error,
    pack,
)
from .transport import Transport

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = ("127.0.0.1", 3128)
# Past this much output queued for the host, local connections are not read (backpressure).
_BACKLOG_HIGH = 1 << 20
# A connection that is over is half-closed first, and its input discarded for up to this
# long before it is closed: closing with unread input resets the connection, and the client
# may lose the answer (a 503) it was just sent. At most _MAX_LINGERING linger at once.
_LINGER_S = 2.0
_MAX_LINGERING = 256
_CONNECT_S = 10.0  # connecting to a port of the guest's own loopback
_LOOPBACK = ("127.0.0.1", "::1")


class EgressRelay:
    """Accepts local connections and relays each one as a stream of the channel."""

    def __init__(
        self, make_transport: Callable[[EgressRelay], Transport], address: tuple[str, int]
    ) -> None:
        self.transport = make_transport(self)
        self.address = address
        self._decoder = Decoder(hello_prefix())
        self._session: int | None = None
        self._max_streams = 0
        self._streams: dict[int, _LocalStream] = {}
        self._last_id = 0
        self._writable = asyncio.Event()
        self._writable.set()
        self._server: asyncio.Server | None = None
        self._lingering: set[asyncio.Task[None]] = set()
        self._connecting: dict[int, asyncio.Task[None]] = {}

    async def start(self) -> None:
        """Listen on :attr:`address` and start serving the channel."""
        self.transport.start()
        self._server = await asyncio.start_server(self._accept, *self.address)
        bound = self._server.sockets[0].getsockname()
        log.info("egress proxy listening on %s:%d", bound[0], bound[1])

    async def close(self) -> None:
        """Stop listening, close every local connection and the channel."""
        if self._server is not None:
            self._server.close()
        self._end_session()
        self.transport.close()

    # -- the channel (Receiver) ----------------------------------------------------------

    def connection_made(self) -> None:
        self._end_session()

    def connection_lost(self) -> None:
        self._end_session()

    def drained(self) -> None:
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except FrameError as e:
            log.warning("egress channel out of step (%s): waiting for the host's HELLO", e)
            self._end_session()
            return
        for frame in frames:
            self._on_frame(frame)

    def send(self, data: bytes) -> None:
        """Queue bytes for the host; past the high mark, local reading pauses."""
        self.transport.send(data)
        if self.transport.backlog > _BACKLOG_HIGH:
            self._writable.clear()

    async def writable(self) -> None:
        """Return once the channel's output backlog is low enough to read more."""
        await self._writable.wait()

    def forget(self, stream: _LocalStream) -> None:
        """Drop a stream that is over."""
        if self._streams.get(stream.id) is stream:
            del self._streams[stream.id]

    def _on_frame(self, frame: Frame) -> None:
        if frame.kind == HELLO:
            try:
                session, cap = frame.hello()
            except FrameError as e:
                log.warning("bad HELLO (%s)", e)
                self._end_session()
                return
            if session != self._session:
                self._close_streams()
                self.transport.discard_output()  # frames of the old session
                self._session, self._max_streams = session, cap
                log.info("egress session %016x (at most %d streams)", session, cap)
            self.send(hello(session, FEATURES))
        elif frame.kind == CONNECT:
            self._connect(frame.stream, frame.port)
        elif (stream := self._streams.get(frame.stream)) is not None:
            stream.on_frame(frame)
        # Anything for a stream this side no longer has is dropped: a CLOSE is never answered.

    def _end_session(self) -> None:
        self._session = None
        self._decoder.resync()
        self._close_streams()

    def _close_streams(self) -> None:
        for task in self._connecting.values():
            task.cancel()
        self._connecting.clear()
        for stream in list(self._streams.values()):
            stream.abort()
        self._streams.clear()
        self._writable.set()

    # -- local connections ---------------------------------------------------------------

    def linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Close a connection once its client has had the chance to read what it was sent."""
        if len(self._lingering) >= _MAX_LINGERING:
            writer.close()
            return
        task = asyncio.create_task(_linger(reader, writer))
        self._lingering.add(task)
        task.add_done_callback(self._lingering.discard)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._session is None:
            why = "the sandbox's channel to the engine is not connected"
        elif len(self._streams) >= self._max_streams:
            why = (
                f"too many connections through the proxy (at most {self._max_streams} at once "
                "per sandbox)"
            )
        else:
            why = ""
        if why:
            writer.write(http_error(503, "Service Unavailable", why))
            self.linger(reader, writer)
            return
        stream_id = self._last_id
        while stream_id == self._last_id or stream_id == 0 or stream_id in self._streams:
            stream_id = (stream_id + 1) & (HOST_STREAM - 1)
        self._last_id = stream_id
        stream = _LocalStream(self, stream_id, reader, writer)
        self._streams[stream_id] = stream
        self.send(pack(stream_id, OPEN))
        stream.start()

    def _connect(self, stream_id: int, port: int) -> None:
        """The host opens a stream to ``port`` of the guest's loopback: ``OPEN`` once
        connected, ``CLOSE`` when nothing listens there (or the stream cannot be)."""
        busy = len(self._streams) + len(self._connecting) >= self._max_streams
        taken = stream_id in self._streams or stream_id in self._connecting
        if self._session is None or not stream_id & HOST_STREAM or taken or busy or not port:
            self.send(pack(stream_id, CLOSE))
            return
        task = asyncio.create_task(self._open_local(stream_id, port, self._session))
        self._connecting[stream_id] = task
        task.add_done_callback(lambda done: self._connected(stream_id, done))

    def _connected(self, stream_id: int, task: asyncio.Task[None]) -> None:
        if self._connecting.get(stream_id) is task:
            del self._connecting[stream_id]

    async def _open_local(self, stream_id: int, port: int, session: int) -> None:
        for host in _LOOPBACK:
            try:
                opening = asyncio.open_connection(host, port)
                reader, writer = await asyncio.wait_for(opening, _CONNECT_S)
                break
            except (OSError, TimeoutError) as e:
                log.info("stream %d: cannot connect to %s port %d (%s)", stream_id, host, port, e)
        else:
            self.send(pack(stream_id, CLOSE))
            return
        if self._session != session:
            writer.close()
            return
        stream = _LocalStream(self, stream_id, reader, writer, HOST_STREAM_WINDOW)
        self._streams[stream_id] = stream
        self.send(pack(stream_id, OPEN))
        stream.start()


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        if writer.can_write_eof():
            writer.write_eof()
        await asyncio.wait_for(_discard(reader), _LINGER_S)
    except (OSError, TimeoutError):
        pass
    finally:
        writer.close()


async def _discard(reader: asyncio.StreamReader) -> None:
    while await reader.read(1 << 16):
        pass


class _LocalStream:
    """One accepted connection, relayed as stream ``id``."""

    def __init__(
        self,
        relay: EgressRelay,
        stream_id: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        window: int = TO_HOST_WINDOW,
    ) -> None:
        self.relay = relay
        self.id = stream_id
        self._reader = reader
        self._writer = writer
        # drain() returns only once everything written is in the socket: what the host may
        # send next is what has left this buffer.
        writer.transport.set_write_buffer_limits(high=0)
        self._credit = window  # bytes this side may still send
        self._has_credit = asyncio.Event()
        self._has_credit.set()
        self._unacked = 0  # bytes the host sent that are not in the socket yet
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Start relaying the local side's bytes to the host."""
        self._spawn(self._pump())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _pump(self) -> None:
        try:
            while True:
                await self._has_credit.wait()
                await self.relay.writable()
                data = await self._reader.read(min(MAX_PAYLOAD, self._credit))
                if not data:
                    self.relay.send(pack(self.id, EOF))
                    return
                self._credit -= len(data)
                if self._credit == 0:
                    self._has_credit.clear()
                self.relay.send(pack(self.id, DATA, data))
        except OSError:
            self._lost()

    def on_frame(self, frame: Frame) -> None:
        """A frame of this stream from the host."""
        if frame.kind == DATA:
            if self._unacked + len(frame.payload) > TO_GUEST_WINDOW:
                log.warning("stream %d: the host sent past its window", self.id)
                self._lost()
                return
            self._writer.write(frame.payload)
            self._unacked += len(frame.payload)
            if self._unacked == len(frame.payload):
                self._spawn(self._acknowledge())
        elif frame.kind == EOF:
            with contextlib.suppress(OSError):
                self._writer.write_eof()
        elif frame.kind == CLOSE:
            self.relay.forget(self)
            self._finish()
        elif frame.kind == CREDIT:
            self._credit += frame.credit
            self._has_credit.set()
        elif frame.kind == OPEN:
            log.warning("stream %d: OPEN from the host", self.id)
            self._lost()

    async def _acknowledge(self) -> None:
        """Grant the host what it sent, as it leaves the local socket's buffer."""
        try:
            while self._unacked:
                sent = self._unacked
                await self._writer.drain()
                self._unacked -= sent
                self.relay.send(credit(self.id, sent))
        except OSError:
            self._lost()

    def _lost(self) -> None:
        """The local side failed: tell the host and close."""
        self.relay.send(pack(self.id, CLOSE))
        self.relay.forget(self)
        self.abort()

    def _finish(self) -> None:
        """The host is done: close after what it sent has been written (and read)."""
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        self.relay.linger(self._reader, self._writer)

    def abort(self) -> None:
        """Close at once, dropping unsent bytes (the session is over)."""
        for task in list(self._tasks):
            task.cancel()
        self._writer.transport.abort()
