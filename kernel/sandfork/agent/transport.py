"""Byte links to the host: the guest's virtio-serial port, a container's pipes, or a Unix
socket for host tests.

A transport carries raw bytes to a :class:`Receiver` (the agent's JSON lines through
:class:`LineReceiver`, the egress channel's frames) and shares the same semantics on both
links: when the host goes away queued output is dropped, the receiver is told, and the link
waits for the host to come back; nothing else (kernels, running commands) is affected.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

DEFAULT_PORT = "/dev/virtio-ports/sandfork.agent"
EGRESS_PORT = "/dev/virtio-ports/sandfork.egress"
_PORTS_DIR = "/dev/virtio-ports/"
_PORTS_SYSFS = "/sys/class/virtio-ports"

_READ_SIZE = 1 << 16
# How often a disconnected virtio port is polled for the host's return; the port reports
# "readable" (EOF) continuously while the host is away, so it cannot simply be watched.
_HOST_POLL_S = 0.02
_OPEN_RETRY_S = 0.5


class Receiver(Protocol):
    """What a transport delivers to: the host's arrival, its bytes, its departure."""

    def connection_made(self) -> None:
        """A host connected (again): input from an earlier one is over."""

    def data_received(self, data: bytes) -> None:
        """Bytes from the host."""

    def connection_lost(self) -> None:
        """The host went away (or the transport closed)."""

    def drained(self) -> None:
        """Every queued byte has been written to the host."""


class LineReceiver:
    """A :class:`Receiver` that hands on complete, non-blank lines; a partial line is
    dropped when the host changes."""

    def __init__(self, on_line: Callable[[bytes], None]) -> None:
        self._on_line = on_line
        self._inbuf = bytearray()

    def connection_made(self) -> None:
        self._inbuf.clear()

    def connection_lost(self) -> None:
        self._inbuf.clear()

    def drained(self) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        self._inbuf += data
        if b"\n" not in data:
            return
        *lines, rest = self._inbuf.split(b"\n")
        self._inbuf = bytearray(rest)
        for line in lines:
            if line.strip():
                self._on_line(bytes(line))


