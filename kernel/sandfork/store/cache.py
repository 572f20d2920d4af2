"""A bounded local cache of chunks, least recently used out first.

Chunks a host fetched stay on its disk, so restoring another snapshot that shares them (a
later checkpoint of the same sandbox, a sibling of the same template) reads them locally.
Each chunk is a file named by its hash; the order of use is the files' modification times
(set strictly increasing: the file system's clock is coarser than a burst of uses), so it
survives a restart.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

from sandfork.store.manifest import CHUNK_SIZE


class Cache(Protocol):
    """Where a fetch looks for a chunk before the bucket, and keeps what it fetched."""

    def get(self, digest: str) -> bytes | None:
        """The chunk ``digest`` if this cache has it (unchecked)."""

    def put(self, digest: str, data: bytes) -> None:
        """Keep a chunk the caller checked."""


class CacheView:
    """Another process's :class:`ChunkCache`, read and never written (it alone bounds it)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get(self, digest: str) -> bytes | None:
        """The chunk ``digest`` if the cache has it now."""
        try:
            return (self.root / digest).read_bytes()
        except (FileNotFoundError, ValueError):
            return None

    def put(self, digest: str, data: bytes) -> None:
        """Nothing: the owner of the cache decides what it keeps."""


class ChunkCache:
    """At most ``max_bytes`` of chunks in the folder ``root`` (0: nothing is kept)."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._sizes: OrderedDict[str, int] = OrderedDict()  # oldest use first
        self._total = 0
        self._clock = 0  # the last use's time, in ns
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = []
        for entry in os.scandir(root):
            if entry.name.startswith("."):
                os.unlink(entry.path)  # a write cut short by a crash
                continue
            st = entry.stat()
            found.append((st.st_mtime_ns, entry.name, st.st_size))
        for mtime, name, size in sorted(found):
            self._sizes[name] = size
            self._total += size
            self._clock = max(self._clock, mtime)
        with self._lock:
            self._evict()

    @property
    def size(self) -> int:
        """Bytes the cached chunks take."""
        return self._total

    def get(self, digest: str) -> bytes | None:
        """The chunk ``digest`` if cached (it becomes the most recently used)."""
        with self._lock:
            if digest not in self._sizes:
                return None
            self._sizes.move_to_end(digest)
            used = self._tick()
        path = self.root / digest
        try:
            data = path.read_bytes()
            os.utime(path, ns=(used, used))
        except FileNotFoundError:
            return None
        return data

    def _tick(self) -> int:
        self._clock = max(time.time_ns(), self._clock + 1)
        return self._clock

    def put(self, digest: str, data: bytes) -> None:
        """Keep a chunk (checked by the caller), evicting the least recently used."""
        if len(data) > min(self.max_bytes, CHUNK_SIZE):
            return
        tmp = self.root / f".{digest}.{threading.get_ident()}"
        tmp.write_bytes(data)
        with self._lock:
            used = self._tick()
            os.utime(tmp, ns=(used, used))
            tmp.rename(self.root / digest)
            self._total += len(data) - self._sizes.get(digest, 0)
            self._sizes[digest] = len(data)
            self._sizes.move_to_end(digest)
            self._evict()

    def _evict(self) -> None:
        while self._sizes and self._total > self.max_bytes:
            digest, size = self._sizes.popitem(last=False)
            self._total -= size
            (self.root / digest).unlink(missing_ok=True)
