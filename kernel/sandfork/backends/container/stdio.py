"""What a container sandbox's shim is told, and the pipes that are the sandbox's stdio.

The pipes (the guest agent's channel on 0 and 1, its console on 2, the egress channel on 3
and 4) are made by the shim; a child it forks to become the sandbox (launched or restored)
sets them as its file descriptors in :func:`child_setup`.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sandfork.backends.container.cgroups import Cgroup, Hierarchy

#: The sandbox's file descriptors, by role; CRIU matches them by the pipes' inodes.
CHANNELS = {"agent": (0, 1), "egress": (3, 4)}
CONSOLE_FD = 2


@dataclass(frozen=True)
class RestoreConfig:
    """How to restore: the CRIU image, the root's layers, the dumped pipes' inodes."""

    images: str
    links: str  # where the image files are linked for this sandbox (the same file system)
    root: str
    upper: str
    work: str
    lower: list[str]
    pipes: dict[str, int]  # fd in the sandbox -> the inode of its pipe when dumped
    criu: list[str]
    criu_path: str  # PATH for CRIU (its wrapper programs first)
    lazy: bool = True
    # image files still arriving from the snapshot store: their name -> where to read them
    served: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ShimConfig:
    """What one shim does."""

    dir: str
    cgroup: str
    sockets: dict[str, str]  # channel -> Unix socket path
    launch: dict[str, Any] | None = None  # a LaunchConfig
    restore: dict[str, Any] | None = None  # a RestoreConfig
    niceness: int = 10
    env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        """The config as the shim's argument."""
        return json.dumps(asdict(self))


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.rename(path)


class Pipes:
    """The sandbox's side (by fd number) and the shim's side of every pipe."""

    def __init__(self) -> None:
        self.sandbox: dict[int, int] = {}
        self.shim: dict[int, int] = {}
        for reads, writes in CHANNELS.values():
            r, w = os.pipe()
            self.sandbox[reads], self.shim[reads] = r, w
            r, w = os.pipe()
            self.sandbox[writes], self.shim[writes] = w, r
        r, w = os.pipe()
        self.sandbox[CONSOLE_FD], self.shim[CONSOLE_FD] = w, r

    def inodes(self) -> dict[str, int]:
        """The inode of each pipe, by the sandbox's fd (what a dump of it records)."""
        return {str(fd): os.fstat(end).st_ino for fd, end in self.sandbox.items()}

    def close_sandbox_side(self) -> None:
        for end in self.sandbox.values():
            os.close(end)


def child_setup(config: ShimConfig, pipes: Pipes, place: dict[int, int]) -> None:
    """In the forked child: join the sandbox's group, yield to the engine, set the fds."""
    Cgroup(Hierarchy.detect(), config.cgroup).join()
    os.nice(config.niceness)
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    for end in pipes.shim.values():
        os.close(end)
    for fd, end in place.items():  # two passes: a target may be another's source
        os.dup2(end, 100 + fd, inheritable=False)
    for fd in place:
        os.dup2(100 + fd, fd)
        os.close(100 + fd)
