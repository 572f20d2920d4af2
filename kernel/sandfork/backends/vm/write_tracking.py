"""Which guest pages a QEMU process wrote since the engine last looked.

QEMU runs with ``write_protect.c`` preloaded: its guest RAM mapping is registered with a
userfaultfd in asynchronous write-protect mode, so the kernel marks each page written as it
is written and nothing else changes. ``PAGEMAP_SCAN`` on ``/proc/PID/pagemap`` then lists
the pages written since the last scan and protects them again, atomically, from the engine's
process. A capture costs the pages written since the previous capture, not every page written
since the image was mapped. Linux 6.7 or later; elsewhere, or when the library cannot be
built, :func:`preload_library` is ``None`` and captures compare pages instead.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np

from sandfork.backends.vm.process_memory import PAGE, PageNumbers, RamMapping
from sandfork.paths import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("write_protect.c")
IMAGE_VARIABLE = "SANDFORK_TRACK_IMAGE"  # the memory image whose mapping the library registers

# <linux/fs.h> of Linux 6.7 (newer than Debian 12's headers).
_PAGEMAP_SCAN = 0xC0606610  # _IOWR('f', 16, struct pm_scan_arg)
_WP_MATCHING = 1 << 0  # protect the pages that match, in the same walk
_CHECK_WPASYNC = 1 << 1  # fail unless the range is registered for asynchronous protection
_PAGE_IS_WRITTEN = 1 << 1
_REGIONS = 4096  # page_region entries per ioctl


class _ScanArgs(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "size",
            "flags",
            "start",
            "end",
            "walk_end",
            "vec",
            "vec_len",
            "max_pages",
            "category_inverted",
            "category_mask",
            "category_anyof_mask",
            "return_mask",
        )
    ]


@functools.cache
def preload_library() -> Path | None:
    """The preload library, built once per source and machine under the cache folder;
    ``None`` (logged) if no C compiler is installed or the build fails."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler: guest page tracking is off (captures compare pages)")
        return None
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + platform.machine().encode()).hexdigest()[:16]
    out = cache_dir() / "preload" / key / "libsandfork-write-protect.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    command = [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(tmp), str(SOURCE), "-ldl"]
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    if built.returncode != 0:
        tmp.unlink(missing_ok=True)
        log.warning("guest page tracking is off: building %s failed: %s", SOURCE, built.stderr)
        return None
    tmp.rename(out)
    return out


def preload_environment(image: Path) -> dict[str, str]:
    """What QEMU's environment needs for its mapping of ``image`` to be tracked (nothing if
    the library is unavailable)."""
    library = preload_library()
    if library is None:
        return {}
    return {"LD_PRELOAD": str(library), IMAGE_VARIABLE: str(image)}


class WriteTracker:
    """The pages of one process's guest RAM mapping written since the last :meth:`take`."""

    def __init__(self, ram: RamMapping) -> None:
        self.ram = ram

    def available(self) -> bool:
        """True if the mapping is registered for tracking (the library did its job)."""
        try:
            self._scan(protect=False)
        except OSError:
            return False
        return True

    def arm(self) -> bool:
        """Track the writes from now on (what was written before is forgotten); False if
        the mapping is not registered for tracking."""
        if not self.available():
            return False
        self.take()
        return True

    def written(self) -> PageNumbers:
        """The pages written since the last :meth:`take`, leaving them marked."""
        return self._scan(protect=False)

    def take(self) -> PageNumbers:
        """The pages written since the last call, protected again: writes from now on are
        what the next call reports."""
        return self._scan(protect=True)

    def _scan(self, *, protect: bool) -> PageNumbers:
        regions = np.zeros((_REGIONS, 3), dtype=np.uint64)
        start = self.ram.start
        end = start + self.ram.pages * PAGE
        args = _ScanArgs(
            size=ctypes.sizeof(_ScanArgs),
            flags=_CHECK_WPASYNC | (_WP_MATCHING if protect else 0),
            vec=regions.ctypes.data,
            vec_len=_REGIONS,
            category_mask=_PAGE_IS_WRITTEN,
            return_mask=_PAGE_IS_WRITTEN,
        )
        found: list[np.ndarray] = []
        fd = os.open(f"/proc/{self.ram.pid}/pagemap", os.O_RDONLY)
        try:
            while start < end:
                args.start, args.end = start, end
                count = fcntl.ioctl(fd, _PAGEMAP_SCAN, args)  # type: ignore[call-overload]
                found.append(regions[:count, :2].copy())
                start = args.walk_end
        finally:
            os.close(fd)
        return _page_numbers(np.concatenate(found), self.ram.start)


def _page_numbers(regions: np.ndarray, base: int) -> PageNumbers:
    """The page numbers (from ``base``) the ``[start, end)`` address ranges cover, ascending."""
    starts = ((regions[:, 0] - np.uint64(base)) // PAGE).astype(np.int64)
    lengths = ((regions[:, 1] - regions[:, 0]) // PAGE).astype(np.int64)
    firsts = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts - firsts, lengths)
