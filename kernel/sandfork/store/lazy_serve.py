"""The lazy server: the big files of one snapshot fetched from the store, readable through a
FUSE mount before they are all here (``python -m sandfork.store.lazy_serve``).

A read of the mount waits only for the chunks it covers (:class:`~.lazy_file.LazyFile`);
meanwhile the server fills the local files in order, so the snapshot is whole on disk soon
after. The engine starts one per fetch, in a session of its own: a sandbox restored from the
mount (CRIU's lazy-pages server reads its pages from it) keeps its memory coming if the
engine dies. So the server fetches by itself, from the bucket and the engine's chunk cache
(read, never written: the cache is the engine's to bound).

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mfusepy

from sandfork.holdpoints import hold_point_sync
from sandfork.store.cache import CacheView
from sandfork.store.chunks import ChunkStore
from sandfork.store.lazy_file import LazyFile
from sandfork.store.lazy_spec import Source, Spec, mount_name

log = logging.getLogger("sandfork.lazy_serve")


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

    def init(self, path: str) -> None:
        _say("mounted")
        threading.Thread(target=self._fill, daemon=True).start()
        threading.Thread(target=self._watch_engine, daemon=True).start()

    def _fill(self) -> None:
        # The fill takes only CPU nothing else wants: the sandbox's own reads come first.
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))

        def before() -> None:
            hold_point_sync("lazy.fill")
            if self.state.engine_gone and self.state.opens == 0:
                raise InterruptedError("nobody reads the files")

        try:
            for lazy in self.files.values():
                lazy.fill(before)
                os.fsync(lazy.fd)
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


def main() -> None:
    """Serve the spec read from standard input until the server's work is done."""
    logging.basicConfig(level=logging.WARNING, format="sandfork lazy_serve: %(message)s")
    source = Source.from_json(sys.stdin.readline())
    from sandfork.store.config import S3Store
    from sandfork.store.s3 import S3Objects

    settings = {k: v for k, v in source.store.items() if k != "signing_key"}
    chunks = ChunkStore(
        S3Objects(S3Store(**settings)), CacheView(Path(source.cache)), source.store["signing_key"]
    )
    line = sys.stdin.readline()
    if not line:
        return  # started ahead of need, and not needed
    spec = Spec.from_json(line)
    files = {}
    for served in spec.files:
        fd = os.open(served.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        files[mount_name(served.name)] = LazyFile(served.entry, fd, chunks.chunk)
    mount = LazyMount(files)
    try:
        mfusepy.FUSE(mount, spec.mount, foreground=True, ro=True, fsname="sandfork-lazy")
    except RuntimeError:
        if not mount.ended:  # libfuse counts the end asked for by a signal as an error
            raise


if __name__ == "__main__":
    main()
