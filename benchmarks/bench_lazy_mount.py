"""What a read through a lazy server's mount costs once its data is here (issue 24), with
the mount's ``direct_io`` (what the lazy server mounts with) and without it, against a read
of the local file itself (the peer: what a restore of a snapshot this host has reads).

The lazy-pages server of a restore reads a snapshot's pages 64 KiB at a time for a page
fault and 1 MiB at a time for its background copy (CRIU's own, used before, 4 KiB and up to
4 MiB, a fault waiting for the read under way). Mounts a file of ``--mib`` MiB whose
chunks are all placed (the read path alone: no fetch, no fill) in this process with FUSE,
reads it in 4 MiB and 64 KiB pieces in order and 4 KiB pages at random, ``--runs`` times,
the mount's page cache dropped before each pass (the local file stays cached), and prints
the median time per read. Needs FUSE (``/dev/fuse``, ``fusermount3``). Writes
``docs/benchmarks/lazy_mount.md``.

    .venv/bin/python benchmarks/bench_lazy_mount.py --mib 256 --runs 5
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import subprocess
import threading
import time
from pathlib import Path

import mfusepy
from scratch import scratch

from sandfork.store.lazy_file import LazyFile
from sandfork.store.lazy_serve import LazyMount
from sandfork.store.manifest import CHUNK_SIZE, Entry

OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "lazy_mount.md"
PATTERNS = (("4 MiB in order", 4 << 20, False), ("64 KiB in order", 64 << 10, False))
PAGE = ("4 KiB pages at random", 4096, True)


def placed_file(folder: Path, size: int) -> LazyFile:
    """A lazy file of ``size`` random bytes with every chunk already in its local file."""
    data = os.urandom(size)
    chunks: dict[str, bytes] = {}
    spans = []
    for offset in range(0, size, CHUNK_SIZE):
        piece = data[offset : offset + CHUNK_SIZE]
        digest = hashlib.sha256(piece).hexdigest()
        chunks[digest] = piece
        spans.append((digest, 0, len(piece)))
    (folder / "local").mkdir()
    fd = os.open(folder / "local" / "pages.img", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.truncate(fd, size)
    lazy = LazyFile(Entry("state/pages.img", "file", 0o600, size, tuple(spans)), fd, chunks.get)
    lazy.fill()
    return lazy


class Mounted:
    """``lazy`` served by a :class:`LazyMount` at ``folder`` from a thread of this process;
    only the read path: the mount's fill and its watch of the engine are not started."""

    def __init__(self, lazy: LazyFile, folder: Path, direct_io: bool) -> None:
        self.folder = folder
        folder.mkdir()
        mount = LazyMount({"pages.img": lazy})
        mount.init = lambda path: None  # type: ignore[method-assign]
        options = {"direct_io": True} if direct_io else {}
        threading.Thread(
            target=mfusepy.FUSE,
            args=(mount, str(folder)),
            kwargs={"foreground": True, "ro": True, **options},
            daemon=True,
        ).start()
        while not (folder / "pages.img").exists():
            time.sleep(0.01)

    def close(self) -> None:
        subprocess.run(["fusermount3", "-u", str(self.folder)], check=True)


def per_read(path: Path, size: int, piece: int, at_random: bool, count: int, runs: int) -> float:
    """Median seconds per read of ``count`` reads of ``piece`` bytes of ``path``, whose own
    page cache is dropped before each pass (a mount's: the local file under it stays
    cached, as a snapshot just written or filled is)."""
    times = []
    for run in range(runs):
        places = random.Random(run)
        fd = os.open(path, os.O_RDONLY)
        try:
            if path.parent.name != "local":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            started = time.perf_counter()
            for i in range(count):
                offset = places.randrange(size // piece) * piece if at_random else i * piece
                if len(os.pread(fd, piece, offset % size)) != piece:
                    raise RuntimeError(f"a short read at {offset}")
            times.append((time.perf_counter() - started) / count)
        finally:
            os.close(fd)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    size = args.mib << 20
    root = scratch("sf-lazy-mount-")
    lazy = placed_file(root, size)
    mounts = {
        "the mount (direct_io)": Mounted(lazy, root / "direct", True),
        "the mount (page cache)": Mounted(lazy, root / "cached", False),
    }
    paths = {"the local file": root / "local" / "pages.img"}
    paths.update({name: m.folder / "pages.img" for name, m in mounts.items()})
    try:
        rows = {
            label: {
                name: per_read(path, size, piece, at_random, size // piece, args.runs)
                for name, path in paths.items()
            }
            for label, piece, at_random in (*PATTERNS, PAGE)
        }
    finally:
        for m in mounts.values():
            m.close()
        os.close(lazy.fd)
    names = list(paths)
    lines = [
        "# Reads through a lazy server's mount (issue 24)",
        "",
        f"`benchmarks/bench_lazy_mount.py --mib {args.mib} --runs {args.runs}`: a file of "
        f"{args.mib} MiB whose chunks are all here, read through the lazy server's FUSE "
        "mount and directly; the mount's page cache dropped before each pass, the local "
        "file's kept; medians of the passes, milliseconds per read.",
        "",
        "| read | " + " | ".join(names) + " |",
        "| --- |" + " ---: |" * len(names),
        *(
            f"| {label} | " + " | ".join(f"{rows[label][n] * 1000:.3f} ms" for n in names) + " |"
            for label in rows
        ),
        "",
    ]
    print("\n".join(lines))
    OUT.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
