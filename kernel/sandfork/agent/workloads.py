"""Where the user's work runs in the guest and what it may use: the policy over ``cgroup``.

The guest's init mounts cgroup2 at ``/sys/fs/cgroup``; at start the agent lays it out::

    agent/              the agent alone: the CPU first (cpu.weight), memory kept (memory.min)
    user/               all user work together: pids.max, memory.max, a low cpu.weight
    user/exec-<n>       one per exec (its own pids.max), removed once empty
    user/kernel-<name>  one per code-context kernel

so a fork bomb takes at most its own group's pids, never the agent's, and a timeout kills
the exec's whole group, daemons that left its process group included. PID 1 (tini) stays
in the root group, which cgroup v2 lets hold processes.
Without a cgroup root (the agent run on a host by tests) user work runs where the agent does,
stopped by its process group as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cgroup import Cgroup, CgroupError

__all__ = ["Limits", "Workloads", "active", "configure", "kill", "stopped"]

log = logging.getLogger(__name__)

CONTROLLERS = ("cpu", "memory", "pids")
# How long killed processes may take to exit before the agent goes on (under TCG one takes
# 5-15 ms; the host waits an exec's timeout plus 30 s for its reply).
KILL_GRACE_S = 20.0
# How often the groups of finished execs that left processes behind are looked at.
LINGER_CHECK_S = 1.0
# A static shell starts at once under TCG (a dynamically linked one costs 0.1-0.2 s); the
# initramfs puts busybox here.
STATIC_SHELL = "/run/sandfork/busybox"


def tasks_for_memory(mem_mb: int) -> int:
    """The processes and threads one piece of user work may have in ``mem_mb`` of memory:
    one per 2 MiB, at least 256. A fork bomb's process costs 150-250 KiB (its page tables,
    kernel stack and the pages it dirties; on a container's host two thirds of that is kernel
    memory), so a bomb at this bound holds about a tenth of the memory and never drives the
    sandbox into the out-of-memory churn in which whatever is left, the agent too, is killed;
    under TCG each of its processes takes 5-15 ms to exit when killed, so it is gone in seconds.
    """
    return max(mem_mb // 2, 256)


@dataclass(frozen=True)
class Limits:
    """What user work may use (the agent's defaults; ``for_guest`` sizes them)."""

    pids_max: int
    """Processes and threads of all user work together."""
    unit_pids_max: int
    """Of one exec, or one kernel, with everything it started."""
    agent_memory_mb: int
    """Memory user work cannot take: the agent's, and the guest kernel's headroom."""
    user_cpu_weight: int = 100
    agent_cpu_weight: int = 10000

    @classmethod
    def for_guest(cls, mem_total_mb: int, task_max: int) -> Limits:
        """Defaults for a guest with ``mem_total_mb`` of memory that can hold ``task_max``
        tasks (the smaller of ``kernel.threads-max`` and ``kernel.pid_max``).

        All user work gets the tasks but 512 (the agent's threads, kernel threads). One exec
        or kernel gets :func:`tasks_for_memory` (at most half the user's). The agent keeps an
        eighth of the memory, at least 96 MiB.
        """
        pids = max(task_max - 512, 64)
        return cls(
            pids_max=pids,
            unit_pids_max=min(tasks_for_memory(mem_total_mb), max(pids // 2, 32)),
            agent_memory_mb=max(mem_total_mb // 8, 96),
        )

    def agent_settings(self, controllers: frozenset[str]) -> dict[str, str | int]:
        """The agent group's interface files."""
        settings: dict[str, str | int] = {}
        if "cpu" in controllers:
            settings["cpu.weight"] = self.agent_cpu_weight
        if "memory" in controllers:
            settings["memory.min"] = self.agent_memory_mb * 2**20
        return settings

    def user_settings(self, controllers: frozenset[str], mem_total_mb: int) -> dict[str, str | int]:
        """The user group's interface files."""
        settings: dict[str, str | int] = {}
        if "cpu" in controllers:
            settings["cpu.weight"] = self.user_cpu_weight
        if "pids" in controllers:
            settings["pids.max"] = self.pids_max
        if "memory" in controllers:
            settings["memory.max"] = max(mem_total_mb - self.agent_memory_mb, 64) * 2**20
        return settings

    def unit_settings(self, controllers: frozenset[str]) -> dict[str, str | int]:
        """One exec's or kernel's group's interface files."""
        return {"pids.max": self.unit_pids_max} if "pids" in controllers else {}


class Workloads:
    """The groups user work runs in; without cgroups every group is None."""

    def __init__(
        self,
        user: Cgroup | None = None,
        limits: Limits | None = None,
        controllers: frozenset[str] = frozenset(),
    ) -> None:
        self._user = user
        self._limits = limits
        self._controllers = controllers
        self._shell = [STATIC_SHELL, "sh"] if os.access(STATIC_SHELL, os.X_OK) else ["/bin/sh"]
        self._serial = itertools.count(1)
        # Groups of finished execs that left processes (``server &``), with their refused
        # forks when the exec ended; removed once empty.
        self._lingering: dict[Path, tuple[Cgroup, int]] = {}
        self._watcher: asyncio.Task[None] | None = None

    @classmethod
    def setup(cls, root: Cgroup, limits: Limits | None = None) -> Workloads:
        """Lay the groups out under ``root`` (see the module) and move this process into
        ``agent``; the defaults come from the guest's size."""
        mem_total_mb = _mem_total_mb()
        limits = limits or Limits.for_guest(mem_total_mb, _task_max())
        controllers = frozenset(CONTROLLERS) & root.available()
        agent, user = root.child("agent"), root.child("user")
        agent.create()
        agent.adopt(os.getpid())
        root.enable(sorted(controllers))
        user.create()
        if not (user.path / "cgroup.kill").exists():
            raise CgroupError("cgroup.kill is missing (Linux 5.14 or later needed)")
        agent.write(limits.agent_settings(controllers))
        user.write(limits.user_settings(controllers, mem_total_mb))
        user.enable(sorted(controllers))
        log.info("user work in %s: %s", user.path, limits)
        return cls(user, limits, controllers)

    def spawn_argv(self, unit: Cgroup | None, argv: list[str]) -> list[str]:
        """``argv`` started inside ``unit`` (as is without one)."""
        return argv if unit is None else unit.spawn_argv(argv, self._shell)

    def new_exec(self) -> Cgroup | None:
        """A fresh group for one exec; the emptied groups of earlier ones are removed."""
        self._sweep()
        return self._unit(f"exec-{next(self._serial)}")

    @contextlib.contextmanager
    def exec_group(self) -> Iterator[Cgroup | None]:
        """``new_exec``'s group for the block, released after it (see ``release``)."""
        unit = self.new_exec()
        try:
            yield unit
        finally:
            self.release(unit)

    def new_kernel(self, name: str) -> Cgroup | None:
        """A fresh group for the kernel ``name``."""
        return self._unit(f"kernel-{name}")

    def release(self, unit: Cgroup | None) -> None:
        """Remove ``unit`` now if it is empty, else once it is: what a finished exec left
        (``server &``) lives on, unless it hits its pid limit (a fork bomb), then it is
        killed."""
        if unit is None or _removed(unit):
            return
        self._lingering[unit.path] = (unit, unit.events("pids").get("max", 0))
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch_lingering())

    async def _watch_lingering(self) -> None:
        while self._lingering:
            await asyncio.sleep(LINGER_CHECK_S)
            for path, (unit, refused) in self._lingering.items():
                if unit.events("pids").get("max", 0) > refused:
                    log.warning("%s: processes left behind hit the pid limit: killed", path.name)
                    unit.kill()
            self._sweep()

    def _sweep(self) -> None:
        for path, (unit, _) in list(self._lingering.items()):
            if _removed(unit):
                del self._lingering[path]

    def _unit(self, name: str) -> Cgroup | None:
        if self._user is None or self._limits is None:
            return None
        unit = self._user.child(name)
        unit.create()
        unit.write(self._limits.unit_settings(self._controllers))
        return unit


_GROUP_POLL_S = 0.02  # how often a killed group without a cgroup is looked at


def kill(pgid: int, unit: Cgroup | None) -> None:
    """SIGKILL the process group ``pgid`` and everything in ``unit``, daemons that left the
    process group included."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    if unit is not None:
        unit.kill()


async def stopped(
    leader: asyncio.Future[Any],
    unit: Cgroup | None,
    timeout: float = KILL_GRACE_S,
    pgid: int | None = None,
) -> None:
    """Wait up to ``timeout`` for a killed process (``leader``, done once it is reaped) and
    every process of its ``unit`` to be gone — without a unit (no cgroup2 here: a container
    sandbox), every process of its group ``pgid``, reaped; one stuck in the kernel is left
    behind (its group is removed once it empties)."""
    waits: list[Awaitable[Any]] = [asyncio.shield(leader)]
    if unit is not None:
        waits.append(unit.emptied())
    elif pgid is not None:
        waits.append(_group_gone(pgid))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*waits), timeout)


async def _group_gone(pgid: int) -> None:
    """Until no process of group ``pgid`` is left (zombies included: they still hold their
    pids, so a fork bomb's would keep a new command from starting), killing stragglers."""
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        await asyncio.sleep(_GROUP_POLL_S)


def _removed(unit: Cgroup) -> bool:
    try:
        return unit.remove()
    except CgroupError as exc:
        log.warning("%s", exc)
        return False


def _mem_total_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise CgroupError("no MemTotal in /proc/meminfo")


def _task_max() -> int:
    values = [int(Path(f"/proc/sys/kernel/{n}").read_text()) for n in ("threads-max", "pid_max")]
    return min(values)


_active = Workloads()


def configure(root: str | None) -> Workloads:
    """Set up the agent's groups under the cgroup2 mount ``root`` (once, at start); without
    one, or if that fails (said in the log), user work runs without groups."""
    global _active
    if root is not None:
        try:
            _active = Workloads.setup(Cgroup(root))
        except (OSError, ValueError) as exc:
            log.error("user work runs without cgroups: %s", exc)
    return _active


def active() -> Workloads:
    """The agent's groups, as ``configure`` set them up."""
    return _active
