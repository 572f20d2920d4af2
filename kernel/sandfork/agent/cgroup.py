"""cgroup v2 mechanics: make a group, set its limits, start a process in it, kill it all.

Nothing here decides which group or which limits (that is ``workloads``): the same calls
serve any cgroup v2 tree the caller may write, the guest's ``/sys/fs/cgroup`` or a subtree a
host delegates. Killing a group needs ``cgroup.kill`` (Linux 5.14).
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["Cgroup", "CgroupError"]

# How often an emptied group is checked while its killed processes exit.
_EMPTY_POLL_S = 0.01


class CgroupError(OSError):
    """A cgroup operation failed (the message names the file)."""


class Cgroup:
    """One cgroup v2 directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"Cgroup({str(self.path)!r})"

    def child(self, name: str) -> Cgroup:
        """The child group ``name`` (not created)."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"bad cgroup name {name!r}")
        return Cgroup(self.path / name)

    def create(self) -> None:
        """Make the group (nothing if it exists)."""
        try:
            self.path.mkdir(exist_ok=True)
        except OSError as exc:
            raise CgroupError(exc.errno, f"cannot create {self.path}: {exc.strerror}") from None

    def write(self, settings: Mapping[str, str | int]) -> None:
        """Write interface files, e.g. ``{"pids.max": 512, "cpu.weight": 10}``, in order."""
        for name, value in settings.items():
            self._write(name, str(value))

    def read(self, name: str) -> str:
        """An interface file's content, stripped."""
        return (self.path / name).read_text().strip()

    def enable(self, controllers: Sequence[str]) -> None:
        """Give the children ``controllers`` (``cgroup.subtree_control``); the group must
        hold no process itself (cgroup v2's no-internal-process rule) unless it is the root."""
        self._write("cgroup.subtree_control", " ".join(f"+{c}" for c in controllers))

    def available(self) -> set[str]:
        """The controllers this group may give its children."""
        return set(self.read("cgroup.controllers").split())

    def adopt(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group."""
        self._write("cgroup.procs", str(pid))

    def spawn_argv(self, argv: Sequence[str], shell: Sequence[str] = ("/bin/sh",)) -> list[str]:
        """``argv`` behind a shell that moves itself into the group, then execs ``argv``:
        nothing of ``argv`` runs (or forks) outside the group. Fails with exit status 125
        if the move fails. ``shell`` runs a POSIX sh (a static one starts fastest)."""
        script = 'echo $$ >"$0/cgroup.procs" || exit 125; exec "$@"'
        return [*shell, "-c", script, str(self.path), *argv]

    def events(self, controller: str) -> dict[str, int]:
        """The counters of ``<controller>.events`` (``cgroup``: ``populated``, ``frozen``;
        ``pids``: ``max``, the forks refused by ``pids.max``); empty if the group is gone."""
        try:
            text = self.read(f"{controller}.events")
        except FileNotFoundError:
            return {}
        return {key: int(value) for key, value in (line.split() for line in text.splitlines())}

    def populated(self) -> bool:
        """Whether a process lives in the group or below it."""
        return self.events("cgroup").get("populated", 0) == 1

    def pids(self) -> list[int]:
        """The processes in the group itself (not below)."""
        try:
            return [int(p) for p in self.read("cgroup.procs").split()]
        except FileNotFoundError:
            return []

    def kill(self) -> None:
        """SIGKILL every process in the group and below, including ones forking meanwhile."""
        try:
            self._write("cgroup.kill", "1")
        except CgroupError as exc:
            if exc.errno != errno.ENOENT:  # gone already: nothing to kill
                raise

    async def emptied(self) -> None:
        """Wait until no process is left in the group (after ``kill``, they go in
        milliseconds; an exiting process is reaped by its parent or PID 1)."""
        while self.populated():
            await asyncio.sleep(_EMPTY_POLL_S)

    def remove(self) -> bool:
        """Remove the (empty) group and its empty children; False if a process lives in it."""
        if not self.path.is_dir():
            return True
        for sub in [p for p in self.path.iterdir() if p.is_dir()]:
            if not Cgroup(sub).remove():
                return False
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return False
            raise CgroupError(exc.errno, f"cannot remove {self.path}: {exc.strerror}") from None
        return True

    def _write(self, name: str, value: str) -> None:
        path = self.path / name
        try:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, value.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            raise CgroupError(
                exc.errno, f"cannot write {value!r} to {path}: {exc.strerror}"
            ) from None
