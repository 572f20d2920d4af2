"""Restoring a container sandbox from a CRIU image, in its shim.

``criu restore --root`` runs in a throwaway mount namespace where the sandbox's overlay is
mounted, the image's pipes replaced by the shim's new ones with ``--inherit-fd``; memory pages
are served lazily by our lazy-pages server (:mod:`.lazy_pages`) as they are touched (and in
the background).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from sandfork.backends.container import lazy_pages
from sandfork.backends.container.launcher import mount, overlay_options
from sandfork.backends.container.stdio import Pipes, RestoreConfig, ShimConfig, child_setup

WORK = "criu"  # a restored sandbox's CRIU working folder, in the sandbox's own
_CLONE_NEWNS = 0x00020000
_MS_REC, _MS_PRIVATE = 0x4000, 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class Lazy:
    """The lazy-pages server (:mod:`.lazy_pages`) feeding a restored sandbox's memory, and
    its image folder."""

    pid: int
    images: Path

    def kill(self) -> None:
        """Stop it at once (it may have ended already; its pid is reaped by the shim)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def restore(config: ShimConfig, pipes: Pipes, directory: Path) -> tuple[int, Lazy | None]:
    """Restore the sandbox from its image; returns the restored PID 1's pid and the lazy-pages
    server still feeding it."""
    assert config.restore is not None
    restore = RestoreConfig(**config.restore)
    images = _private_images(Path(restore.images), Path(restore.links), restore.served)
    env = {**os.environ, "PATH": restore.criu_path}
    inherit = []
    fds = {}
    for fd, inode in restore.pipes.items():
        slot = 10 + int(fd)
        fds[slot] = pipes.sandbox[int(fd)]
        inherit += ["--inherit-fd", f"fd[{slot}]:pipe:[{inode}]"]
    work = directory / WORK
    work.mkdir(exist_ok=True)
    command = [*restore.criu, "restore", "-D", str(images), "-W", str(work), "-o", "restore.log"]
    command += ["--root", restore.root, "--restore-detached", "--pidfile", str(work / "init.pid")]
    command += ["--tcp-established", "--manage-cgroups=ignore", *inherit]
    lazy: int | None = None
    try:
        if restore.lazy:
            lazy = lazy_pages.start(images, work)
            command.append("--lazy-pages")
        pid = _run_restore(config, pipes, fds, restore, command, env, work / "restore.log")
    except BaseException:
        if lazy is not None:  # nothing will ask it for pages now
            os.kill(lazy, signal.SIGKILL)
            os.waitpid(lazy, 0)
        raise
    if lazy is None:
        shutil.rmtree(images, ignore_errors=True)
        return pid, None
    return pid, Lazy(lazy, images)


def _run_restore(
    config: ShimConfig,
    pipes: Pipes,
    fds: dict[int, int],
    restore: RestoreConfig,
    command: list[str],
    env: dict[str, str],
    log: Path,
) -> int:
    """Run ``criu restore`` in a throwaway mount namespace where the root is mounted; the pid
    of the restored PID 1."""
    options = overlay_options(restore.upper, restore.work, restore.lower)
    child = os.fork()
    if child == 0:
        try:
            child_setup(config, pipes, fds)
            if _libc.unshare(_CLONE_NEWNS) != 0:
                raise OSError(ctypes.get_errno(), "cannot make a mount namespace")
            mount(None, "/", None, _MS_REC | _MS_PRIVATE)
            mount("overlay", restore.root, "overlay", 0, options)
            os.execve(command[0], command, env)
        except BaseException as e:
            print(f"sandfork shim: restoring failed: {e}", file=sys.stderr)
        finally:
            os._exit(127)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        text = log.read_text(errors="replace") if log.exists() else ""
        errors = [line for line in text.splitlines() if "Error" in line][-3:]
        raise RuntimeError("criu restore failed: " + (" | ".join(errors) or f"status {status}"))
    return int((log.parent / "init.pid").read_text())


def _private_images(source: Path, target: Path, served: dict[str, str]) -> Path:
    """The image files hard-linked (copied across file systems) into a folder of the
    sandbox's own, so the snapshot may be deleted while pages are still read from them;
    those still arriving from the snapshot store (``served``) linked to where they are
    served (their server keeps them open as long as they are read). Those links are
    relative: CRIU opens some images after it changed its root to the sandbox's."""
    target.mkdir()
    for entry in source.iterdir():
        if entry.name in served:
            os.symlink(os.path.relpath(served[entry.name], target), target / entry.name)
            continue
        try:
            os.link(entry, target / entry.name)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            shutil.copy2(entry, target / entry.name)
    return target
