"""Building without any namespace: fakechroot + fakeroot (a Docker build step refuses
user namespaces, so a Binder image can use neither ``--mode=unshare`` nor the ``unshare``
of the later steps).

The whole root filesystem is then built in one child process, ``fakechroot fakeroot python
-m sandfork.templates.stage``: ``mmdebstrap --mode=fakechroot`` (which finds fakechroot
running and uses it), the chroot steps (``chroot`` is fakechroot's), and ``mke2fs -d``, which
reads the owners, modes, device nodes and file capabilities fakeroot recorded. One fakeroot
session keeps them all: its saved state (``-s``/``-i``) would lose the capabilities.

fakechroot runs the tree's programs with the host's dynamic loader, so the tree's libraries
are put on ``LD_LIBRARY_PATH`` (as mmdebstrap does), and the host's C library must be the
tree's (a Debian 12 host for a bookworm template); and it writes absolute symlinks with the
tree's host path in front, which ``fix_symlinks`` takes off before the image is made.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["active", "chroot_env", "fix_symlinks", "wrap"]

#: The variables that carry fakechroot and fakeroot into a child (the chroot steps run
#: with a clean environment otherwise).
_CARRIED = ("FAKECHROOT", "FAKEROOTKEY", "FAKED_MODE", "LD_PRELOAD")


def active() -> bool:
    """Whether this process runs under fakechroot (set up by ``wrap``)."""
    return os.environ.get("FAKECHROOT") == "true"


def wrap(args: Sequence[str]) -> list[str]:
    """``args`` run under fakechroot and fakeroot, one session for all they start."""
    return ["fakechroot", "fakeroot", *args]


def chroot_env(tree: Path) -> dict[str, str]:
    """What a command chrooted into ``tree`` needs from our environment under fakechroot:
    fakechroot's and fakeroot's variables, and the tree's libraries on the loader's path."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name in _CARRIED or name.startswith("FAKECHROOT_")
    }
    host = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    env["LD_LIBRARY_PATH"] = ":".join([*host, *library_dirs(tree)])
    return env


def library_dirs(tree: Path) -> list[str]:
    """The tree's library folders as its ``/etc/ld.so.conf`` lists them, as host paths."""
    found: list[str] = []

    def read(conf: Path, depth: int = 0) -> None:
        try:
            lines = conf.read_text().splitlines()
        except OSError:
            return
        for line in (raw.split("#", 1)[0].strip() for raw in lines):
            if line.startswith("include ") and depth < 4:
                pattern = str(tree) + "/" + line.split(None, 1)[1].strip().lstrip("/")
                for included in sorted(glob.glob(pattern)):
                    read(Path(included), depth + 1)
            elif line.startswith("/") and (tree / line.lstrip("/")).is_dir():
                found.append(str(tree / line.lstrip("/")))

    read(tree / "etc" / "ld.so.conf")
    defaults = [str(tree / d) for d in ("lib", "usr/lib") if (tree / d).is_dir()]
    return list(dict.fromkeys([*found, *defaults]))


def fix_symlinks(tree: Path) -> int:
    """Take the tree's host path off the absolute symlinks fakechroot wrote; how many."""
    root = os.path.realpath(tree)
    fixed = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                continue
            target = os.readlink(path)
            if target == root or target.startswith(root + "/"):
                os.unlink(path)
                os.symlink(target[len(root) :] or "/", path)
                fixed += 1
    return fixed
