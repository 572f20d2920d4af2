"""A fetched file written as it is read (:mod:`sandfork.store.lazy_file`): a read fetches
only the chunks it covers, a chunk is fetched once however many read it at once, and reads
racing the fill end with the exact file. Real chunk stores in a folder, real threads."""

from __future__ import annotations

import collections
import os
import random
import threading
from pathlib import Path

import pytest

from sandfork.store.cache import ChunkCache
from sandfork.store.chunks import ChunkStore
from sandfork.store.lazy_file import LazyFile
from sandfork.store.manifest import CHUNK_SIZE, PAGE, ZERO, Entry
from sandfork.store.objects import FolderObjects

KEY = "k" * 32


class Counted:
    """The chunk store's fetch, counting each chunk fetched."""

    def __init__(self, store: ChunkStore) -> None:
        self.store = store
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def __call__(self, digest: str) -> bytes:
        with self._lock:
            self.counts[digest] += 1
        return self.store.chunk(digest)


def stored(tmp_path: Path, data: bytes) -> tuple[Entry, ChunkStore]:
    """``data`` uploaded as one file; its manifest entry and the store."""
    store = ChunkStore(FolderObjects(tmp_path / "bucket"), ChunkCache(tmp_path / "c", 0), KEY)
    (tmp_path / "src").write_bytes(data)
    entry = store.upload("s", {"f": tmp_path / "src"}, {}).manifest.entries[0]
    return entry, store


def sparse(path: Path, size: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    return fd


@pytest.fixture
def data() -> bytes:
    """Six chunks' worth of pages, a run of zero pages among them, a short last page."""
    rng = random.Random(7)
    pages = [rng.randbytes(PAGE) for _ in range(6 * CHUNK_SIZE // PAGE)]
    pages[100:300] = [bytes(PAGE)] * 200
    return b"".join(pages) + b"tail"


def test_a_read_fetches_only_the_chunks_it_covers(tmp_path: Path, data: bytes) -> None:
    entry, store = stored(tmp_path, data)
    fetch = Counted(store)
    fd = sparse(tmp_path / "dest", entry.size)
    lazy = LazyFile(entry, fd, fetch)
    middle = 3 * CHUNK_SIZE + 12345
    lazy.ensure(middle, 3 * PAGE)
    chunks = {d for d, _, _ in entry.spans if d != ZERO}
    assert len(fetch.counts) == 1 and len(chunks) > 4  # one of several
    assert os.pread(fd, 3 * PAGE, middle) == data[middle : middle + 3 * PAGE]
    assert os.pread(fd, PAGE, 5 * CHUNK_SIZE) == bytes(PAGE)  # not fetched: still a hole
    assert not lazy.complete
    lazy.fill()
    assert lazy.complete
    assert (tmp_path / "dest").read_bytes() == data
    assert max(fetch.counts.values()) == 1  # the fill skipped what the read had placed
    os.close(fd)


def test_readers_of_one_chunk_at_once_fetch_it_once(tmp_path: Path, data: bytes) -> None:
    entry, store = stored(tmp_path, data)
    fetch = Counted(store)
    fd = sparse(tmp_path / "dest", entry.size)
    lazy = LazyFile(entry, fd, fetch)
    start = threading.Barrier(8)

    def reader(page: int) -> None:
        start.wait()
        lazy.ensure(2 * CHUNK_SIZE + page * PAGE, PAGE)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert list(fetch.counts.values()) == [1]
    at = 2 * CHUNK_SIZE
    assert os.pread(fd, 8 * PAGE, at) == data[at : at + 8 * PAGE]
    os.close(fd)


def test_readers_racing_the_fill_see_the_files_bytes_and_it_ends_whole(
    tmp_path: Path, data: bytes
) -> None:
    entry, store = stored(tmp_path, data)
    fetch = Counted(store)
    fd = sparse(tmp_path / "dest", entry.size)
    lazy = LazyFile(entry, fd, fetch)
    start = threading.Barrier(9)
    wrong: list[int] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        for _ in range(40):
            offset = rng.randrange(entry.size)
            length = min(rng.randrange(1, 3 * PAGE), entry.size - offset)
            lazy.ensure(offset, length)
            if os.pread(fd, length, offset) != data[offset : offset + length]:
                wrong.append(offset)

    def filler() -> None:
        start.wait()
        lazy.fill()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    threads.append(threading.Thread(target=filler))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"reads at {wrong[:5]} saw bytes not yet written"
    assert (tmp_path / "dest").read_bytes() == data
    assert set(fetch.counts) == {d for d, _, _ in entry.spans if d != ZERO}
    # The readers share one fetch per chunk; the fill, which takes no lock, may add one.
    assert max(fetch.counts.values()) <= 2
    os.close(fd)
