"""The lazy-pages server of a container restore, in place of ``criu lazy-pages``
(:func:`start`).

``criu restore --lazy-pages`` leaves each process's private anonymous memory missing and
registered with a userfaultfd, which it sends over ``WORK/lazy-pages.socket`` (a process's
pid as an ``int``, then its userfaultfd with ``SCM_RIGHTS``; a negative pid for a zombie),
then a word saying the restore has finished. This server then copies each page in when the
process touches it and, from the end of the restore, the rest in the background; it follows
the processes' forks, remaps and unmaps (``criu/uffd.c`` does the same), and exits once every
page is in place or its process gone.

Why not ``criu lazy-pages``: it is one thread, so a page fault waited behind the background
read under way, and with a snapshot fetched from the store (the pages file read through the
lazy server's mount, :mod:`sandfork.store.lazy_serve`) that read waits for a chunk fetch
(measured: most of a lazy restore's time to its first result went there). Here faults are
served by threads of their own, never behind the background copy.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import mmap
import os
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sandfork.backends.container import uffd
from sandfork.backends.container.lazy_memory import FAULT_BLOCK, Memory
from sandfork.backends.container.pagemap import lazy_runs
from sandfork.holdpoints import hold_point_sync

SOCKET = "lazy-pages.socket"
DONE = "lazy-pages.done"  # written beside the socket once every page is in place
FINISHED = 0x52535446  # LAZY_PAGES_RESTORE_FINISHED
PIECE = 1 << 20  # a background read
FAULT_THREADS = 8
BACKGROUND_THREADS = 2

log = logging.getLogger("sandfork.lazy_pages")


class LazyPages:
    """Serves the memory of the processes imaged in ``images`` to their restore."""

    def __init__(self, images: Path) -> None:
        self.images = images
        self._epoll = select.epoll()
        self._memories: dict[int, Memory] = {}  # by userfaultfd
        self._files: dict[Path, int] = {}
        self._work: collections.deque[tuple[Memory, int, int]] = collections.deque()
        self._lock = threading.Lock()  # the three above
        self._finished = threading.Event()  # the restore has finished
        self._failure: BaseException | None = None
        self._buffers = threading.local()
        self.faults = self.by_fault = self.in_background = 0

    def serve(self, listener: socket.socket) -> None:
        """Take the restore's connection on ``listener`` and serve until every page is in
        place; raises what made it fail."""
        connection, _ = listener.accept()
        listener.close()
        self._thread(self._receive, connection)
        for _ in range(BACKGROUND_THREADS):
            self._thread(self._background)
        with ThreadPoolExecutor(FAULT_THREADS, thread_name_prefix="fault") as faults:
            while self._failure is None:
                for fd, events in self._epoll.poll(0.1):
                    self._events(fd, events, faults)
                if self._retire():
                    break
        if self._failure is not None:
            raise self._failure

    def _receive(self, connection: socket.socket) -> None:
        while True:
            word = _exactly(connection, 4)
            if word is None:
                raise RuntimeError("the restore closed its socket before it finished")
            (pid,) = struct.unpack("<i", word)
            if pid == FINISHED:
                self._finished.set()
                return
            if pid < 0:  # a zombie: no memory
                continue
            _, fds, _, _ = socket.recv_fds(connection, 1, 1)
            if len(fds) != 1:
                raise RuntimeError(f"no userfaultfd came for process {pid}")
            path, runs = lazy_runs(self.images, pid)
            self._adopt(Memory(fds[0], self._open(path), runs))

    def _open(self, path: Path) -> int:
        with self._lock:
            if path not in self._files:
                self._files[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            return self._files[path]

    def _adopt(self, memory: Memory) -> None:
        with self._lock:
            self._memories[memory.fd] = memory
            self._work.extend((memory, o, n) for o, n in memory.pieces(PIECE))
            self._epoll.register(memory.fd, select.EPOLLIN)

    def _events(self, fd: int, events: int, faults: ThreadPoolExecutor) -> None:
        memory = self._memories.get(fd)
        if memory is None:
            return
        children = []
        addresses = []
        with memory.lock:
            if memory.closed:
                return
            if events & (select.EPOLLERR | select.EPOLLHUP):
                memory.gone = True
                return
            for message in uffd.read_messages(fd):
                if message.event == uffd.EVENT_PAGEFAULT:
                    addresses.append(message.a)
                elif message.event == uffd.EVENT_FORK:
                    children.append(memory.child(message.a))
                else:
                    memory.forget(message)
            memory.changed.notify_all()
        for child in children:
            self._adopt(child)
        self.faults += len(addresses)
        for address in addresses:
            faults.submit(self._guarded, self._fault, memory, address)

    def _fault(self, memory: Memory, address: int) -> None:
        span = memory.on_fault(address)
        if span is not None:
            read = self._copy(memory, *span)
            with self._lock:
                self.by_fault += read

    def _background(self) -> None:
        self._finished.wait()
        hold_point_sync("lazy.background")  # faults are served on
        while self._failure is None:
            with self._lock:
                item = self._work.popleft() if self._work else None
            if item is None:
                time.sleep(0.05)  # a fork may bring more
                continue
            memory, offset, length = item
            with memory.lock:
                span = None if memory.done else memory.wanted_span(offset, length)
            if span is not None:
                read = self._copy(memory, *span)
                with self._lock:
                    self.in_background += read

    def _copy(self, memory: Memory, offset: int, length: int) -> int:
        """Read the span of the pages file and fill the memory with it; the bytes read."""
        buffer, address = self._buffer()
        view = memoryview(buffer)
        done = 0
        while done < length:
            n = os.preadv(memory.pages, [view[done:length]], offset + done)
            if n == 0:
                raise RuntimeError(f"the pages file ends before {offset + length}")
            done += n
        memory.fill(offset, length, address)
        return length

    def _buffer(self) -> tuple[mmap.mmap, int]:
        found = getattr(self._buffers, "buffer", None)
        if found is None:
            buffer = mmap.mmap(-1, max(PIECE, FAULT_BLOCK))
            found = (buffer, _address(buffer))
            self._buffers.buffer = found
        return found

    def _retire(self) -> bool:
        """Close the userfaultfds of memories with nothing left to do; True once the restore
        has finished and none is left."""
        with self._lock:
            for fd, memory in list(self._memories.items()):
                with memory.lock:
                    if memory.done and self._finished.is_set():
                        self._epoll.unregister(fd)
                        memory.close()
                        del self._memories[fd]
            return self._finished.is_set() and not self._memories

    def _thread(self, work: Callable[..., None], *args: object) -> None:
        threading.Thread(target=self._guarded, args=(work, *args), daemon=True).start()

    def _guarded(self, work: Callable[..., None], *args: object) -> None:
        try:
            work(*args)
        except BaseException as e:
            if self._failure is None:
                self._failure = e


def _address(buffer: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def _exactly(connection: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        more = connection.recv(size - len(data))
        if not more:
            return None
        data += more
    return data


def start(images: Path, work: Path) -> int:
    """Start a server for the restore of ``images`` whose working folder is ``work``, forked
    from this process (whose modules are imported already: nothing waits for a new
    interpreter) with its socket listening before it returns; its pid."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    cwd = os.open(".", os.O_RDONLY | os.O_CLOEXEC)
    try:  # CRIU connects by the name relative to its working folder; a socket path is short
        os.chdir(work)
        Path(SOCKET).unlink(missing_ok=True)
        listener.bind(SOCKET)
    finally:
        os.fchdir(cwd)
        os.close(cwd)
    listener.listen(1)
    pid = os.fork()
    if pid:
        listener.close()
        return pid
    code = 1
    try:
        _serve_here(images.resolve(), work, listener)
        code = 0
    finally:
        os._exit(code)


def _serve_here(images: Path, work: Path, listener: socket.socket) -> None:
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, listener.fileno())  # nothing of the forking process's is held open
    os.closerange(listener.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
    handler = logging.FileHandler(work / "lazy.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    server = LazyPages(images)
    started = time.monotonic()
    try:
        server.serve(listener)
    except BaseException as e:
        log.error("lazy pages failed: %s: %s", type(e).__name__, e)
        raise
    log.info(
        "every page in place in %.2f s: %d faults, %.1f MiB read for them, %.1f MiB in the "
        "background",
        time.monotonic() - started,
        server.faults,
        server.by_fault / 2**20,
        server.in_background / 2**20,
    )
    (work / DONE).touch()
