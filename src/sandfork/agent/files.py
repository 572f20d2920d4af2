"""File operations (blocking; the server runs them in worker threads).

Relative paths are taken relative to the default working directory (see system.work_dir).
"""

from __future__ import annotations

import os
import shutil
import stat

from .protocol import AgentError, Frame, b64decode, b64encode
from .system import work_dir


def resolve(path: str) -> str:
    """Absolute, normalized form of a request path."""
    if not path:
        raise AgentError("BadRequest", "empty path")
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


def read_file(path: str) -> Frame:
    """Whole contents of a file, base64-encoded."""
    with open(resolve(path), "rb") as f:
        data = f.read()
    return {"data": b64encode(data), "size": len(data)}


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
    """Stat records of a directory's entries, sorted by name."""
    target = resolve(path)
    names = sorted(os.listdir(target))
    entries = []
    for name in names:
        try:
            entries.append(stat_entry(os.path.join(target, name)))
        except FileNotFoundError:
            continue  # removed while listing
    return {"entries": entries}


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
