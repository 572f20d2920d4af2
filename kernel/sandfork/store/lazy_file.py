"""A file of a fetched snapshot written as it is read: each chunk of it lands in the local
file the first time a read needs it, and a fill writes the rest, in order, behind the reads.

A chunk is placed whole (every span of the file that comes from it), once, under a lock of
its own: two readers of one chunk fetch it once, and a reader never waits for a chunk it does
not need. The fill takes no lock: it runs at low priority when nothing reads, and a reader
must never wait for it (it fetches the chunk itself instead; a chunk written twice is the same
bytes twice). A chunk counts as placed only once written. Zero spans are the local file's
holes from the start.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable

from sandfork.store.manifest import ZERO, Entry, span_bytes

Fetch = Callable[[str], bytes]  # a chunk by its hash, checked


class LazyFile:
    """The file ``entry`` being written into ``fd`` (open for writing, ``entry.size`` long,
    sparse) from the chunks ``fetch`` returns."""

    def __init__(self, entry: Entry, fd: int, fetch: Fetch) -> None:
        self.entry = entry
        self.fd = fd
        self._fetch = fetch
        self._starts: list[int] = []  # where each span begins in the file
        self._chunks: list[str] = []  # the chunk of each span
        self._places: dict[str, list[tuple[int, int, int]]] = {}  # chunk -> its spans
        offset = 0
        for digest, start, length in entry.spans:
            self._starts.append(offset)
            self._chunks.append(digest)
            if digest != ZERO:
                self._places.setdefault(digest, []).append((offset, start, length))
            offset += length
        self._locks = {digest: threading.Lock() for digest in self._places}
        self._placed: set[str] = set()

    @classmethod
    def opened(cls, path: str, entry: Entry, fetch: Fetch) -> LazyFile:
        """The file ``entry`` being written at ``path`` (made ``entry.size`` long, sparse,
        before: :func:`~sandfork.store.tree.materialise` leaves it so)."""
        return cls(entry, os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC), fetch)

    @property
    def complete(self) -> bool:
        """Whether every chunk is in the local file."""
        return len(self._placed) == len(self._places)

    def ensure(self, offset: int, length: int) -> None:
        """Return once the bytes ``offset`` to ``offset + length`` are in the local file."""
        i = max(bisect.bisect_right(self._starts, offset) - 1, 0)
        end = offset + length
        while i < len(self._starts) and self._starts[i] < end:
            if self._chunks[i] != ZERO:
                self._place(self._chunks[i])
            i += 1

    def fill(self, before: Callable[[], None] = lambda: None) -> None:
        """Place every chunk not placed yet, in the file's order (``before`` runs before
        each: a check to stop, or a test's hold), then flush the file to the disk."""
        for digest in self._places:
            before()
            if digest not in self._placed:
                self._write(digest, self._fetch(digest))
        os.fsync(self.fd)

    def _place(self, digest: str) -> None:
        if digest in self._placed:
            return
        with self._locks[digest]:
            if digest not in self._placed:
                self._write(digest, self._fetch(digest))

    def _write(self, digest: str, data: bytes) -> None:
        """Write the spans of the chunk ``digest`` unless they are in."""
        if digest not in self._placed:
            for offset, start, length in self._places[digest]:
                span = span_bytes(f"a span of {self.entry.name!r}", data, start, length)
                if span is not None:
                    os.pwrite(self.fd, span, offset)
            self._placed.add(digest)
