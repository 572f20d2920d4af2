"""File operations (blocking; the server runs them in worker threads).

Relative paths are taken relative to the default working directory (see system.work_dir).
"""

from __future__ import annotations

import io
import os
import shutil
import stat

from .protocol import AgentError, Frame, b64decode, b64encode
from .system import work_dir

DEFAULT_MAX_READ = 32 * 2**20
MAX_ENTRIES = 10000  # of a directory listing
_CHUNK = 2**20


def resolve(path: str) -> str:
    """Absolute, normalized form of a request path."""
    if not path:
        raise AgentError("BadRequest", "empty path")
    if "\x00" in path:
        raise AgentError("BadRequest", "a path must not contain NUL characters")
    return os.path.normpath(os.path.join(work_dir(), path))


def stat_entry(path: str) -> Frame:
    """The protocol's stat record for ``path`` (symlinks followed; dangling ones described)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = os.lstat(path)
    return {
        "name": os.path.basename(path) or path,
        "path": path,
        "is_dir": stat.S_ISDIR(st.st_mode),
        "size": st.st_size,
        "mode": format(stat.S_IMODE(st.st_mode), "04o"),
        "mtime": int(st.st_mtime),
    }


def read_file(path: str, offset: int, length: int | None, max_bytes: int) -> Frame:
    """Contents of a file, base64-encoded: ``length`` bytes from ``offset``, else all of it.

    Never more than ``max_bytes`` is read: a longer file without ``length`` is ``TooLarge``
    (the caller reads it in ranges), and so is a ``length`` over ``max_bytes``. Without a
    ``length``, only regular files are read (``/dev/zero`` never ends); a FIFO or socket is
    refused in any case (a read would wait for a writer). The file is opened non-blocking,
    so not even opening it can hang.
    """
    if length is not None and length > max_bytes:
        raise AgentError("TooLarge", f"length {length} is over the limit of {max_bytes} bytes")
    fd = os.open(resolve(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise AgentError("IsADirectory", f"is a directory: {path}")
        if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
            raise AgentError("BadRequest", f"not a regular file (a pipe or socket): {path}")
        regular = stat.S_ISREG(st.st_mode)
        if length is None and not regular:
            raise AgentError(
                "BadRequest", f"not a regular file: {path} (read a range: offset and length)"
            )
        if length is None and st.st_size - offset > max_bytes:
            raise _too_large(path, max_bytes)
        os.set_blocking(fd, True)
        if offset:
            f.seek(offset)
        data = _read_at_most(f, max_bytes + 1 if length is None else length)
    if len(data) > max_bytes:  # a file that grew, or one whose size says 0 (/proc)
        raise _too_large(path, max_bytes)
    return {"data": b64encode(data), "size": len(data)}


def _too_large(path: str, max_bytes: int) -> AgentError:
    return AgentError(
        "TooLarge", f"{path} is larger than {max_bytes} bytes: read it in ranges (offset, length)"
    )


def _read_at_most(f: io.RawIOBase, limit: int) -> bytes:
    """Up to ``limit`` bytes, read in chunks until end of file."""
    parts: list[bytes] = []
    left = limit
    while left > 0:
        chunk = f.read(min(left, _CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def write_file(path: str, data_b64: str, mode: int | None) -> Frame:
    """Create or replace a file (creating its parents) and optionally set its mode."""
    data = b64decode(data_b64, "data")
    target = resolve(path)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    with open(target, "wb") as f:
        f.write(data)
        if mode is not None:
            os.fchmod(f.fileno(), mode)
    return {"path": target, "size": len(data)}


def list_dir(path: str) -> Frame:
    """Stat records of a directory's entries, sorted by name (the first ``MAX_ENTRIES``;
    ``truncated`` says whether there were more)."""
    target = resolve(path)
    names = sorted(os.listdir(target))
    entries = []
    for name in names[:MAX_ENTRIES]:
        try:
            entries.append(stat_entry(os.path.join(target, name)))
        except FileNotFoundError:
            continue  # removed while listing
    return {"entries": entries, "truncated": len(names) > MAX_ENTRIES}


def stat_path(path: str) -> Frame:
    """Stat record of one path."""
    return stat_entry(resolve(path))


def delete(path: str, recursive: bool) -> Frame:
    """Remove a file, symlink or empty directory; non-empty directories need ``recursive``."""
    target = resolve(path)
    if os.path.isdir(target) and not os.path.islink(target):
        if recursive:
            shutil.rmtree(target)
        elif os.listdir(target):
            raise AgentError("IsADirectory", f"directory not empty (pass recursive): {target}")
        else:
            os.rmdir(target)
    else:
        os.unlink(target)
    return {}
