"""A template's root filesystem as a directory tree, the bottom layer of container sandboxes.

The tree is made from the template's own root image (``rootfs.qcow2``), so a container
sandbox sees exactly the files a VM of the same template does, and an imported or shared
template needs nothing more: ``qemu-img convert`` to a sparse raw file, then ``debugfs
rdump`` copies the ext4 file system out without mounting it (owners, modes and times kept
when run as root). About 5 s for ``code-interpreter`` here, once per template build; the tree
is cached under ``~/.cache/sandfork/trees/<root image key>/`` and never written after.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sandfork.paths import cache_dir
from sandfork.templates import BuiltTemplate
from sandfork.templates.cache import Staging, build_lock, read_manifest
from sandfork.templates.proc import run

ROOT = "root"  # the tree inside its artifact folder, beside manifest.json


def trees_dir() -> Path:
    """Where the trees of templates are cached."""
    return cache_dir() / "trees"


def tree_of(built: BuiltTemplate) -> Path:
    """The tree of ``built``, made first if needed."""
    final = trees_dir() / built.rootfs_key
    if read_manifest(final) is not None:
        return final / ROOT
    with build_lock(trees_dir()):
        if read_manifest(final) is not None:
            return final / ROOT
        with Staging(final) as staging:
            tree = staging.path / ROOT
            tree.mkdir()
            with tempfile.TemporaryDirectory(dir=staging.path) as scratch:
                raw = Path(scratch) / "rootfs.raw"
                run(
                    ["qemu-img", "convert", "-O", "raw", str(built.rootfs), str(raw)],
                    what="qemu-img convert",
                )
                run(["debugfs", "-R", f"rdump / {tree}", str(raw)], what="debugfs rdump")
            # rdump leaves the top folder as it found it; the guest's / is root's, 0755.
            os.chown(tree, 0, 0)
            tree.chmod(0o755)
            if (tree / "lost+found").is_dir():
                (tree / "lost+found").rmdir()
            staging.commit({"template": built.name, "rootfs_key": built.rootfs_key})
    return final / ROOT
