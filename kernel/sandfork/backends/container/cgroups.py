"""The control group of each container sandbox: its memory, process and CPU limits.

cgroup v2 where the unified hierarchy has the memory and pids controllers (a normal Linux
host today); otherwise the v1 ``memory``, ``pids`` and ``cpu`` hierarchies (hosts that keep
them in v1, as this project's CI machine does). Either way a sandbox's group is
``sandfork/<engine>/<sandbox>`` in each hierarchy, so an engine finds its own groups again
after a restart and removes the ones no sandbox owns.

The processes of a sandbox join its group before they run anything (the shim's child writes
``0``, "myself", into each ``cgroup.procs``), so every process the sandbox ever makes is
counted, and :meth:`Cgroup.kill` ends them all.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandfork.agent.workloads import tasks_for_memory

ROOT = Path("/sys/fs/cgroup")
_V1 = ("memory", "pids", "cpu", "freezer")
_V2_NEEDED = {"memory", "pids"}
CPU_WEIGHT = 25  # of 100 (v2; v1 shares scale it): sandboxes yield to the engine
CPU_PERIOD_US = 100_000  # the quota's period: a sandbox of N CPUs runs N periods' worth in each
_REMOVE_WAIT_S = 5.0
_FREEZE_WAIT_S = 30.0  # a group of thousands of tasks under load takes a while
#: Tasks of a sandbox beyond its user work's (tini, the agent's and its kernels' threads):
#: a container has one group for both, where a VM's guest gives user work groups of its own.
AGENT_TASKS = 256


def _v2_root() -> Path | None:
    for candidate in (ROOT, ROOT / "unified"):
        try:
            controllers = set((candidate / "cgroup.controllers").read_text().split())
        except OSError:
            continue
        if _V2_NEEDED <= controllers:
            return candidate
    return None


@dataclass(frozen=True)
class Hierarchy:
    """Where this host keeps its controllers: one v2 directory, or one per v1 controller."""

    v2: Path | None
    v1: dict[str, Path]

    @classmethod
    def detect(cls) -> Hierarchy:
        """The host's cgroup layout (v2 preferred)."""
        v2 = _v2_root()
        if v2 is not None:
            return cls(v2, {})
        v1 = {name: ROOT / name for name in _V1 if (ROOT / name / "cgroup.procs").exists()}
        return cls(None, v1)

    def usable(self) -> str | None:
        """Why sandboxes cannot get limits here, or ``None`` when they can."""
        if self.v2 is None and not {"memory", "pids"} <= set(self.v1):
            return "no cgroup hierarchy has the memory and pids controllers"
        top = self.v2 if self.v2 is not None else self.v1["memory"]
        if not os.access(top, os.W_OK):
            return f"cannot create control groups in {top} (run the engine as root)"
        return None

    def dirs(self, relative: str) -> list[Path]:
        """The directories of the group ``relative`` in every hierarchy."""
        if self.v2 is not None:
            return [self.v2 / relative]
        return [root / relative for root in self.v1.values()]

    def groups(self, relative: str) -> list[str]:
        """The names of the groups directly under ``relative`` (in any hierarchy)."""
        names: set[str] = set()
        for directory in self.dirs(relative):
            with contextlib.suppress(OSError):
                names.update(p.name for p in directory.iterdir() if p.is_dir())
        return sorted(names)


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use."""

    memory_bytes: int
    pids: int
    cpu: int  # CPUs' worth of time in each period, as a VM of that many vCPUs has at most

    @classmethod
    def for_sandbox(cls, memory_mb: int, cpu: int) -> Limits:
        """A sandbox of ``memory_mb`` and ``cpu`` CPUs: that memory and CPU time, and as many
        tasks as one VM exec may have in it (:func:`~sandfork.agent.workloads.
        tasks_for_memory`) plus :data:`AGENT_TASKS`.

        The agent shares the group with user work, and where the host gives root no
        ``CAP_SYS_RESOURCE`` (this CI machine) it cannot make itself the OOM killer's last
        pick: with 4096 tasks a fork bomb's kernel memory alone filled a 512 MiB sandbox and
        the killer, having killed the bomb's processes faster than they exit, took the agent.
        """
        return cls(memory_mb * 2**20, tasks_for_memory(memory_mb) + AGENT_TASKS, cpu)


class Cgroup:
    """One sandbox's group, in every hierarchy."""

    def __init__(self, hierarchy: Hierarchy, relative: str) -> None:
        self.hierarchy = hierarchy
        self.relative = relative
        self.dirs = hierarchy.dirs(relative)

    def create(self, limits: Limits) -> None:
        """Make the group (and its parents) with ``limits``."""
        h = self.hierarchy
        if h.v2 is not None:
            _enable_v2(h.v2, self.relative)
            self.dirs[0].mkdir(exist_ok=True)
            _write(self.dirs[0] / "memory.max", str(limits.memory_bytes))
            with contextlib.suppress(OSError):  # no swap here is fine
                _write(self.dirs[0] / "memory.swap.max", "0")
            _write(self.dirs[0] / "pids.max", str(limits.pids))
            with contextlib.suppress(OSError):  # a host without the cpu controller
                _write(self.dirs[0] / "cpu.weight", str(CPU_WEIGHT))
                _write(self.dirs[0] / "cpu.max", f"{limits.cpu * CPU_PERIOD_US} {CPU_PERIOD_US}")
            return
        for name, root in h.v1.items():
            directory = root / self.relative
            directory.mkdir(parents=True, exist_ok=True)
            if name == "memory":
                _write(directory / "memory.limit_in_bytes", str(limits.memory_bytes))
            elif name == "pids":
                _write(directory / "pids.max", str(limits.pids))
            elif name == "cpu":
                _write(directory / "cpu.shares", str(1024 * CPU_WEIGHT // 100))
                _write(directory / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(directory / "cpu.cfs_quota_us", str(limits.cpu * CPU_PERIOD_US))

    def join(self) -> None:
        """Move the calling process into the group (its children follow)."""
        for directory in self.dirs:
            _write(directory / "cgroup.procs", "0")

    def pids(self) -> set[int]:
        """The processes in the group."""
        found: set[int] = set()
        for directory in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        return found

    def memory_bytes(self) -> int:
        """Memory the group uses now."""
        for name in ("memory.current", "memory.usage_in_bytes"):
            for directory in self.dirs:
                with contextlib.suppress(OSError, ValueError):
                    return int((directory / name).read_text())
        return 0

    def freeze(self, frozen: bool) -> None:
        """Freeze every process of the group where it is (or thaw them); returns once the
        kernel says it is done."""
        if self.hierarchy.v2 is not None:
            _write(self.dirs[0] / "cgroup.freeze", "1" if frozen else "0")
            events = self.dirs[0] / "cgroup.events"
            done = f"frozen {int(frozen)}"
            _wait_for(lambda: done in events.read_text().splitlines(), f"{events}: {done}")
            return
        freezer = self.hierarchy.v1.get("freezer")
        if freezer is None:
            raise OSError(errno.ENOTSUP, "this host has no freezer control group")
        state, wanted = freezer / self.relative / "freezer.state", "FROZEN" if frozen else "THAWED"
        _write(state, wanted)
        _wait_for(lambda: state.read_text().strip() == wanted, f"{state}: {wanted}")

    def kill(self) -> None:
        """SIGKILL every process in the group (frozen first where v1 allows, so none forks
        meanwhile)."""
        if self.hierarchy.v2 is not None:
            with contextlib.suppress(OSError):
                _write(self.dirs[0] / "cgroup.kill", "1")
                return
        freezer = self.hierarchy.v1.get("freezer")
        state = freezer / self.relative / "freezer.state" if freezer else None
        if state is not None and not state.exists():
            state = None
        try:
            for _ in range(100):
                if state is not None:
                    with contextlib.suppress(OSError):
                        _write(state, "FROZEN")  # none forks while we kill
                pids = self.pids()
                if not pids:
                    return
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                if state is not None:
                    with contextlib.suppress(OSError):
                        _write(state, "THAWED")  # SIGKILL is delivered to thawed tasks
                time.sleep(0.01)
        finally:
            if state is not None:
                with contextlib.suppress(OSError):
                    _write(state, "THAWED")  # a group is never left frozen

    def remove(self) -> None:
        """Kill what is left and delete the group (waiting briefly for the last exits)."""
        self.kill()
        deadline = time.monotonic() + _REMOVE_WAIT_S
        for directory in self.dirs:
            while directory.exists():
                try:
                    directory.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)


def _enable_v2(root: Path, relative: str) -> None:
    """Enable the memory, pids and cpu controllers on the way down to ``relative``."""
    current = root
    for part in Path(relative).parts[:-1]:
        available = set((current / "cgroup.controllers").read_text().split())
        wanted = " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in available)
        with contextlib.suppress(OSError):
            _write(current / "cgroup.subtree_control", wanted)
        current = current / part
        current.mkdir(exist_ok=True)
    available = set((current / "cgroup.controllers").read_text().split())
    wanted = " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in available)
    _write(current / "cgroup.subtree_control", wanted)


def _wait_for(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _FREEZE_WAIT_S
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the kernel did not get to {what} within {_FREEZE_WAIT_S:g} s")
        time.sleep(0.005)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)
