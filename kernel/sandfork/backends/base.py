"""The interface every sandbox backend implements."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from sandfork.backends.channel import AgentChannel
from sandfork.templates import BuiltTemplate


class Instance(Protocol):
    """One running sandbox as a backend sees it."""

    pid: int
    agent: AgentChannel

    def is_alive(self) -> bool:
        """True while the sandbox runs."""

    def failure_reason(self) -> str:
        """Why the sandbox stopped, for the person who asks."""

    def memory_bytes(self) -> int:
        """Guest memory the sandbox has touched, in bytes."""

    async def disk_chain(self) -> list[Path]:
        """The sandbox's disk as it really is open now: the written layer first."""

    async def snapshot(self, dest: Path, new_disk: Path) -> float:
        """Capture the running sandbox into ``dest`` (its disk layer freezes, later writes
        go to ``new_disk``); return how long it was paused, in seconds."""

    async def destroy(self) -> None:
        """Stop the sandbox and delete everything it owns but its disk."""


class Backend(Protocol):
    """Creates sandboxes from templates and snapshots, and re-attaches to running ones."""

    name: str

    @property
    def accelerator(self) -> str:
        """How sandboxes are run (for example ``tcg`` or ``kvm``)."""

    def spec(self, template: BuiltTemplate, memory_mb: int, cpus: int) -> dict[str, Any]:
        """The description of a sandbox of ``template``; kept with its snapshots."""

    def new_disk(self, base: Path, disk: Path) -> None:
        """Create ``disk`` as a copy-on-write layer over ``base``."""

    async def create(
        self,
        spec: dict[str, Any],
        directory: Path,
        disk: Path,
        spawned: Callable[[int], None] | None = None,
        *,
        host_access: bool = False,
    ) -> Instance:
        """Boot a sandbox of ``spec`` on ``disk``, its files in ``directory``; ``spawned``
        is told the process id as soon as there is one. Its network reaches only the
        engine's egress proxy unless ``host_access``."""

    async def restore(
        self,
        spec: dict[str, Any],
        snapshot: Path,
        directory: Path,
        disk: Path,
        spawned: Callable[[int], None] | None = None,
        *,
        host_access: bool = False,
    ) -> Instance:
        """Start a sandbox resuming the snapshot in ``snapshot`` on ``disk``."""

    async def adopt(self, directory: Path, disk: Path, pid: int) -> Instance:
        """Re-attach to a sandbox an earlier engine process started."""

    def release(self, directory: Path) -> None:
        """Delete what a sandbox whose process is gone still holds (all but its disk)."""

    def sweep(self, root: Path, keep: set[str]) -> list[str]:
        """Stop and delete the sandboxes under ``root`` not named in ``keep`` (left by an
        engine that was killed); returns a line for each thing removed."""
