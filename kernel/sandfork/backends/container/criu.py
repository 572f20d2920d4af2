"""Finding, installing and checking CRIU, the checkpoint/restore tool the container backend uses.

CRIU must be 4.2 or newer on kernels since 6.16 (4.1 cannot dump a TCP socket there), and
Debian 12's 3.17 fails ``criu check`` on them (vDSO layout). So unless the host's own
``criu`` is new enough, Sandfork installs Debian unstable's into a tree of its own with
mmdebstrap (``~/.cache/sandfork/criu/<version>/``) and runs it through that tree's dynamic
loader, its libraries first: nothing of the host is replaced. CRIU runs ``iptables-save``,
``iptables-restore`` and ``nft`` itself (to save and lock a sandbox's network namespace), so the
tree's ones are reached through small wrapper scripts on its ``PATH``.

An install is checked before it counts (``criu check`` and a dump and restore of a real
process tree, see :mod:`.smoke`); only then its ``manifest.json`` is written and the
directory renamed into place (:class:`sandfork.templates.cache.Staging`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandfork.paths import cache_dir
from sandfork.templates.cache import Staging, build_lock, read_manifest
from sandfork.templates.debian import apt_mirror
from sandfork.templates.errors import TemplateError
from sandfork.templates.proc import run, tool_path

MIN_VERSION = (4, 2)
SUITE = "unstable"
#: What the tree gets: CRIU, and the network tools it calls to save and lock a namespace.
PACKAGES = ("criu", "iptables", "nftables")
#: Programs CRIU runs by name, wrapped to run from the tree.
WRAPPED = ("iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save",
           "ip6tables-restore", "nft")  # fmt: skip
WRAPPERS = "sandfork-bin"  # in the tree (its own bin/ is a link to usr/bin)
_LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu")
_LOADER = "lib64/ld-linux-x86-64.so.2"
_VERSION = re.compile(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?")


class CriuError(Exception):
    """CRIU is missing, too old, or failed; the message says what to do in one line."""


@dataclass(frozen=True)
class Criu:
    """A checked CRIU: how to run it, and the folder that goes first on its ``PATH``."""

    prefix: tuple[str, ...]
    version: str
    bin_dir: Path | None = None

    def command(self, *args: str) -> list[str]:
        """The command line running ``criu ARGS``."""
        return [*self.prefix, *args]

    def env(self) -> dict[str, str]:
        """The environment CRIU runs in: its wrappers first on ``PATH``, the sbin folders."""
        path = tool_path()
        if self.bin_dir is not None:
            path = f"{self.bin_dir}{os.pathsep}{path}"
        return {**os.environ, "PATH": path}


def _parse_version(text: str) -> tuple[int, int, int] | None:
    match = _VERSION.search(text)
    if match is None:
        return None
    return int(match[1]), int(match[2]), int(match[3] or 0)


def _version_of(prefix: Sequence[str]) -> tuple[int, int, int] | None:
    try:
        out = subprocess.run([*prefix, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return _parse_version(out.stdout)


def criu_root() -> Path:
    """Where Sandfork's own CRIU installs live."""
    return cache_dir() / "criu"


def _tree_prefix(tree: Path, program: str) -> tuple[str, ...]:
    libs = ":".join(str(tree / d) for d in _LIB_DIRS)
    name = Path(program).name
    return (str(tree / _LOADER), "--argv0", name, "--library-path", libs, str(tree / program))


def _resolve_in_tree(tree: Path, path: str) -> str:
    """``path`` (absolute inside ``tree``) with its symbolic links followed inside the tree."""
    for _ in range(40):
        link = tree / path.lstrip("/")
        if not link.is_symlink():
            return path
        target = os.readlink(link)
        path = target if target.startswith("/") else str(Path(path).parent / target)
    raise CriuError(f"too many symbolic links at {path} in {tree}")


