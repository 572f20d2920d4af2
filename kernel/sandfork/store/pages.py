"""A file's content as spans of chunks, page by page: a page stored before is referenced
where it lies, a zero page is a hole, and only the other pages are packed, in order, into
new chunks of up to :data:`~sandfork.store.manifest.CHUNK_SIZE`.

Why pages: two captures of one process a cell apart differ in pages scattered all over its
memory (a container's CRIU page images measured here: about 4 MiB of 58 MiB changed between
per-cell checkpoints, spread so that any chunking of 64 KiB or more found almost nothing
shared, fixed 4 MiB chunks a dedup ratio of 1.00 over six checkpoints, content-defined chunks
of 64 KiB on average 1.69, and pages 4.65). So a page is the unit of sharing and a chunk only
the unit of storage: what an upload knows is a :data:`PageIndex`, each page it stored by a hash
of its content, and a checkpoint's upload is given its sandbox's previous one. Without an
index (a first upload, another host, a restarted engine) the packing of a file depends only on
its content, so the same file still makes the same chunks, stored once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandfork.store.manifest import CHUNK_SIZE, PAGE, ZERO, Span

PageIndex = dict[bytes, tuple[str, int]]
"""A page's content hash -> the chunk that holds it and its offset there."""

_ZEROS = bytes(PAGE)


def page_hash(page: memoryview) -> bytes:
    """What the index knows a page by (its length is part of its content)."""
    return hashlib.blake2b(page, digest_size=16).digest()


@dataclass
class _Span:
    chunk: str | None  # None: the chunk being packed, named once it is stored
    offset: int
    length: int


class Packer:
    """Spans for the files of one upload; ``put`` stores a chunk (unless the bucket has
    it) and returns its SHA-256. :attr:`index` ends up holding every page of the upload."""

    def __init__(self, put: Callable[[bytes], str], known: PageIndex | None = None) -> None:
        self._put = put
        self._known = known or {}
        self.index: PageIndex = {}
        self._packing = bytearray()
        self._unnamed: list[_Span] = []  # spans in the chunk being packed
        self._pages: dict[bytes, int] = {}  # pages in the chunk being packed -> offset

    def spans(self, path: Path, progress: Callable[[int], None]) -> list[Span]:
        """The spans of the file at ``path`` (``progress`` gets the bytes read as it goes)."""
        out: list[_Span] = []
        with path.open("rb") as f:
            while block := f.read(CHUNK_SIZE):
                progress(len(block))  # before the block's chunk goes: it may stop the upload
                view = memoryview(block)
                for start in range(0, len(block), PAGE):
                    self._page(view[start : start + PAGE], out)
        self._flush()
        return [(str(s.chunk), s.offset, s.length) for s in out]

    def _page(self, page: memoryview, out: list[_Span]) -> None:
        if page == _ZEROS[: len(page)]:
            self._add(out, ZERO, 0, len(page))
            return
        key = page_hash(page)
        where = self.index.get(key) or self._known.get(key)
        if where is not None:
            self.index[key] = where  # the next upload knows every page of this one
            self._add(out, where[0], where[1], len(page))
        elif key in self._pages:
            self._add(out, None, self._pages[key], len(page))
        else:
            self._pages[key] = len(self._packing)
            self._add(out, None, len(self._packing), len(page))
            self._packing += page
            if len(self._packing) >= CHUNK_SIZE:
                self._flush()

    def _add(self, out: list[_Span], chunk: str | None, offset: int, length: int) -> None:
        last = out[-1] if out else None
        if last is not None and last.chunk == chunk:
            if chunk == ZERO or last.offset + last.length == offset:
                last.length += length
                return
        out.append(_Span(chunk, offset, length))
        if chunk is None:
            self._unnamed.append(out[-1])

    def _flush(self) -> None:
        if not self._packing:
            return
        digest = self._put(bytes(self._packing))
        for span in self._unnamed:
            span.chunk = digest
        for key, offset in self._pages.items():
            self.index[key] = (digest, offset)
        self._packing.clear()
        self._unnamed.clear()
        self._pages.clear()
