"""A container sandbox's disk: overlayfs layers, each a directory the engine keeps like a file.

A *layer* is a directory holding ``fs/`` (overlayfs' upper directory: the files written over
the layers below, whiteouts for deleted ones) and ``work/`` (overlayfs' work directory),
plus a file ``backing`` naming the layer below it; the bottom of every chain is a template's
tree (:mod:`.tree`), which is not a layer. A running sandbox writes into its own layer's
``fs``; a snapshot *copies* that ``fs`` into a new layer (the sandbox cannot be moved off a
mounted upper), which lies over the same backing. Files the sandbox has not changed since its
previous capture are hard-linked from that capture's layer instead of copied: a layer is
immutable once listed, so sharing its files is safe. Chains deeper than :data:`MAX_DEPTH`
are squashed into one layer at the next capture (overlayfs takes a bounded mount option).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".fs"  # how the engine names layer directories
FS = "fs"
WORK = "work"
BACKING = "backing"
INDEX = "index.json"  # what each copied file was when copied, for the next capture's links
MAX_DEPTH = 16
_OPAQUE = "trusted.overlay.opaque"
# overlayfs' own bookkeeping, meaningful only in the upper directory it was written in
_XATTR_SKIP = frozenset(
    f"trusted.overlay.{name}" for name in ("origin", "impure", "nlink", "upper", "uuid")
)


def is_whiteout(st: os.stat_result) -> bool:
    """True for an overlayfs whiteout: a character device 0:0 marking a deleted file."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def fs_dir(layer: Path) -> Path:
    """The files of a layer (the template's tree is its own files)."""
    return layer / FS if (layer / BACKING).exists() else layer


def create(layer: Path, backing: Path) -> None:
    """Make ``layer`` an empty layer over ``backing`` (a layer or a tree)."""
    layer.mkdir(mode=0o700)
    (layer / FS).mkdir()
    (layer / WORK).mkdir()
    (layer / BACKING).write_text(str(backing))


def backing(layer: Path) -> Path | None:
    """The layer or tree ``layer`` lies over (``None``: it is a tree)."""
    try:
        return Path((layer / BACKING).read_text())
    except FileNotFoundError:
        return None


def chain(layer: Path) -> list[Path]:
    """``layer`` and everything below it, top first, ending with the tree."""
    found = [layer]
    while (below := backing(found[-1])) is not None:
        if len(found) > 4 * MAX_DEPTH:
            raise ValueError(f"the layer chain of {layer} does not end")
        found.append(below)
    return found


def set_backing(layer: Path, below: Path) -> None:
    """Point ``layer`` at another layer or tree below it (its files unchanged)."""
    tmp = layer / f".{BACKING}.tmp"
    tmp.write_text(str(below))
    tmp.rename(layer / BACKING)


class OverlayLayers:
    """The container backend's disk layers as the engine's chains see them."""

    suffix = SUFFIX

    def create_overlay(self, base: Path, overlay: Path) -> None:
        """An empty layer over ``base``."""
        create(overlay, base)

    def backing_chain(self, image: Path) -> list[Path]:
        """``image``, the layers below it and the tree."""
        return chain(image)

    def rebase(self, layer: Path, backing: Path) -> None:
        """Point ``layer`` at another backing."""
        set_backing(layer, backing)


