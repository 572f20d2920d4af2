"""Each sandbox's egress channel, on the engine's side: one connection, many streams.

The guest relays every connection to its proxy address as a stream of one byte channel
(framing: :mod:`sandfork.agent.channel`); an :class:`EgressTunnel` keeps that channel
connected (reconnecting after a loss, as after an engine restart or a VM restore), starts
each session with a ``HELLO``, and serves each stream with the
:class:`~sandfork.engine.egress.EgressProxy`. A guest's connections cost the engine no
process and no file descriptor: only the upstream connections the proxy opens, at most
``max_streams`` per sandbox and :class:`StreamBudget`'s limit in all; a stream past either
cap is answered ``503`` and closed at once.

The other way, :meth:`EgressTunnel.connect` opens a stream to a port of the guest's loopback
(``CONNECT``, for the port proxy): only the host opens those, and only to the port asked for.

The tunnel knows nothing of QEMU: it is handed a coroutine that opens the channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable

from sandfork.agent.channel import (
    CLOSE,
    CREDIT,
    DATA,
    EOF,
    FEATURE_CONNECT,
    HELLO,
    HOST_STREAM,
    HOST_STREAM_WINDOW,
    OPEN,
    Decoder,
    Frame,
    FrameError,
    connect,
    hello,
    hello_prefix,
    http_error,
    pack,
)
from sandfork.engine.egress import EgressProxy
from sandfork.engine.egress_stream import TunnelStream

log = logging.getLogger(__name__)

Opener = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]

# Until the guest echoes it, the HELLO is sent again after each of these delays (the last
# repeating): a restored guest may have eaten the first, and a create waits for the echo.
_HELLO_REPEAT_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
_RETRY_S = (0.02, 1.0)  # reconnect delay: first, and most after repeated failures
_READ_SIZE = 1 << 16


class PortUnreachable(Exception):
    """A stream to a port of the guest could not be opened; the message says why."""


class StreamBudget:
    """How many streams all sandboxes together may have open."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self) -> bool:
        """Reserve one stream; ``False`` when none is left."""
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        """Return one stream."""
        self.used -= 1