class Transport:
    """A duplex byte link that queues output without blocking.

    Subclasses obtain the file descriptor and decide what to do when the host goes away.
    """

    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver
        self._loop = asyncio.get_running_loop()
        self._fd: int | None = None
        self._out_fd: int | None = None  # where output goes: ``_fd`` itself but for pipes
        self._outq: collections.deque[memoryview] = collections.deque()
        self._queued = 0
        self._writing = False

    @property
    def backlog(self) -> int:
        """Bytes queued for the host and not yet written."""
        return self._queued

    @property
    def connected(self) -> bool:
        """True while a host is connected."""
        return self._fd is not None

    def start(self) -> None:
        """Begin serving; the link keeps (re)connecting until closed."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop serving and release the link."""
        self._detach()

    def send(self, data: bytes) -> None:
        """Queue one complete frame; dropped if no host is connected."""
        if self._fd is None:
            return
        self._outq.append(memoryview(data))
        self._queued += len(data)
        if not self._writing:
            self._flush()

    def discard_output(self) -> None:
        """Drop every queued byte not yet written (a frame may be cut short)."""
        if self._out_fd is not None and self._writing:
            self._loop.remove_writer(self._out_fd)
        self._outq.clear()
        self._queued = 0
        self._writing = False

    def _attach(self, fd: int, out_fd: int | None = None) -> None:
        self._fd = fd
        self._out_fd = fd if out_fd is None else out_fd
        self._loop.add_reader(fd, self._on_readable)
        self._receiver.connection_made()

    def _detach(self) -> None:
        """Forget the connected fd together with its pending output; tell the receiver."""
        attached = self._fd is not None
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
        if self._out_fd is not None:
            self._loop.remove_writer(self._out_fd)
        self._fd = self._out_fd = None
        self._outq.clear()
        self._queued = 0
        self._writing = False
        if attached:
            self._receiver.connection_lost()

    def _host_lost(self) -> None:
        raise NotImplementedError

    def _on_readable(self) -> None:
        if self._fd is None:
            return
        try:
            data = os.read(self._fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            log.debug("read failed: %s", exc)
            data = b""
        if not data:
            self._host_lost()
            return
        self._receiver.data_received(data)

    def _flush(self) -> None:
        fd = self._out_fd
        while self._outq and fd is not None:
            chunk = self._outq[0]
            try:
                written = os.write(fd, chunk)
            except BlockingIOError:
                written = 0
            except OSError as exc:
                log.debug("write failed: %s", exc)
                self._host_lost()
                return
            self._queued -= written
            if written < len(chunk):
                self._outq[0] = chunk[written:]
                if not self._writing:
                    self._writing = True
                    self._loop.add_writer(fd, self._flush)
                return
            self._outq.popleft()
        if self._writing and fd is not None:
            self._loop.remove_writer(fd)
        self._writing = False
        if fd is not None:
            self._receiver.drained()


class VirtioPort(Transport):
    """The guest end of the virtio-serial port.

    read() returning EOF or EIO means the host side is not connected; while it is away the
    port is polled every 20 ms, and a read that would block means the host is back.
    """

    def __init__(self, path: str, receiver: Receiver) -> None:
        super().__init__(receiver)
        self._path = path
        self._port_fd: int | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False

    def start(self) -> None:
        """Open the port (retrying until the device appears) and start serving."""
        try:
            path = _port_device(self._path)
            self._port_fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("cannot open %s (%s); retrying", self._path, exc)
            self._retry = self._loop.call_later(_OPEN_RETRY_S, self.start)
            return
        self._poll_host()

    def close(self) -> None:
        """Stop polling and close the port."""
        self._closed = True
        super().close()
        if self._retry is not None:
            self._retry.cancel()
        if self._port_fd is not None:
            os.close(self._port_fd)
            self._port_fd = None

    def _host_lost(self) -> None:
        log.info("host disconnected from %s", self._path)
        self._detach()
        self._retry = self._loop.call_later(_HOST_POLL_S, self._poll_host)

    def _poll_host(self) -> None:
        if self._closed or self._port_fd is None:
            return
        try:
            data = os.read(self._port_fd, _READ_SIZE)
        except BlockingIOError:
            data = None
        except OSError:
            data = b""
        if data == b"":
            self._retry = self._loop.call_later(_HOST_POLL_S, self._poll_host)
            return
        log.info("host connected to %s", self._path)
        self._attach(self._port_fd)
        if data:
            self._receiver.data_received(data)


def _port_device(path: str) -> str:
    """``path``, or for a ``/dev/virtio-ports/<name>`` link the guest init has not made (a
    port announced after it looked) the port's device found by its name in sysfs."""
    if os.path.exists(path) or not path.startswith(_PORTS_DIR):
        return path
    name = path[len(_PORTS_DIR) :]
    with os.scandir(_PORTS_SYSFS) as entries:
        for entry in entries:
            try:
                with open(os.path.join(entry.path, "name")) as f:
                    if f.read().strip() == name:
                        return f"/dev/{entry.name}"
            except OSError:
                continue
    return path


class UnixListener(Transport):
    """A listening Unix socket serving one host connection at a time (for tests on the host)."""

    def __init__(self, path: str, receiver: Receiver) -> None:
        super().__init__(receiver)
        self._path = path
        self._server: socket.socket | None = None
        self._conn: socket.socket | None = None

    def start(self) -> None:
        """Bind the socket (replacing a stale one) and start accepting."""
        if os.path.exists(self._path):
            os.unlink(self._path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self._path)
        server.listen(8)
        server.setblocking(False)
        self._server = server
        self._loop.add_reader(server.fileno(), self._accept)

    def close(self) -> None:
        """Close the connection and the listening socket."""
        self._drop_connection()
        if self._server is not None:
            self._loop.remove_reader(self._server.fileno())
            self._server.close()
            self._server = None
            try:
                os.unlink(self._path)
            except OSError:
                pass

    def _accept(self) -> None:
        if self._server is None:
            return
        try:
            conn, _ = self._server.accept()
        except BlockingIOError:
            return
        conn.setblocking(False)
        self._conn = conn
        # Further clients wait in the backlog until this one goes away.
        self._loop.remove_reader(self._server.fileno())
        self._attach(conn.fileno())
        log.info("host connected")

    def _drop_connection(self) -> None:
        self._detach()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _host_lost(self) -> None:
        log.info("host disconnected")
        self._drop_connection()
        if self._server is not None:
            self._loop.add_reader(self._server.fileno(), self._accept)


class PipePair(Transport):
    """A container sandbox's channel: a pipe from the host and one to it, which its shim
    holds, so the host never seems to leave (the shim drops output while no engine is
    connected; the egress channel's HELLO marks a new session all the same)."""

    def __init__(self, fds: tuple[int, int], receiver: Receiver) -> None:
        super().__init__(receiver)
        self._fds = fds

    def start(self) -> None:
        """Serve on the pipes."""
        for fd in self._fds:
            os.set_blocking(fd, False)
        self._attach(*self._fds)

    def _host_lost(self) -> None:
        log.warning("the host's pipe closed: the sandbox's shim is gone")
        self._detach()
