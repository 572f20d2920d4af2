"""One stream of a sandbox's egress channel, as the proxy sees it: a reader and a writer.

Flow control is by window (docs/agent-protocol.md, "Egress channel"): the guest may send
:data:`~sandfork.agent.channel.TO_HOST_WINDOW` bytes on a stream beyond what the proxy has
read, and the proxy sends no more than the guest has granted
(:data:`~sandfork.agent.channel.TO_GUEST_WINDOW` ahead). So a stream holds at most one window
of input and one write of output, whichever side stops reading.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sandfork.agent.channel import (
    CLOSE,
    DATA,
    EOF,
    MAX_PAYLOAD,
    TO_GUEST_WINDOW,
    TO_HOST_WINDOW,
    FrameError,
    credit,
    pack,
)
from sandfork.engine.egress import HEAD_LIMIT

Send = Callable[[bytes], None]


class TunnelStream:
    """Stream ``id`` of a channel; ``send`` queues frames on the channel, ``on_close`` is
    called once when the stream is over (either side)."""

    def __init__(
        self,
        stream_id: int,
        send: Send,
        on_close: Callable[[TunnelStream], None],
        window: int = TO_HOST_WINDOW,
    ):
        self.id = stream_id
        self._window = window  # what the guest may send beyond what was read
        self._send = send
        self._on_close = on_close
        self._in = bytearray()
        self._in_eof = False
        self._unread = 0  # bytes received that the guest has not been granted back
        self._out = bytearray()
        self._credit = TO_GUEST_WINDOW  # bytes the guest lets us send
        self._eof_pending = False
        self.closed = False
        self._changed = asyncio.Event()  # input arrived, credit granted, or closed

    # -- frames from the guest -------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Bytes the guest sent; past the window is a protocol violation."""
        if self._in_eof:
            raise FrameError(f"stream {self.id}: DATA after EOF")
        self._unread += len(data)
        if self._unread > self._window:
            raise FrameError(f"stream {self.id}: the guest sent past its window")
        self._in += data
        self._changed.set()

    def feed_eof(self) -> None:
        """The guest sends no more."""
        self._in_eof = True
        self._changed.set()

    def grant(self, count: int) -> None:
        """The guest consumed ``count`` more bytes."""
        self._credit = min(self._credit + count, 2**31)
        self._flush()
        self._changed.set()

    def closed_by_guest(self) -> None:
        """The guest's side is gone: nothing more is sent, readers see the end."""
        self._finish(send_close=False)

    # -- the proxy's reader ----------------------------------------------------------------

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (``-1``: what is buffered); ``b""`` at the end."""
        while not self._in and not self._in_eof and not self.closed:
            await self._wait()
        size = len(self._in) if n < 0 else min(n, len(self._in))
        return self._take(size)

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        """Bytes up to and including ``separator`` within :data:`HEAD_LIMIT`."""
        while True:
            at = self._in.find(separator)
            if at >= 0:
                return self._take(at + len(separator))
            if len(self._in) > HEAD_LIMIT:
                raise asyncio.LimitOverrunError("separator not found within the limit", 0)
            if self._in_eof or self.closed:
                raise asyncio.IncompleteReadError(bytes(self._in), None)
            await self._wait()

    def _take(self, size: int) -> bytes:
        data = bytes(self._in[:size])
        del self._in[:size]
        if size and not self.closed:
            self._unread -= size
            self._send(credit(self.id, size))
        return data

    # -- the proxy's writer ----------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the guest (sent as its window allows)."""
        if self.closed:
            return
        self._out += data
        self._flush()

    async def drain(self) -> None:
        """Wait until everything written has been sent; raises once the stream is closed."""
        while self._out and not self.closed:
            await self._wait()
        if self.closed:
            raise ConnectionResetError(f"egress stream {self.id} is closed")

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        """Half-close once the queued data is sent."""
        self._eof_pending = True
        self._flush()

    def close(self) -> None:
        """The proxy is done: send what the window allows, then ``CLOSE``."""
        self._flush()
        self._finish(send_close=True)

    def _flush(self) -> None:
        while self._out and self._credit > 0 and not self.closed:
            size = min(len(self._out), self._credit, MAX_PAYLOAD)
            self._send(pack(self.id, DATA, bytes(self._out[:size])))
            del self._out[:size]
            self._credit -= size
        if self._eof_pending and not self._out and not self.closed:
            self._eof_pending = False
            self._send(pack(self.id, EOF))
        if not self._out:
            self._changed.set()

    def _finish(self, *, send_close: bool) -> None:
        if self.closed:
            return
        self.closed = True
        self._out.clear()
        if send_close:
            self._send(pack(self.id, CLOSE))
        self._changed.set()
        self._on_close(self)

    async def _wait(self) -> None:
        self._changed.clear()
        await self._changed.wait()
