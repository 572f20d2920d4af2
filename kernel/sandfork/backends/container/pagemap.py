"""Where a process's lazy memory lies in a CRIU image: its ``pagemap-PID.img`` and
``mm-PID.img`` read for the ranges of addresses whose pages ``criu restore --lazy-pages``
leaves to a lazy-pages server, and the offset of each range's pages in ``pages-N.img``.

A CRIU image file is eight bytes of magic, then entries, each a little-endian ``u32`` length
and a protobuf message (``images/pagemap.proto``, ``mm.proto``, ``vma.proto``). Only the few
fields read here are decoded; the files come from a snapshot and may be hostile, so anything
out of shape is an :class:`ImageError`, never a wrong range.
"""

from __future__ import annotations

import itertools
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PAGE = mmap.PAGESIZE
PE_PARENT, PE_LAZY, PE_PRESENT = 1, 2, 4  # criu/include/pagemap.h
_ADDRESS_LIMIT = 1 << 57  # beyond any user address, with five-level page tables
_LENGTH = struct.Struct("<I")


class ImageError(ValueError):
    """An image file that is not what CRIU writes."""


@dataclass(frozen=True)
class Run:
    """Lazy pages at ``start``..``end`` (within one mapping), the first at ``offset`` in the
    process's pages file."""

    start: int
    end: int
    offset: int


def lazy_runs(images: Path, pid: int) -> tuple[Path, list[Run]]:
    """The pages file of the imaged process ``pid`` and its lazy runs, by address; each run
    lies within one of its mappings, as ``UFFDIO_COPY`` needs."""
    entries = _entries(images / f"pagemap-{pid}.img")
    head = next(entries, None)
    if head is None:
        raise ImageError(f"pagemap-{pid}.img has no head")
    pages_id = _fields(head).get(1, 0)
    vmas = _mappings(images / f"mm-{pid}.img")
    runs: list[Run] = []
    offset = 0
    for entry in entries:
        fields = _fields(entry)
        start = fields.get(1, 0)
        count = fields.get(5, fields.get(2, 0))
        flags = fields.get(4, PE_PRESENT)
        if flags & PE_PARENT:
            raise ImageError("pages in a parent image are not served lazily")
        if start % PAGE or count > _ADDRESS_LIMIT // PAGE or start + count * PAGE > _ADDRESS_LIMIT:
            raise ImageError(f"pagemap-{pid}.img: a bad entry at {start:#x}")
        if not flags & PE_PRESENT:
            continue
        if flags & PE_LAZY:
            runs += _within(vmas, Run(start, start + count * PAGE, offset))
        offset += count * PAGE
    runs.sort(key=lambda r: r.start)
    if any(a.end > b.start for a, b in itertools.pairwise(runs)):
        raise ImageError(f"pagemap-{pid}.img: entries overlap")
    return images / f"pages-{pages_id}.img", runs


def _within(vmas: list[tuple[int, int]], run: Run) -> Iterator[Run]:
    """``run`` cut at the mappings' bounds; pages outside every mapping are an error."""
    start = run.start
    for vma_start, vma_end in vmas:
        if start >= run.end:
            return
        if vma_end <= start:
            continue
        if vma_start > start:
            break
        end = min(run.end, vma_end)
        yield Run(start, end, run.offset + start - run.start)
        start = end
    if start < run.end:
        raise ImageError(f"lazy pages at {start:#x} lie in no mapping")


def _mappings(path: Path) -> list[tuple[int, int]]:
    mm = next(_entries(path), None)
    if mm is None:
        raise ImageError(f"{path.name} is empty")
    vmas = []
    for vma in _repeated(mm, 14):
        fields = _fields(vma)
        vmas.append((fields.get(1, 0), fields.get(2, 0)))
    return sorted(vmas)


def _entries(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    position = 8  # the image's magic
    while position < len(data):
        if position + 4 > len(data):
            raise ImageError(f"{path.name} ends inside an entry")
        (length,) = _LENGTH.unpack_from(data, position)
        position += 4
        if position + length > len(data):
            raise ImageError(f"{path.name} ends inside an entry")
        yield data[position : position + length]
        position += length


def _fields(message: bytes) -> dict[int, int]:
    """The message's integer fields (the last of each number)."""
    return {number: value for number, value in _decode(message) if isinstance(value, int)}


def _repeated(message: bytes, number: int) -> Iterator[bytes]:
    for field, value in _decode(message):
        if field == number and isinstance(value, bytes):
            yield value


def _decode(message: bytes) -> Iterator[tuple[int, int | bytes]]:
    position = 0
    while position < len(message):
        key, position = _varint(message, position)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, position = _varint(message, position)
            yield number, value
        elif kind == 2:
            length, position = _varint(message, position)
            if position + length > len(message):
                raise ImageError("a field runs past its message")
            yield number, message[position : position + length]
            position += length
        elif kind in (1, 5):
            size = 8 if kind == 1 else 4
            if position + size > len(message):
                raise ImageError("a field runs past its message")
            yield number, int.from_bytes(message[position : position + size], "little")
            position += size
        else:
            raise ImageError(f"unknown protobuf wire type {kind}")


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise ImageError("a bad varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position
