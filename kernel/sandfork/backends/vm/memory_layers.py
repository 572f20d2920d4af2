"""Guest memory images in chains: full images QEMU maps, and deltas over them.

A *full image* is a raw file the size of guest RAM, sparse (zero pages are holes), that a VM
maps privately: restoring costs the same whatever the memory size, and every VM mapping one
image shares its unchanged pages in the page cache. A *delta* holds only the pages that
differ from the layer below it, each distinct page once (zero pages and repeated pages take
no room), in this format (little-endian)::

    header  (one page): magic, page size, RAM pages, entries, stored pages
    numbers int64[entries]   page numbers, ascending
    slots   int64[entries]   where each page's data is (-1: a zero page)
    data    (page aligned)   the stored pages

A chain is a list of layers, top first, ending with a full image; an empty chain is all
zeros. Which layer is a delta is the engine's record, never read from a file the guest's data
could have shaped. Every layer is immutable once written: a mapped image must never change.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from sandfork.backends.vm.process_memory import PAGE, PageNumbers, Pages, runs
from sandfork.crashpoints import crash_point

MAGIC = b"SFMEMDL1"
_HEADER = struct.Struct("<8sIQQQ")
Mask = npt.NDArray[np.bool_]
_BLOCK = 16384  # pages compared or written per step: bounds temporary memory

#: A capture is written as a full image once the deltas above the chain's full image would
#: hold more than this: restoring then maps it instead of writing that much into each VM.
FULL_IMAGE_BYTES = 128 * 2**20
#: Deltas above a full image, at most; a deeper capture squashes them into one.
MAX_DELTAS = 4


@dataclass(frozen=True)
class Delta:
    """One delta file, its index read into memory and its data mapped."""

    numbers: PageNumbers
    slots: PageNumbers
    data: Pages

    @classmethod
    def open(cls, path: Path, ram_pages: int) -> Delta:
        """Read the delta at ``path``, checking it fits a guest of ``ram_pages`` pages."""
        with path.open("rb") as f:
            magic, page, pages, entries, stored = _HEADER.unpack(f.read(_HEADER.size))
        if magic != MAGIC or page != PAGE or pages != ram_pages:
            raise ValueError(f"{path} is not a memory delta of a {ram_pages}-page guest")
        index = np.fromfile(path, dtype="<i8", count=2 * entries, offset=PAGE)
        numbers, slots = index[:entries], index[entries:]
        offset = _data_offset(entries)
        data = (
            np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(stored, PAGE))
            if stored
            else np.zeros((0, PAGE), dtype=np.uint8)
        )
        if len(numbers) != entries or (entries and (numbers.min() < 0 or numbers.max() >= pages)):
            raise ValueError(f"{path} is damaged")
        if entries and (slots.max() >= stored or slots.min() < -1):
            raise ValueError(f"{path} is damaged")
        return cls(numbers, slots, data)

    def pages(self, which: Mask) -> Pages:
        """The data of the entries ``which`` selects (zero pages as zeros)."""
        slots = self.slots[which]
        out = np.zeros((len(slots), PAGE), dtype=np.uint8)
        stored = slots >= 0
        out[stored] = self.data[slots[stored]]
        return out


def _data_offset(entries: int) -> int:
    return PAGE + -(-16 * entries // PAGE) * PAGE


class MemoryView:
    """Guest memory as a chain of layers describes it."""

    def __init__(self, chain: list[Path], ram_pages: int) -> None:
        self.ram_pages = ram_pages
        self.chain = chain
        self.base = chain[-1] if chain else None
        self.deltas = [Delta.open(p, ram_pages) for p in chain[:-1]]  # top first
        # For each page: which delta holds it (index into self.deltas, -1: the base).
        self.owner = np.full(ram_pages, -1, dtype=np.int16)
        for i, delta in reversed(list(enumerate(self.deltas))):
            self.owner[delta.numbers] = i
        self._base_pages = (
            np.memmap(self.base, dtype=np.uint8, mode="r", shape=(ram_pages, PAGE))
            if self.base is not None and ram_pages
            else None
        )

    def delta_numbers(self) -> PageNumbers:
        """The pages some delta of the chain holds."""
        return np.flatnonzero(self.owner >= 0).astype(np.int64)

    def gather(self, numbers: PageNumbers) -> Pages:
        """The contents of the pages ``numbers`` (ascending)."""
        out = np.zeros((len(numbers), PAGE), dtype=np.uint8)
        if self._base_pages is not None:
            for first, last in runs(numbers):  # slices copy far faster than fancy indexing
                start = int(numbers[first])
                out[first:last] = self._base_pages[start : start + last - first]
        owners = self.owner[numbers]
        for i, delta in enumerate(self.deltas):
            mine = owners == i
            if mine.any():
                entries = np.searchsorted(delta.numbers, numbers[mine])
                which = np.zeros(len(delta.numbers), dtype=bool)
                which[entries] = True
                out[mine] = delta.pages(which)
        return out


def write_capture(
    out: Path,
    numbers: PageNumbers,
    pages: Pages,
    chain: list[Path],
    ram_pages: int,
    *,
    full: bool = False,
) -> Path | None:
    """Store guest memory that is ``chain`` with ``pages`` written over the pages
    ``numbers``; returns the layer the new one lies over (``None``: a full image, always
    written when ``full``)."""
    view = MemoryView(chain, ram_pages)
    above = view.delta_numbers()
    if full or _mostly_changed(view, numbers, pages, len(above)):
        # Writing an unchanged page into a full image is harmless: skip the comparison.
        _write_full(out, view, numbers, pages, np.ones(len(numbers), dtype=bool))
        return None
    changed = _changed(view, numbers, pages)
    if view.base is None or (len(above) + int(changed.sum())) * PAGE > FULL_IMAGE_BYTES:
        _write_full(out, view, numbers, pages, changed)
        return None
    numbers, pages = numbers[changed], pages[changed]  # under FULL_IMAGE_BYTES
    if len(view.deltas) < MAX_DELTAS:
        _write_delta(out, numbers, pages, ram_pages)
        return chain[0]
    # Squash: one delta with every page the chain's deltas and this capture hold.
    older = np.setdiff1d(above, numbers, assume_unique=True)
    merged = np.concatenate((older, numbers))
    order = np.argsort(merged, kind="stable")
    data = np.concatenate((view.gather(older), pages))[order]
    _write_delta(out, merged[order], data, ram_pages)
    return view.base


def restore_pages(chain: list[Path], ram_pages: int) -> tuple[PageNumbers, Pages]:
    """What a VM mapping the chain's full image must have written over it: the pages the
    chain's deltas hold (ascending), each as the newest delta holding it has it."""
    view = MemoryView(chain, ram_pages)
    numbers = view.delta_numbers()
    return numbers, view.gather(numbers)


