"""One restored process's lazy memory as its userfaultfd sees it: which of its pages are still
to come, where each lies in its pages file, and the copies that put them in place.

A page is *wanted* until a copy put it in place (or found it there), or until the process
gave up its range (``madvise(MADV_DONTNEED)``, ``munmap``): a copy after that would bring old
contents back where the process expects zeros. So every ioctl on the userfaultfd and every
change the events make runs under :attr:`Memory.lock`, and the server reads a userfaultfd's
events under it too: a copy either comes before an event (the kernel makes it fail with
``EAGAIN`` while the event is unread) or sees its effect. Pages are known by their offset in
the pages file, which a remap does not change; their address is looked up at each copy.
"""

from __future__ import annotations

import bisect
import errno
import os
import threading

from sandfork.backends.container import uffd
from sandfork.backends.container.pagemap import PAGE, Run

FAULT_BLOCK = 64 * 1024  # read around a fault: the next faults are likely near


class Memory:
    """The lazy memory of the process behind the userfaultfd ``fd``; its pages are read from
    the file open at ``pages``."""

    def __init__(
        self, fd: int, pages: int, runs: list[Run], wanted: bytearray | None = None
    ) -> None:
        self.fd = fd
        self.pages = pages
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # events read: copies may go on
        self.gone = False  # the process (its memory) is no more
        self.closed = False  # its userfaultfd closed: the kernel zero-fills what is missing
        self._runs: list[Run] = []
        self._starts: list[int] = []
        self._by_offset: list[Run] = []
        self._offsets: list[int] = []
        self._set_runs(runs)
        if wanted is None:
            wanted = bytearray(max((r.offset + r.end - r.start for r in runs), default=0) // PAGE)
            for r in runs:
                wanted[r.offset // PAGE : (r.offset + r.end - r.start) // PAGE] = b"\1" * (
                    (r.end - r.start) // PAGE
                )
        self.wanted = wanted
        self.left = wanted.count(1)

    def child(self, fd: int) -> Memory:
        """The memory of a child forked with what this one still lacks (under the lock)."""
        return Memory(fd, self.pages, list(self._runs), bytearray(self.wanted))

    @property
    def done(self) -> bool:
        """Nothing more is to be done for it: every page in place, or the process gone."""
        return self.gone or self.left == 0

    def pieces(self, size: int) -> list[tuple[int, int]]:
        """Its pages' offsets in spans of at most ``size`` bytes, in the file's order."""
        out = []
        for r in self._by_offset:
            end = r.offset + r.end - r.start
            out += [(o, min(size, end - o)) for o in range(r.offset, end, size)]
        return out

    def wanted_span(self, offset: int, length: int) -> tuple[int, int] | None:
        """From the first to the last page still wanted in the span, or None (under the lock)."""
        first = self.wanted.find(1, offset // PAGE, (offset + length) // PAGE)
        if first < 0:
            return None
        last = self.wanted.rfind(1, first, (offset + length) // PAGE)
        return first * PAGE, (last + 1 - first) * PAGE

    def on_fault(self, address: int) -> tuple[int, int] | None:
        """The span of the pages file to read and :meth:`fill` for a fault at ``address``;
        None if the fault is answered already (with zeros, or a wake)."""
        page = address - address % PAGE
        while True:
            with self.lock:
                if self.closed or self.gone:
                    return None
                i = bisect.bisect_right(self._starts, page) - 1
                run = self._runs[i] if i >= 0 and page < self._runs[i].end else None
                offset = -1 if run is None else run.offset + page - run.start
                if run is None or not self.wanted[offset // PAGE]:
                    # A page nobody has, or one in place already (the copy woke the fault)
                    # or given up: zeros, or a wake.
                    error = uffd.zero(self.fd, page, PAGE)
                    if error == errno.EAGAIN:
                        self.changed.wait(0.05)
                        continue
                    if error == errno.EEXIST:
                        error = uffd.wake(self.fd, page, PAGE)
                    self._check(error, "UFFDIO_ZEROPAGE", page)
                    return None
                start = max(run.start, page - page % FAULT_BLOCK)
                end = min(run.end, start - start % FAULT_BLOCK + FAULT_BLOCK)
                return run.offset + start - run.start, end - start

    def fill(self, offset: int, length: int, source: int) -> None:
        """Copy the wanted pages of the file's ``offset`` to ``offset + length``, read into
        this process's memory at address ``source``, to where they belong."""
        with self.lock:
            while not self.closed and not self.gone and self._fill(offset, length, source):
                self.changed.wait(0.05)  # an event is unread: its effect first

    def forget(self, event: uffd.Message) -> None:
        """Apply a remove, unmap or remap event (under the lock)."""
        if event.event == uffd.EVENT_REMAP:
            self._cut(event.a, event.a + event.c, event.b - event.a)
            return
        if event.event == uffd.EVENT_REMOVE:
            # The range stays mapped: faults there are the kernel's own from now on.
            error = uffd.unregister(self.fd, event.a, event.b - event.a)
            if error == errno.ENOMEM:  # the process has gone
                self.gone = True
                return
            self._check(error, "UFFDIO_UNREGISTER", event.a)
        self._cut(event.a, event.b, None)

    def close(self) -> None:
        """Close its userfaultfd (under the lock)."""
        if not self.closed:
            self.closed = True
            os.close(self.fd)

    def _fill(self, offset: int, length: int, source: int) -> bool:
        """Copy what is wanted; True if an unread event stopped it."""
        end = offset + length
        i = max(bisect.bisect_right(self._offsets, offset) - 1, 0)
        for run in self._by_offset[i:]:
            if run.offset >= end:
                break
            lo, hi = max(offset, run.offset), min(end, run.offset + run.end - run.start)
            page, stop = lo // PAGE, hi // PAGE
            while page < stop:
                page = self.wanted.find(1, page, stop)
                if page < 0:
                    break
                last = self.wanted.find(0, page, stop)
                last = stop if last < 0 else last
                dst = run.start + page * PAGE - run.offset
                copied, error = uffd.copy(
                    self.fd, dst, source + page * PAGE - offset, (last - page) * PAGE
                )
                at = page + copied // PAGE
                if error == errno.EAGAIN:
                    self._unwant(page, at)
                    return True
                if error == errno.EEXIST:  # in place already
                    at += 1
                elif error == errno.ENOENT:  # no mapping there any more
                    at = last
                elif error:
                    self._check(error, "UFFDIO_COPY", dst)
                    if self.gone:
                        return False
                self._unwant(page, at)
                page = at
        return False

    def _check(self, error: int, what: str, address: int) -> None:
        if error in uffd.GONE:
            self.gone = True
        elif error not in (0, errno.EEXIST, errno.ENOENT):
            raise OSError(error, f"{what} at {address:#x}: {os.strerror(error)}")

    def _unwant(self, first: int, end: int) -> None:
        if end > first:
            self.left -= self.wanted.count(1, first, end)
            self.wanted[first:end] = bytes(end - first)

    def _cut(self, start: int, end: int, shift: int | None) -> None:
        """Take ``start``..``end`` out of the runs: moved by ``shift``, or given up."""
        runs = []
        for run in self._runs:
            lo, hi = max(start, run.start), min(end, run.end)
            if lo >= hi:
                runs.append(run)
                continue
            if run.start < lo:
                runs.append(Run(run.start, lo, run.offset))
            if hi < run.end:
                runs.append(Run(hi, run.end, run.offset + hi - run.start))
            moved = Run(lo, hi, run.offset + lo - run.start)
            if shift is None:
                self._unwant(moved.offset // PAGE, (moved.offset + hi - lo) // PAGE)
            else:
                runs.append(Run(lo + shift, hi + shift, moved.offset))
        self._set_runs(runs)

    def _set_runs(self, runs: list[Run]) -> None:
        self._runs = sorted(runs, key=lambda r: r.start)
        self._starts = [r.start for r in self._runs]
        self._by_offset = sorted(runs, key=lambda r: r.offset)
        self._offsets = [r.offset for r in self._by_offset]