@dataclass(frozen=True)
class _Source:
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> _Source:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _walk(top: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``top`` as (relative path, lstat), parents before children."""
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(top / rel if rel else top) as entries:
            for entry in entries:
                path = f"{rel}/{entry.name}" if rel else entry.name
                st = entry.stat(follow_symlinks=False)
                yield path, st
                if stat.S_ISDIR(st.st_mode):
                    stack.append(path)


def _copy_xattrs(src: Path, dst: Path) -> None:
    try:
        names = os.listxattr(src, follow_symlinks=False)
    except OSError:
        return
    for name in names:
        if name in _XATTR_SKIP:
            continue
        try:
            os.setxattr(
                dst, name, os.getxattr(src, name, follow_symlinks=False), follow_symlinks=False
            )
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise


def _set_meta(path: Path, st: os.stat_result) -> None:
    os.chown(path, st.st_uid, st.st_gid, follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(path, stat.S_IMODE(st.st_mode))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def copy_tree(src: Path, dst: Path, previous: Path | None = None) -> dict[str, list[int]]:
    """Copy the upper directory ``src`` into the empty directory ``dst``: every file, link,
    directory and whiteout with its owner, mode, times and extended attributes (overlayfs'
    opaque marks included); hard links inside ``src`` stay hard links.

    A regular file unchanged since ``previous`` (a layer that copied this same ``src`` before,
    with its index) is hard-linked from there instead of copied. Returns the index of this
    copy (relative path -> size, mtime, ctime, inode of the source).
    """
    old: dict[str, list[int]] = {}
    if previous is not None:
        try:
            old = json.loads((previous / INDEX).read_text())
        except (OSError, ValueError):
            old = {}
    index: dict[str, list[int]] = {}
    inodes: dict[int, Path] = {}
    dirs: list[tuple[Path, os.stat_result]] = []
    for rel, st in _walk(src):
        source, target = src / rel, dst / rel
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            target.mkdir()
            _copy_xattrs(source, target)
            dirs.append((target, st))
            continue
        if stat.S_ISSOCK(mode):
            continue  # a bound socket: CRIU binds it again at restore
        if stat.S_ISREG(mode) and st.st_nlink > 1 and st.st_ino in inodes:
            os.link(inodes[st.st_ino], target)
            continue
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(source), target)
        elif stat.S_ISREG(mode):
            seen = _Source.of(st)
            entry = [seen.size, seen.mtime_ns, seen.ctime_ns, seen.ino]
            earlier = previous / FS / rel if previous is not None else None
            if old.get(rel) == entry and earlier is not None and _link(earlier, target):
                index[rel] = entry
                inodes[st.st_ino] = target
                continue
            shutil.copyfile(source, target, follow_symlinks=False)
            index[rel] = entry
            inodes[st.st_ino] = target
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
            os.mknod(target, mode, st.st_rdev)
        else:
            continue
        _copy_xattrs(source, target)
        _set_meta(target, st)
    for target, st in reversed(dirs):  # children first: writing them moved the times
        _set_meta(target, st)
    return index


def _link(earlier: Path, target: Path) -> bool:
    try:
        os.link(earlier, target)
        return True
    except OSError:
        return False


def capture(upper_layer: Path, new_layer: Path, previous: Path | None) -> None:
    """Copy the writable layer ``upper_layer`` of a frozen sandbox into ``new_layer`` (over
    the same backing), linking files unchanged since ``previous`` (its last capture)."""
    below = backing(upper_layer)
    assert below is not None
    new_layer.mkdir(mode=0o700)
    (new_layer / FS).mkdir()
    index = copy_tree(upper_layer / FS, new_layer / FS, previous)
    _set_meta(new_layer / FS, os.lstat(upper_layer / FS))
    (new_layer / INDEX).write_text(json.dumps(index))
    (new_layer / BACKING).write_text(str(below))


def squash(layers: list[Path], into: Path) -> None:
    """Merge ``layers`` (top first, all over the same tree) into one new layer ``into`` over
    that tree: the files the merged view shows above the tree, and whiteouts for the tree's
    files it hides."""
    tree = chain(layers[-1])[-1]
    into.mkdir(mode=0o700)
    merged = into / FS
    merged.mkdir()
    for layer in reversed(layers):  # bottom first: higher layers overwrite
        _apply(layer / FS, merged, tree)
    (into / BACKING).write_text(str(tree))


def _apply(upper: Path, merged: Path, tree: Path) -> None:
    for rel, st in _walk(upper):
        source, target = upper / rel, merged / rel
        if os.path.lexists(target) and not (stat.S_ISDIR(st.st_mode) and target.is_dir()):
            _remove(target)
        if is_whiteout(st):
            if os.path.lexists(tree / rel):
                os.mknod(target, stat.S_IFCHR, 0)
            continue
        if stat.S_ISDIR(st.st_mode):
            opaque = _is_opaque(source)
            if opaque and target.is_dir():
                _remove(target)
            if not target.is_dir():
                target.mkdir()
            if opaque and (tree / rel).is_dir():
                os.setxattr(target, _OPAQUE, b"y")
            _set_meta(target, st)
            continue
        if stat.S_ISSOCK(st.st_mode):
            continue
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(source), target)
        elif stat.S_ISREG(st.st_mode):
            os.link(source, target)  # immutable layers: share the file
            continue
        else:
            os.mknod(target, st.st_mode, st.st_rdev)
        _set_meta(target, st)


def _is_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, _OPAQUE) == b"y"
    except OSError:
        return False


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def stored_bytes(layer: Path) -> int:
    """Bytes the files of a layer take on disk (a file linked from another layer counts in
    both)."""
    total = 0
    for _rel, st in _walk(fs_dir(layer)):
        if stat.S_ISREG(st.st_mode):
            total += st.st_blocks * 512
    return total
