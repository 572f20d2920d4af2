"""The lazy server: the big files of one snapshot fetched from the store, readable through a
FUSE mount before they are all here (``python -m sandfork.store.lazy_serve``).

A read of the mount waits only for the chunks it covers (:class:`~.lazy_file.LazyFile`);
once nothing has read it for half a second, the server fills the rest of the local files in
order, so the snapshot is whole on disk soon after. A store that fails is tried again for
``S3Store.outage_wait`` seconds, the reads waiting meanwhile. The engine starts one server
per fetch, in a session of its own: a sandbox restored from the mount (its lazy-pages
server reads the pages from it) keeps its memory coming if the engine dies. So the server
fetches by itself, from the bucket and the engine's chunk cache (read, never written: the
cache is the engine's to bound).

Standard input: a line of JSON saying where to fetch from (:class:`~.lazy_spec.Source`),
written as soon as the server starts: the engine keeps one started ahead of need, its
modules imported and its client made; then, when a fetch needs it, a line saying what to
serve (:class:`~.lazy_spec.Spec`; an input closed before it ends the server); then nothing
until it closes: the engine closes it when it will hand no more paths of the mount out (and
an engine that dies closes it too). Standard output: ``mounted``, then ``filled`` or
``failed <reason>``. The server unmounts and exits once its input is closed, the fill has
ended and no file is open.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mfusepy

from sandfork.crashpoints import crash_point
from sandfork.holdpoints import hold_point_sync
from sandfork.store.cache import CacheView
from sandfork.store.chunks import ChunkStore
from sandfork.store.lazy_file import Fetch, LazyFile
from sandfork.store.lazy_spec import Source, Spec, mount_name
from sandfork.store.objects import StoreError

log = logging.getLogger("sandfork.lazy_serve")

QUIET_S = 0.5  # the fill waits until nothing has read the mount for this long
RETRY_FIRST_S = 0.25  # the pause before a failed chunk's second try; doubling after
RETRY_MOST_S = 4.0


@dataclass
class _State:
    """What decides when the server ends."""

    opens: int = 0
    engine_gone: bool = False  # standard input closed
    fill_ended: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def done(self) -> bool:
        return self.engine_gone and self.opens == 0 and self.fill_ended


def _say(word: str) -> None:
    try:
        print(word, flush=True)
    except OSError:
        pass  # the engine is gone: nobody listens


class LazyMount(mfusepy.Operations):
    """The file system: ``files`` (by their names on the mount), read-only, read as they are
    fetched."""

    use_ns = True

    def __init__(self, files: dict[str, LazyFile]) -> None:
        self.files = files
        self.state = _State()
        self.ended = False  # the server ended the loop itself (not an error)
        self.last_read = 0.0  # time.monotonic() of the last read

    def init(self, path: str) -> None:
        _say("mounted")
        threading.Thread(target=self._fill, daemon=True).start()
        threading.Thread(target=self._watch_engine, daemon=True).start()

    def _fill(self) -> None:
        # A sandbox's restore reads the mount without pause until CRIU's background copy
        # has it all, and a fill beside it only slowed it (restores of 1.9-6.9 s, median
        # 2.3 s, against 1.2-1.7 s, median 1.5 s, with the fill held back): its work holds
        # the interpreter's lock that the reads wait for, and it was starved at idle
        # priority while it held it. So it fills what nobody has read once nobody reads.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)

        def before() -> None:
            while (quiet := time.monotonic() - self.last_read) < QUIET_S:
                time.sleep(QUIET_S - quiet)
            hold_point_sync("lazy.fill")
            if self.state.engine_gone and self.state.opens == 0:
                raise InterruptedError("nobody reads the files")

        try:
            for lazy in self.files.values():
                lazy.fill(before)
            _say("filled")
        except InterruptedError:
            pass
        except Exception as e:  # a store that fails: reads of what is missing fail too
            _say(f"failed {type(e).__name__}: {e}".replace("\n", " "))
        with self.state.lock:
            self.state.fill_ended = True
            self._maybe_end()

    def _watch_engine(self) -> None:
        sys.stdin.read()  # returns when the engine closes it, or dies
        with self.state.lock:
            self.state.engine_gone = True
            if self.state.opens == 0:
                self.state.fill_ended = True  # nobody will read: the fill may stop too
            self._maybe_end()

    def _maybe_end(self) -> None:
        if self.state.done() and not self.ended:
            self.ended = True
            os.kill(os.getpid(), signal.SIGTERM)  # libfuse's handler ends the loop and unmounts

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o500, "st_nlink": 2}
        lazy = self.files.get(path[1:])
        if lazy is None:
            raise OSError(errno.ENOENT, path)
        return {"st_mode": stat.S_IFREG | 0o400, "st_nlink": 1, "st_size": lazy.entry.size}

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *self.files]

    def open(self, path: str, flags: int) -> int:
        if path[1:] not in self.files:
            raise OSError(errno.ENOENT, path)
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, path)
        with self.state.lock:
            self.state.opens += 1
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self.last_read = time.monotonic()
        lazy = self.files[path[1:]]
        size = max(0, min(size, lazy.entry.size - offset))
        try:
            lazy.ensure(offset, size)
        except Exception as e:
            log.error("reading %s at %d failed: %s", path, offset, e)
            raise OSError(errno.EIO, path) from e
        return os.pread(lazy.fd, size, offset)

    def release(self, path: str, fh: int) -> int:
        with self.state.lock:
            self.state.opens -= 1
            self._maybe_end()
        return 0


def patient(fetch: Fetch, wait_s: float) -> Fetch:
    """``fetch``, tried again with a growing pause while the store fails, for up to
    ``wait_s`` seconds from its first failure: a sandbox whose pages are still coming rides
    out a brief outage (stalled) instead of dying. A chunk that is not as its manifest says
    (:class:`ManifestError`) fails at once."""

    def fetch_patiently(digest: str) -> bytes:
        pause, deadline = RETRY_FIRST_S, None
        while True:
            try:
                data = fetch(digest)
            except StoreError as e:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + wait_s
                    log.warning("the store failed, trying again for %.0f s: %s", wait_s, e)
                if now >= deadline:
                    raise
                time.sleep(min(pause, deadline - now))
                pause = min(pause * 2, RETRY_MOST_S)
                continue
            if deadline is not None:
                log.warning("the store answers again")
            return data

    return fetch_patiently


def main() -> None:
    """Serve the spec read from standard input until the server's work is done."""
    logging.basicConfig(level=logging.WARNING, format="sandfork lazy_serve: %(message)s")
    source = Source.from_json(sys.stdin.readline())
    from sandfork.store.config import S3Store
    from sandfork.store.s3 import S3Objects

    config = S3Store(**{k: v for k, v in source.store.items() if k != "signing_key"})
    chunks = ChunkStore(
        S3Objects(config), CacheView(Path(source.cache)), source.store["signing_key"]
    )
    fetch = patient(chunks.chunk, config.outage_wait)
    line = sys.stdin.readline()
    if not line:
        return  # started ahead of need, and not needed
    spec = Spec.from_json(line)
    files = {}
    for served in spec.files:
        files[mount_name(served.name)] = LazyFile.opened(served.path, served.entry, fetch)
    mount = LazyMount(files)
    crash_point("lazy.mount")
    try:
        # direct_io: a read reaches the server at the size it was asked (up to 1 MiB), not
        # in 128 KiB pieces of readahead, and the mount keeps no second page cache of the
        # local files; CRIU's background copy reads 4 MiB at a time, and a page fault
        # waits for the read under way (4 MiB reads of filled data: 1.5-1.7 ms against
        # 4.2-4.7 ms, benchmarks/bench_lazy_mount.py).
        mfusepy.FUSE(
            mount, spec.mount, foreground=True, ro=True, fsname="sandfork-lazy", direct_io=True
        )
    except RuntimeError:
        if not mount.ended:  # libfuse counts the end asked for by a signal as an error
            raise


if __name__ == "__main__":
    main()
