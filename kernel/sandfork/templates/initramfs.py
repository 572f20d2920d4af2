"""The initramfs: busybox, the virtio modules, the guest agent and the two init scripts."""

from __future__ import annotations

import gzip
import hashlib
import io
import lzma
import os
import py_compile
import sys
from collections.abc import Iterable
from pathlib import Path

from .cpio import CpioWriter
from .errors import TemplateError
from .kernel import ModuleFile
from .proc import run

__all__ = [
    "GUEST_DIR",
    "GUEST_INIT",
    "INITRAMFS_INIT",
    "agent_dir",
    "agent_files",
    "files_hash",
    "pyc_tag",
    "write_initramfs",
]

GUEST_DIR = Path(__file__).resolve().parent / "guest"
#: ``/init`` of the initramfs.
INITRAMFS_INIT = GUEST_DIR / "initramfs-init"
#: The rootfs' PID 1, copied to ``/sandfork/init`` (then ``/run/sandfork/init``).
GUEST_INIT = GUEST_DIR / "init"

#: Where the modules' load order is written inside the initramfs (one name per line).
MODULES_LIST = "etc/sandfork/modules"
#: The agent package is renamed: ``import sandfork_agent`` with PYTHONPATH=/run/sandfork/agent.
AGENT_TARGET = "sandfork/agent/sandfork_agent"


def agent_dir() -> Path:
    """The guest agent package, ``kernel/sandfork/agent``."""
    return Path(__file__).resolve().parent.parent / "agent"


def agent_files(directory: Path | None = None) -> list[Path]:
    """The agent's ``*.py`` files (sorted, relative to the package dir; no ``__pycache__``)."""
    root = directory or agent_dir()
    if not root.is_dir():
        return []
    return sorted(p.relative_to(root) for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def files_hash(files: Iterable[tuple[str, Path]]) -> str:
    """sha256 over (name, content) pairs: the identity of a set of source files."""
    h = hashlib.sha256()
    for name, path in sorted(files):
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _module_bytes(path: Path) -> bytes:
    name = path.name
    if name.endswith(".ko"):
        return path.read_bytes()
    if name.endswith(".ko.xz"):
        return lzma.decompress(path.read_bytes())
    if name.endswith(".ko.gz"):
        return gzip.decompress(path.read_bytes())
    raise TemplateError(f"unsupported kernel module file {path}")


def pyc_tag() -> str:
    """The cache tag of the agent's precompiled bytecode (this interpreter's, ``cpython-311``).

    A guest Python of another version ignores these files and compiles the sources.
    """
    return sys.implementation.cache_tag


def _compiled(source: Path, rel: Path, work: Path) -> tuple[str, bytes]:
    """Bytecode of an agent module as an unchecked-hash pyc (valid without comparing the
    source's mtime; the initramfs is immutable), and its path relative to the package."""
    pyc_rel = rel.parent / "__pycache__" / f"{rel.stem}.{pyc_tag()}.pyc"
    tmp = work / f".pyc-{os.getpid()}"
    try:
        py_compile.compile(
            str(source),
            cfile=str(tmp),
            dfile=f"/run/{AGENT_TARGET}/{rel.as_posix()}",
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
        return pyc_rel.as_posix(), tmp.read_bytes()
    except py_compile.PyCompileError as e:
        raise TemplateError(f"the guest agent does not compile: {e.msg}") from e
    finally:
        tmp.unlink(missing_ok=True)


def write_initramfs(
    out: Path,
    *,
    busybox: Path,
    modules: list[ModuleFile],
    agent: Path | None = None,
    compression: str = "gzip",
) -> list[str]:
    """Write the compressed initramfs to ``out``; return the member paths in archive order.

    Layout: ``/init``, ``/bin/busybox``, ``/lib/modules/<name>.ko`` in load order (also listed
    in ``/etc/sandfork/modules``), ``/sandfork/init``, ``/sandfork/agent/sandfork_agent/...``
    (sources and their bytecode for ``pyc_tag()``), and ``/dev/console`` so the kernel has a
    console before ``/init`` mounts devtmpfs.
    """
    buf = io.BytesIO()
    w = CpioWriter(buf)
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "newroot", "run", "tmp"):
        w.directory(d)
    w.directory("dev")
    w.char_device("dev/console", 5, 1, 0o600)
    w.char_device("dev/null", 1, 3, 0o666)
    w.file("init", INITRAMFS_INIT.read_bytes(), 0o755)
    w.file("bin/busybox", busybox.read_bytes(), 0o755)
    w.symlink("bin/sh", "busybox")
    for m in modules:
        w.file(f"lib/modules/{m.name}.ko", _module_bytes(m.path), 0o644)
    w.file(MODULES_LIST, "".join(f"{m.name}\n" for m in modules).encode(), 0o644)
    w.file("sandfork/init", GUEST_INIT.read_bytes(), 0o755)
    root = agent or agent_dir()
    w.directory(AGENT_TARGET)
    for rel in agent_files(root):
        w.file(f"{AGENT_TARGET}/{rel.as_posix()}", (root / rel).read_bytes(), 0o644)
        pyc_rel, pyc = _compiled(root / rel, rel, out.parent)
        w.file(f"{AGENT_TARGET}/{pyc_rel}", pyc, 0o644)
    w.close()
    raw = buf.getvalue()
    if compression == "gzip":
        data = gzip.compress(raw, compresslevel=1, mtime=0)
    elif compression == "zstd":
        tmp_raw = out.with_name(out.name + ".cpio")
        tmp_raw.write_bytes(raw)
        try:
            run(["zstd", "-q", "-f", "-3", str(tmp_raw), "-o", str(out)], what="zstd")
        finally:
            tmp_raw.unlink(missing_ok=True)
        return w.paths
    elif compression == "none":
        data = raw
    else:
        raise TemplateError(f"unknown initramfs compression {compression!r}")
    with open(out, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return w.paths