def _write_wrappers(tree: Path, bin_dir: Path) -> None:
    """Scripts that run the tree's programs through its loader, found relative to where the
    scripts are (so the tree can be renamed into place after they are written)."""
    bin_dir.mkdir(exist_ok=True)
    libs = ":".join(f"$T/{d}" for d in _LIB_DIRS)
    for name in WRAPPED:
        real = _resolve_in_tree(tree, f"/usr/sbin/{name}")
        # Multi-call programs (xtables-nft-multi) choose what to be by argv[0].
        script = bin_dir / name
        script.write_text(
            '#!/bin/sh\nT="$(dirname "$0")/.."\n'
            f'exec "$T/{_LOADER}" --argv0 {name} --library-path "{libs}" "$T{real}" "$@"\n'
        )
        script.chmod(0o755)


def installed() -> Criu | None:
    """Sandfork's checked install of CRIU, if there is one."""
    root = criu_root()
    if not root.is_dir():
        return None
    found = []
    for entry in root.iterdir():
        manifest = read_manifest(entry)
        version = _parse_version(f"Version: {manifest.get('version', '')}") if manifest else None
        if version is not None and version[:2] >= MIN_VERSION:
            found.append((version, entry))
    if not found:
        return None
    version, tree = max(found)
    return Criu(_tree_prefix(tree, "usr/sbin/criu"), ".".join(map(str, version)), tree / WRAPPERS)


def system() -> Criu | None:
    """The host's own ``criu``, if it is new enough."""
    path = shutil.which("criu", path=tool_path())
    if path is None:
        return None
    version = _version_of([path])
    if version is None or version[:2] < MIN_VERSION:
        return None
    return Criu((path,), ".".join(map(str, version)))


def find() -> Criu | None:
    """A usable CRIU: the host's own if new enough, else Sandfork's install."""
    return system() or installed()


def require() -> Criu:
    """:func:`find`, or a :class:`CriuError` saying how to get one."""
    found = find()
    if found is None:
        raise CriuError(
            "no CRIU >= 4.2 is installed: as root, run `sandfork criu install` "
            "(scripts/setup.sh does)"
        )
    return found


def install(
    on_line: Callable[[str], None] | None = None,
    smoke: Callable[[Criu, Path], None] | None = None,
) -> Criu:
    """Install Debian unstable's CRIU into the cache (unless a checked one is there) and
    check it: ``criu check``, then ``smoke(criu, tree)`` (a real dump and restore of a
    sandbox over the new tree)."""
    if os.geteuid() != 0:
        raise CriuError("installing CRIU needs root (CRIU itself runs as root)")
    root = criu_root()
    with build_lock(root):
        current = installed()
        if current is not None:
            return current
        staging_final = root / "new"
        with Staging(staging_final) as staging:
            tree = staging.path
            try:
                run(
                    [
                        "mmdebstrap",
                        "--mode=root",
                        "--variant=minbase",
                        "--format=directory",
                        f"--include={','.join(PACKAGES)}",
                        # The archive may be a snapshot whose Release file is past its date.
                        '--aptopt=Acquire::Check-Valid-Until "false"',
                        SUITE,
                        str(tree),
                        apt_mirror(SUITE),
                    ],
                    what="mmdebstrap (CRIU from Debian unstable)",
                    on_line=on_line,
                )
            except TemplateError as e:
                raise CriuError(str(e).splitlines()[0]) from e
            _write_wrappers(tree, tree / WRAPPERS)
            version = _version_of(_tree_prefix(tree, "usr/sbin/criu"))
            if version is None or version[:2] < MIN_VERSION:
                raise CriuError(f"Debian {SUITE}'s criu is {version}: Sandfork needs >= 4.2")
            name = ".".join(map(str, version))
            criu = Criu(_tree_prefix(tree, "usr/sbin/criu"), name, tree / WRAPPERS)
            check(criu)
            if smoke is not None:
                smoke(criu, tree)
            staging.final = root / name
            staging.commit({"version": name, "suite": SUITE, "packages": list(PACKAGES)})
    result = installed()
    assert result is not None
    return result


def check(criu: Criu) -> None:
    """``criu check``, or a :class:`CriuError` with its first complaint."""
    result = subprocess.run(
        criu.command("check"), capture_output=True, text=True, env=criu.env(), timeout=60
    )
    if result.returncode != 0:
        lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
        raise CriuError(f"`criu check` fails on this kernel: {lines[-1] if lines else '?'}")
