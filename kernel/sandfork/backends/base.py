"""The interface every sandbox backend implements."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sandfork.backends.agent_link import AgentLink
from sandfork.templates import BuiltTemplate


class DiskImages(Protocol):
    """A backend's disk images: copy-on-write layers in chains."""

    def create_overlay(self, base: Path, overlay: Path) -> None:
        """Make ``overlay`` a copy-on-write layer over ``base``."""

    def backing_chain(self, image: Path) -> list[Path]:
        """``image`` and the images below it, top first."""

    def virtual_size(self, image: Path) -> int:
        """The size of the disk ``image`` holds, in bytes."""

    def rebase(self, layer: Path, backing: Path) -> None:
        """Point ``layer`` at a new backing image (its contents unchanged)."""

    def check_layer(self, layer: Path, max_virtual_size: int) -> None:
        """Raise ``ValueError`` (saying why) unless ``layer``, from an untrusted file, is
        safe to use as a layer of a disk of at most ``max_virtual_size`` bytes."""


@dataclass(frozen=True)
class Captured:
    """How a capture went: how long the sandbox was paused, and the memory layer the new
    one lies over (``None``: the new layer stands alone)."""

    paused: float
    memory_backing: Path | None


class Instance(Protocol):
    """One running sandbox as a backend sees it."""

    pid: int
    agent: AgentLink

    def is_alive(self) -> bool:
        """True while the sandbox runs."""

    def failure_reason(self) -> str:
        """Why the sandbox stopped, for the person who asks."""

    def memory_bytes(self) -> int:
        """Guest memory the sandbox has touched, in bytes."""

    async def open_egress(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Open the sandbox's egress channel: the byte stream its guest relays its proxy
        connections over (docs/agent-protocol.md); the engine reopens it after a loss."""

    async def disk_chain(self) -> list[Path]:
        """The sandbox's disk as it really is open now: the written layer first."""

    async def snapshot(
        self, dest: Path, new_disk: Path, new_memory: Path, memory: list[Path]
    ) -> Captured:
        """Capture the running sandbox: its device state into ``dest``, its disk (the
        layer freezes, later writes go to ``new_disk``) and its memory into ``new_memory``,
        stored as what changed since ``memory`` (the memory chain, top first, that the
        sandbox matched when it started or was last captured; empty: it booted)."""

    async def destroy(self) -> None:
        """Stop the sandbox and delete everything it owns but its disk."""


class Backend(Protocol):
    """Creates sandboxes from templates and snapshots, and re-attaches to running ones."""

    name: str

    @property
    def images(self) -> DiskImages:
        """Its disk images."""

    def flatten_memory(self, chain: list[Path], out: Path, memory_mb: int) -> None:
        """Write the memory of a ``memory_mb`` guest that ``chain`` describes as one full
        image at ``out``."""

    def machine_key(self) -> str:
        """What saved sandbox states depend on besides their spec (the hypervisor's build
        and its device model): a state only restores where this is the same."""

    @property
    def accelerator(self) -> str:
        """How sandboxes are run (for example ``tcg`` or ``kvm``)."""

    def spec(self, template: BuiltTemplate, memory_mb: int, cpus: int) -> dict[str, Any]:
        """The description of a sandbox of ``template``; kept with its snapshots."""

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
        is told the process id as soon as there is one. Its network reaches nothing but
        the egress channel (:meth:`Instance.open_egress`) unless ``host_access``."""

    async def restore(
        self,
        spec: dict[str, Any],
        snapshot: Path,
        memory: list[Path],
        directory: Path,
        disk: Path,
        spawned: Callable[[int], None] | None = None,
        *,
        host_access: bool = False,
    ) -> Instance:
        """Start a sandbox resuming the snapshot in ``snapshot`` on ``disk``, its memory
        the chain ``memory`` (top first)."""

    async def adopt(self, directory: Path, disk: Path, pid: int) -> Instance:
        """Re-attach to a sandbox an earlier engine process started."""

    def release(self, directory: Path) -> None:
        """Delete what a sandbox whose process is gone still holds (all but its disk)."""

    def sweep(self, root: Path, keep: set[str]) -> list[str]:
        """Stop and delete the sandboxes under ``root`` not named in ``keep`` (left by an
        engine that was killed); returns a line for each thing removed."""
