"""What the engine may take of the machine: sandboxes, their memory, and disk.

Every check runs before the work starts, so a request that would not fit (a ``fork_tree`` of
16 children, say) is refused with a message naming the limit instead of failing half-way.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from sandfork.engine.errors import OverLimit

_MIB = 2**20


def physical_memory_mb() -> int:
    """The machine's memory in MiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // _MIB


def host_memory_available() -> int:
    """The host's ``MemAvailable``, in bytes."""
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


@dataclass(frozen=True)
class Limits:
    """The engine's limits; ``0`` in a total means the default described on each field."""

    max_sandboxes: int
    max_total_memory_mb: int  # 0: four times the machine's memory (guests rarely touch all)
    snapshot_quota_mb: int  # 0: only the free disk space limits snapshots
    snapshots_dir: Path

    @property
    def total_memory_mb(self) -> int:
        """The cap on the memory of all running sandboxes together."""
        return self.max_total_memory_mb or 4 * physical_memory_mb()

    def check_start(self, running: list[int], count: int, memory_mb: int) -> None:
        """Refuse ``count`` new sandboxes of ``memory_mb`` each when they would not fit
        (``running`` lists the memory of the sandboxes that run or are starting)."""
        if len(running) + count > self.max_sandboxes:
            raise OverLimit(
                f"this would make {len(running) + count} sandboxes; the engine's limit is "
                f"{self.max_sandboxes} (kill some, or raise max_sandboxes)"
            )
        total = sum(running) + count * memory_mb
        if total > self.total_memory_mb:
            raise OverLimit(
                f"this would give running sandboxes {total} MiB of memory in all; the engine's "
                f"limit is {self.total_memory_mb} MiB (kill some, or raise max_total_memory_mb)"
            )

    def check_snapshot(self, stored_bytes: int, estimate: int) -> None:
        """Refuse a snapshot of about ``estimate`` bytes past the quota or the free disk."""
        quota = self.snapshot_quota_mb * _MIB
        if quota and stored_bytes + estimate > quota:
            raise OverLimit(
                f"snapshots take {stored_bytes // _MIB} MiB and this one needs about "
                f"{estimate // _MIB} MiB more; the quota is {self.snapshot_quota_mb} MiB "
                "(delete some snapshots, or raise snapshot_quota_mb)"
            )
        self.check_disk(estimate)

    @staticmethod
    def check_host_memory(needed: int, what: str) -> None:
        """Refuse to start sandboxes that will take ``needed`` bytes of the host's memory at
        once (copies that share no pages) when the host has not that much available."""
        available = host_memory_available()
        if needed + 256 * _MIB > available:
            raise OverLimit(
                f"{what} need about {needed // _MIB} MiB of the host's memory, which has "
                f"{available // _MIB} MiB available (container copies share no pages; kill "
                "some sandboxes, or use the vm backend)"
            )

    def free_bytes(self) -> int:
        """The free space of the snapshot store's disk."""
        return shutil.disk_usage(self.snapshots_dir).free

    def check_disk(self, estimate: int) -> None:
        """Refuse a capture of about ``estimate`` bytes (a fork's, say) past the free disk."""
        self._check_free(self.snapshots_dir, estimate, "the snapshot store")

    @staticmethod
    def _check_free(path: Path, needed: int, what: str) -> None:
        free = shutil.disk_usage(path).free
        if needed + 64 * _MIB > free:
            raise OverLimit(
                f"{what} ({path}) has {free // _MIB} MiB free; this needs about "
                f"{needed // _MIB + 64} MiB"
            )
