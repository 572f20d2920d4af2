"""A snapshot's files as manifest entries, and back: the scan before an upload and the
materialisation after a fetch.

A materialisation writes only into a fresh directory and never follows a link: each entry's
parent is a directory it made itself (:func:`sandfork.store.manifest.parse` checked that each
is listed before its children), files are created exclusively without following links, and
special files are at most FIFOs and overlayfs whiteouts (a character device 0:0). Owners are
set only when running as root; times are not kept (nothing restored reads them).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from sandfork.store.manifest import XATTR_ALLOWED, ZERO, Entry, span_bytes

Fetch = Callable[[str], bytes]  # a chunk by its hash, checked


def _xattrs(path: Path) -> dict[str, bytes]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    kept = [n for n in names if any(n.startswith(p) for p in XATTR_ALLOWED)]
    return {n: os.getxattr(path, n, follow_symlinks=False) for n in sorted(kept)}


def _kind(st: os.stat_result, path: Path) -> str | None:
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISCHR(mode) and st.st_rdev == 0:
        return "whiteout"
    if stat.S_ISSOCK(mode):
        return None  # a bound socket: whoever restores binds it again
    raise ValueError(f"{path} is a device: a snapshot cannot hold one")


def scan(name: str, path: Path) -> Iterator[tuple[Entry, Path]]:
    """The entries of the file or directory ``path`` stored as ``name`` (parents first;
    files without their chunks yet), each with where it is."""
    stack = [(name, path)]
    while stack:
        rel, where = stack.pop()
        st = os.lstat(where)
        kind = _kind(st, where)
        if kind is None:
            continue
        yield (
            Entry(
                name=rel,
                kind=kind,
                mode=stat.S_IMODE(st.st_mode),
                size=st.st_size if kind == "file" else 0,
                target=os.readlink(where) if kind == "symlink" else "",
                uid=st.st_uid,
                gid=st.st_gid,
                xattrs=_xattrs(where),
            ),
            where,
        )
        if kind == "dir":
            stack += [(f"{rel}/{c}", where / c) for c in sorted(os.listdir(where), reverse=True)]


def _write_file(path: Path, entry: Entry, fetch: Fetch | None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        for i, (digest, offset, length) in enumerate(entry.spans):
            if digest == ZERO or fetch is None:
                f.seek(length, os.SEEK_CUR)
                continue
            data = span_bytes(f"span {i} of {entry.name!r}", fetch(digest), offset, length)
            if data is None:
                f.seek(length, os.SEEK_CUR)  # keep holes (format 1 stored zero chunks)
            else:
                f.write(data)
        f.truncate(entry.size)


def _make(path: Path, entry: Entry, fetch: Fetch | None) -> None:
    if entry.kind == "dir":
        path.mkdir(mode=0o700)
    elif entry.kind == "file":
        _write_file(path, entry, fetch)
    elif entry.kind == "symlink":
        os.symlink(entry.target, path)
    elif entry.kind == "fifo":
        os.mkfifo(path, 0o600)
    else:  # whiteout
        os.mknod(path, stat.S_IFCHR | 0o600, 0)


def _finish(path: Path, entry: Entry, as_root: bool) -> None:
    for name, value in entry.xattrs.items():
        try:
            os.setxattr(path, name, value, follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
    if as_root:
        os.chown(path, entry.uid, entry.gid, follow_symlinks=False)
    if entry.kind != "symlink":
        os.chmod(path, entry.mode, follow_symlinks=False)


def materialise(
    entries: tuple[Entry, ...], dest: Path, fetch: Fetch, later: frozenset[str] = frozenset()
) -> None:
    """Write ``entries`` (checked by :func:`~sandfork.store.manifest.parse`) under the
    empty directory ``dest``; a span beyond its chunk raises
    :class:`~sandfork.store.manifest.ManifestError`. The
    files named in ``later`` are left as holes of their size, for a lazy server to fill."""
    as_root = os.geteuid() == 0
    dirs: list[tuple[Path, Entry]] = []
    for entry in entries:
        path = dest.joinpath(*entry.name.split("/"))
        _make(path, entry, None if entry.name in later else fetch)
        if entry.kind == "dir":
            dirs.append((path, entry))  # its mode last: a read-only one still gets children
        else:
            _finish(path, entry, as_root)
    for path, entry in reversed(dirs):
        _finish(path, entry, as_root)
