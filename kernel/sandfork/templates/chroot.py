"""Run commands inside a directory tree with ``chroot``, and remove such trees safely.

A tree being built may have ``/proc`` (or anything else) mounted inside it. Removing it with
``shutil.rmtree`` while something is mounted would descend into the host's files, so
``safe_rmtree`` unmounts everything below the tree first and refuses if that fails.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from . import fakechroot
from .errors import TemplateError
from .proc import Result, run

__all__ = [
    "DEV_NODES",
    "chroot_env",
    "chroot_mounts",
    "kill_processes_using",
    "mounts_under",
    "processes_using",
    "run_in_chroot",
    "safe_rmtree",
]

#: Host environment variables passed into the chroot (a proxy configuration, if any).
PASSED_ENV = (
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
)


def _unescape(field: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo (octal).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path``, deepest first."""
    root = os.path.realpath(path)
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 5:
                    continue
                mp = _unescape(fields[4])
                if mp == root or mp.startswith(root.rstrip("/") + "/"):
                    found.append(Path(mp))
    except OSError:
        return []
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def _umount(mp: Path) -> None:
    if run(["umount", str(mp)], check=False).returncode != 0:
        run(["umount", "--lazy", str(mp)], what=f"unmounting {mp}")


def unmount_all_under(path: Path) -> None:
    """Unmount everything mounted at or below ``path`` (lazily if busy)."""
    for _ in range(3):  # a mount may hide another one below it
        mps = mounts_under(path)
        if not mps:
            return
        for mp in mps:
            _umount(mp)


def _inside(link: str, root: str) -> bool:
    return link == root or link.startswith(root + "/")


def processes_using(path: Path) -> list[int]:
    """PIDs (not ours) whose root, working directory or command line is inside ``path``:
    a chroot'ed dpkg, a debootstrap writing into the tree."""
    root = os.path.realpath(path).rstrip("/")
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            links = [os.readlink(f"/proc/{entry.name}/{n}") for n in ("root", "cwd")]
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone, or not ours to inspect
        if any(_inside(x, root) for x in links) or any(root in a for a in args):
            found.append(int(entry.name))
    return found


def kill_processes_using(path: Path) -> list[int]:
    """SIGKILL every process using ``path`` (see ``processes_using``) and wait for them.

    For leftovers of a builder that died (SIGKILL, OOM): its commands run on, orphaned.
    """
    killed: list[int] = []
    for _ in range(50):
        pids = processes_using(path)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)
    return sorted(set(killed))


def safe_rmtree(path: Path, *, kill_users: bool = False) -> None:
    """Remove ``path`` recursively, first unmounting anything mounted inside it.

    With ``kill_users``, processes still working inside it are killed first (only for
    directories no live build owns: stale leftovers, or our own failed build). A tree an
    ordinary user's build left owned by its subordinate ids is removed from inside a user
    namespace.
    """
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    if kill_users:
        kill_processes_using(path)
    unmount_all_under(path)
    left = mounts_under(path)
    if left:
        raise TemplateError(
            f"refusing to delete {path}: still mounted inside it: {', '.join(map(str, left))}"
        )
    try:
        shutil.rmtree(path)
    except PermissionError:
        if os.geteuid() == 0:
            raise
        from .userns import remove_tree

        remove_tree(path)


def chroot_env() -> dict[str, str]:
    """A clean environment for commands run in the chroot (host proxy settings passed on)."""
    env = {
        "PATH": "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "DEBIAN_FRONTEND": "noninteractive",
        "TERM": "dumb",
    }
    for var in PASSED_ENV:
        if var in os.environ:
            env[var] = os.environ[var]
    return env


#: Device nodes bound into a tree that has none (made in a user namespace, which cannot
#: create device nodes); the image needs none (the guest's init mounts devtmpfs).
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")


@contextmanager
def chroot_mounts(tree: Path) -> Iterator[None]:
    """Mount ``/proc`` in ``tree`` for the duration, and bind the host's ``DEV_NODES`` over
    any the tree lacks; always unmounted (and placeholders removed) afterwards. Nothing
    under fakechroot, which cannot mount: the host's ``/proc`` and ``/dev`` show through."""
    if fakechroot.active():
        yield
        return
    proc_dir = tree / "proc"
    proc_dir.mkdir(exist_ok=True)
    bound: list[Path] = []
    made: list[Path] = []
    run(["mount", "-t", "proc", "proc", str(proc_dir)], what="mounting /proc in the chroot")
    try:
        for name in DEV_NODES:
            node = tree / "dev" / name
            if os.path.lexists(node):
                if node.is_char_device():
                    continue
                node.unlink()  # not a node: replaced by one for the build
            node.parent.mkdir(exist_ok=True)
            node.touch()
            made.append(node)
            run(["mount", "--bind", f"/dev/{name}", str(node)], what=f"binding /dev/{name}")
            bound.append(node)
        yield
    finally:
        for path in [*bound, proc_dir]:
            unmount_all_under(path)
        for node in made:
            node.unlink(missing_ok=True)


def run_in_chroot(
    tree: Path,
    args: Sequence[str],
    *,
    what: str,
    input: str | bytes | None = None,
    on_line: Callable[[str], None] | None = None,
) -> Result:
    """Run ``args`` inside ``tree`` (which must have its mounts set up by the caller)."""
    env = chroot_env()
    if fakechroot.active():
        env |= fakechroot.chroot_env(tree)
    return run(["chroot", str(tree), *args], what=what, env=env, input=input, on_line=on_line)