class EgressTunnel:
    """The engine's end of one sandbox's egress channel."""

    def __init__(
        self,
        name: str,
        opener: Opener,
        proxy: EgressProxy,
        budget: StreamBudget,
        max_streams: int,
    ) -> None:
        self.name = name
        self._opener = opener
        self._proxy = proxy
        self._budget = budget
        self.max_streams = max_streams
        # A guest's stream has the task serving it; a host's, the future of the guest's answer.
        self._streams: dict[int, tuple[TunnelStream, asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._writer: asyncio.StreamWriter | None = None  # the session's, once it is up
        self._features = 0  # what the guest's agent said it can do (its HELLO)
        self._next_host_id = 0
        self.sessions = 0  # sessions established so far (a new one after each reconnect)
        self.refused = 0  # streams refused at a cap so far

    @property
    def open_streams(self) -> int:
        """Streams open now."""
        return len(self._streams)

    def start(self) -> None:
        """Start (and keep) connecting in the background."""
        self._task = asyncio.create_task(self._run(), name=f"egress {self.name}")

    async def ready(self, timeout: float) -> bool:
        """Wait until a session is up (the guest answered the ``HELLO``); ``False`` if not
        within ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), timeout)
        return self._ready.is_set()

    async def connect(self, port: int) -> TunnelStream:
        """A stream to ``port`` of the guest's loopback (what a server there answers), once
        the guest connected it; :class:`PortUnreachable` when it cannot."""
        writer = self._writer
        if writer is None or not self._ready.is_set():
            raise PortUnreachable("the sandbox's channel to the engine is not connected")
        if not self._features & FEATURE_CONNECT:
            raise PortUnreachable(
                "the sandbox's agent predates ports (a template built before them): rebuild it"
            )
        if len(self._streams) >= self.max_streams or not self._budget.take():
            raise PortUnreachable("too many connections to or from this sandbox at once")
        self._next_host_id = (self._next_host_id + 1) % HOST_STREAM
        stream_id = HOST_STREAM | self._next_host_id
        stream = TunnelStream(stream_id, writer.write, self._closed, HOST_STREAM_WINDOW)
        answered = asyncio.get_running_loop().create_future()
        self._streams[stream_id] = (stream, answered)
        writer.write(connect(stream_id, port))
        try:
            await answered
        except asyncio.CancelledError:
            if not stream.closed:  # the caller was cancelled: the guest did not answer yet
                stream.close()
                raise
            if self._writer is not writer:
                raise PortUnreachable("the sandbox's channel was lost") from None
            raise PortUnreachable(f"nothing listens on port {port} in the sandbox") from None
        return stream

    async def close(self) -> None:
        """Disconnect and drop every stream."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        delay = _RETRY_S[0]
        while True:
            try:
                reader, writer = await self._opener()
            except OSError as e:
                log.debug("sandbox %s: egress channel not open (%s)", self.name, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_S[1])
                continue
            try:
                await self._session(reader, writer)
                delay = _RETRY_S[0]
            except FrameError as e:
                log.warning("sandbox %s: dropping its egress channel: %s", self.name, e)
                delay = _RETRY_S[1]  # a guest that keeps sending garbage reconnects slowly
            except (OSError, asyncio.IncompleteReadError) as e:
                log.info("sandbox %s: egress channel lost (%s)", self.name, e)
            finally:
                self._ready.clear()
                self._writer = None
                await self._drop_streams()
                writer.close()
            await asyncio.sleep(delay)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = secrets.randbits(64)
        decoder = Decoder(hello_prefix(session))
        self._features = 0
        repeat = asyncio.create_task(self._repeat_hello(writer, session))
        try:
            while data := await reader.read(_READ_SIZE):
                for frame in decoder.feed(data):
                    if not self._ready.is_set():  # the first frame is the guest's echo
                        repeat.cancel()
                        self._features = frame.hello()[1] if frame.kind == HELLO else 0
                        self._writer = writer
                        self._ready.set()
                        self.sessions += 1
                        log.info("sandbox %s: egress session %016x", self.name, session)
                    self._on_frame(frame, session, writer)
                await writer.drain()  # the guest does not read: stop reading it
        finally:
            repeat.cancel()

    async def _repeat_hello(self, writer: asyncio.StreamWriter, session: int) -> None:
        for delay in itertools.chain(_HELLO_REPEAT_S, itertools.repeat(_HELLO_REPEAT_S[-1])):
            writer.write(hello(session, self.max_streams))
            await asyncio.sleep(delay)

    def _on_frame(self, frame: Frame, session: int, writer: asyncio.StreamWriter) -> None:
        kind, stream_id = frame.kind, frame.stream
        if kind == HELLO:
            if frame.hello()[0] != session:
                raise FrameError("HELLO of another session")
            return  # the echo of a repeated HELLO
        if kind == OPEN and stream_id & HOST_STREAM:  # the guest connected a host's stream
            entry = self._streams.get(stream_id)
            if entry is None:  # given up on meanwhile
                writer.write(pack(stream_id, CLOSE))
            elif entry[1].done():
                raise FrameError(f"stream {stream_id} opened twice")
            else:
                entry[1].set_result(None)
            return
        if kind == OPEN:
            self._open(stream_id, writer)
            return
        entry = self._streams.get(stream_id)
        if entry is None:
            if kind in (DATA, EOF):
                writer.write(pack(stream_id, CLOSE))
            return
        stream = entry[0]
        if kind == DATA:
            stream.feed(frame.payload)
        elif kind == EOF:
            stream.feed_eof()
        elif kind == CREDIT:
            stream.grant(frame.credit)
        elif kind == CLOSE:
            stream.closed_by_guest()
            entry[1].cancel()

    def _open(self, stream_id: int, writer: asyncio.StreamWriter) -> None:
        if stream_id in self._streams:
            raise FrameError(f"stream {stream_id} opened twice")
        if len(self._streams) >= self.max_streams:
            why = f"at most {self.max_streams} at once per sandbox"
        elif not self._budget.take():
            why = f"at most {self._budget.limit} at once for all sandboxes of this engine"
        else:
            stream = TunnelStream(stream_id, writer.write, self._closed)
            task = asyncio.create_task(self._proxy.serve(stream, stream))
            self._streams[stream_id] = (stream, task)
            return
        self.refused += 1
        if self.refused == 1 or self.refused % 1000 == 0:  # a flood is logged, not each one
            log.warning(
                "sandbox %s: egress stream refused (%d so far): %s", self.name, self.refused, why
            )
        message = f"too many connections through the proxy ({why})"
        writer.write(pack(stream_id, DATA, http_error(503, "Service Unavailable", message)))
        writer.write(pack(stream_id, EOF) + pack(stream_id, CLOSE))

    def _closed(self, stream: TunnelStream) -> None:
        entry = self._streams.get(stream.id)
        if entry is not None and entry[0] is stream:
            del self._streams[stream.id]
            self._budget.give()

    async def _drop_streams(self) -> None:
        entries = list(self._streams.values())
        for stream, task in entries:
            stream.closed_by_guest()
            task.cancel()
        await asyncio.gather(*(task for _, task in entries), return_exceptions=True)


class EgressTunnels:
    """The egress tunnels of one engine: one per running sandbox, one budget for all."""

    def __init__(self, proxy: EgressProxy, max_streams_per_sandbox: int, max_streams: int):
        self.proxy = proxy
        self.max_streams_per_sandbox = max_streams_per_sandbox
        self.budget = StreamBudget(max_streams)

    def open(self, name: str, opener: Opener) -> EgressTunnel:
        """Start the tunnel of sandbox ``name``, whose channel ``opener`` opens."""
        tunnel = EgressTunnel(name, opener, self.proxy, self.budget, self.max_streams_per_sandbox)
        tunnel.start()
        return tunnel