def materialize(out: Path, chain: list[Path], ram_pages: int) -> None:
    """Write the memory ``chain`` describes as one full image."""
    view = MemoryView(chain, ram_pages)
    none = np.zeros(0, dtype=np.int64)
    _write_full(out, view, none, np.zeros((0, PAGE), dtype=np.uint8), none.astype(bool))


def _mostly_changed(view: MemoryView, numbers: PageNumbers, pages: Pages, above: int) -> bool:
    """True if a sample of the pages says that so many changed that the capture will be a
    full image anyway (twice the size that makes one, so a close call still compares)."""
    if view.base is None:
        return False  # zero pages are left out: compare
    sample = np.arange(0, len(numbers), 64)
    changed = _changed(view, numbers[sample], pages[sample])
    estimate = len(numbers) * float(changed.mean()) if len(sample) else 0.0
    return (above + estimate) * PAGE > 2 * FULL_IMAGE_BYTES


def _changed(view: MemoryView, numbers: PageNumbers, pages: Pages) -> Mask:
    changed = np.ones(len(numbers), dtype=bool)
    for at in range(0, len(numbers), _BLOCK):
        part = slice(at, at + _BLOCK)
        if view.base is None:
            changed[part] = pages[part].any(axis=1)
        else:
            before = view.gather(numbers[part]).view("<u8")
            changed[part] = (pages[part].view("<u8") != before).any(axis=1)
    return changed


def _write_delta(out: Path, numbers: PageNumbers, pages: Pages, ram_pages: int) -> None:
    slots, unique = _dedupe(pages)
    with out.open("xb") as f:
        f.write(_HEADER.pack(MAGIC, PAGE, ram_pages, len(numbers), len(unique)).ljust(PAGE, b"\0"))
        f.write(numbers.astype("<i8").tobytes())
        crash_point("snapshot.memory")
        f.write(slots.astype("<i8").tobytes())
        f.seek(_data_offset(len(numbers)))
        for at in range(0, len(unique), _BLOCK):
            f.write(pages[unique[at : at + _BLOCK]].tobytes())
        f.truncate()


def _dedupe(pages: Pages) -> tuple[PageNumbers, PageNumbers]:
    """Each page's slot (-1 for zero pages) and the rows to store, one per distinct page."""
    slots = np.full(len(pages), -1, dtype=np.int64)
    nonzero = np.flatnonzero(pages.any(axis=1))
    if not len(nonzero):
        return slots, nonzero
    # Candidates by a cheap fingerprint, confirmed byte for byte.
    words = pages[nonzero].view("<u8")
    fingerprint = words.sum(axis=1) ^ (words[:, 0] * np.uint64(0x9E3779B97F4A7C15))
    order = nonzero[np.argsort(fingerprint, kind="stable")]
    sorted_fp = np.sort(fingerprint, kind="stable")
    head = np.ones(len(order), dtype=bool)
    head[1:] = sorted_fp[1:] != sorted_fp[:-1]
    head_of = np.maximum.accumulate(np.where(head, np.arange(len(order)), 0))
    maybe = np.flatnonzero(~head)
    if len(maybe):
        same = (pages[order[maybe]] == pages[order[head_of[maybe]]]).all(axis=1)
        head[maybe[~same]] = True  # a fingerprint clash: the page is stored on its own
    keep = np.flatnonzero(head)
    slot_of_row = np.cumsum(head) - 1
    first = order[keep]
    row_slot = np.empty(len(order), dtype=np.int64)
    row_slot[head] = slot_of_row[head]
    row_slot[~head] = slot_of_row[head_of[~head]]
    slots[order] = row_slot
    return slots, first


def _write_full(
    out: Path, view: MemoryView, numbers: PageNumbers, pages: Pages, which: Mask
) -> None:
    """Write ``view`` with the pages ``which`` selects of ``pages`` over it, as a full image."""
    size = view.ram_pages * PAGE
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        if view.base is not None:
            _copy_data(view.base, fd, size)
            above = view.delta_numbers()
            for at in range(0, len(above), _BLOCK):
                part = above[at : at + _BLOCK]
                _put_pages(fd, part, view.gather(part), np.ones(len(part), dtype=bool))
        crash_point("snapshot.memory")
        for at in range(0, len(numbers), _BLOCK):
            block = slice(at, at + _BLOCK)  # slices: no copy of the (maybe gigabytes of) pages
            _put_pages(fd, numbers[block], pages[block], which[block])
    finally:
        os.close(fd)


def _copy_data(source: Path, fd: int, size: int) -> None:
    """Copy the data regions of a sparse file; its holes stay holes."""
    src = os.open(source, os.O_RDONLY)
    try:
        at = 0
        while at < size:
            try:
                start = os.lseek(src, at, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    return  # only a hole is left
                raise
            end = min(os.lseek(src, start, os.SEEK_HOLE), size)
            while start < end:
                try:
                    start += os.copy_file_range(src, fd, end - start, start, start)
                except OSError as e:
                    if e.errno != errno.EXDEV:
                        raise
                    os.lseek(fd, start, os.SEEK_SET)  # across file systems: sendfile
                    start += os.sendfile(fd, src, start, end - start)
            at = end
    finally:
        os.close(src)


_libc = ctypes.CDLL(None, use_errno=True)
_PUNCH_HOLE = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE


def _put_pages(fd: int, numbers: PageNumbers, pages: Pages, which: Mask) -> None:
    """Write the pages ``which`` selects at their places; zero pages become holes."""
    nonzero = pages.view("<u8").any(axis=1)
    for number in numbers[which & ~nonzero]:
        offset = int(number) * PAGE
        if _libc.fallocate(fd, _PUNCH_HOLE, ctypes.c_long(offset), ctypes.c_long(PAGE)) != 0:
            os.pwrite(fd, bytes(PAGE), offset)
    data = np.flatnonzero(which & nonzero)
    for first, last in runs(numbers[data]):
        start, end = int(data[first]), int(data[last - 1]) + 1  # consecutive rows too
        os.pwrite(fd, pages[start:end].data, int(numbers[start]) * PAGE)
