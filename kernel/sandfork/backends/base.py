"""The interface every sandbox backend implements; the engine sees nothing else of a backend.

A backend runs sandboxes (a QEMU VM each, or a process tree in its own namespaces) and owns
how they are captured: what a snapshot's state folder holds, what its disk and memory
layers are, how a snapshot travels in an export. The engine keeps the records, the layer
chains (which layer lies over which, and which are still used) and the rules above them;
it hands the backend paths and gets back typed answers (:class:`MachineSpec`,
:class:`Captured`, :class:`Capture`), never reaching into a backend's files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sandfork.backends.agent_link import AgentLink
from sandfork.templates import BuiltTemplate


@dataclass(frozen=True)
class MachineSpec:
    """What a sandbox is made of; a snapshot restores only into the same spec.

    The engine reads the backend's name and the resources; ``details`` belongs to the
    backend (a VM's kernel, initramfs and command line; a container's tree) and is kept
    with sandboxes and snapshots as it is.
    """

    backend: str
    memory_mb: int
    cpu: int  # vCPUs of a VM, CPUs' worth of time of a container
    accelerator: str  # how it runs: "kvm" or "tcg" for a VM, "native" for a container
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-able data (the engine stores it)."""
        # "cpus": the stored name, which sandboxes, snapshots, exports and the boot captures'
        # keys of earlier engines carry.
        common = {"backend": self.backend, "memory_mb": self.memory_mb, "cpus": self.cpu}
        return {**self.details, **common, "accelerator": self.accelerator}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MachineSpec:
        """The spec :meth:`to_dict` wrote (records from before backends had names are VMs)."""
        common = {"backend", "memory_mb", "cpus", "accelerator"}
        return cls(
            backend=str(data.get("backend", "vm")),
            memory_mb=int(data["memory_mb"]),
            cpu=int(data["cpus"]),
            accelerator=str(data["accelerator"]),
            details={k: v for k, v in data.items() if k not in common},
        )


class DiskImages(Protocol):
    """A backend's disk layers: copy-on-write layers in chains down to a template's image."""

    suffix: str  # how the names of its layers end

    def create_overlay(self, base: Path, overlay: Path) -> None:
        """Make ``overlay`` an empty copy-on-write layer over ``base``."""

    def backing_chain(self, image: Path) -> list[Path]:
        """``image`` and the layers below it, top first (the template's image last)."""

    def rebase(self, layer: Path, backing: Path) -> None:
        """Point ``layer`` at a new layer below it (its contents unchanged)."""


@dataclass(frozen=True)
class StartPoint:
    """What a sandbox starts from: a capture's state folder (``None``: it boots), its spec,
    its disk (the layer to put the sandbox's own over) and its memory chain (top first; empty
    when the memory is in the state folder or the sandbox boots). ``served``: files of the
    state folder (by their path in it) still arriving from the snapshot store, to be read
    from these paths instead, where each read waits for what it needs (see
    :attr:`Backend.fetched_lazily`)."""

    dir: Path | None
    spec: MachineSpec
    disk: Path
    memory: list[Path]
    served: Mapping[str, Path] = field(default_factory=dict)

    @classmethod
    def boot(cls, spec: MachineSpec, disk: Path) -> StartPoint:
        """A cold boot of ``spec`` over ``disk``: no capture to restore."""
        return cls(None, spec, disk, [])


@dataclass(frozen=True)
class CaptureRequest:
    """What the engine gives a capture: where the sandbox's disk and memory are now, and how
    to register the new layers the capture makes (:meth:`sandfork.engine.snapshot_store.
    SnapshotStore.new_layer`: owned from that moment, collected if never used)."""

    disk: Path
    memory: list[Path]
    new_layer: Callable[[Path | None, str], Path]  # (backing, suffix) -> path to create
    defer_memory: bool = False  # a large memory layer may be written after the capture returns


@dataclass(frozen=True)
class Captured:
    """How a capture went.

    ``disk`` is the snapshot's (frozen) disk layer and ``sandbox_disk`` the one the sandbox
    writes from now on (a VM moves onto a new overlay; a container keeps its layer and the
    snapshot gets a copy). ``memory`` is the snapshot's memory layer, lying over
    ``memory_backing`` (``None``: it stands alone), or ``None`` when the memory is in the
    state folder; ``sandbox_memory`` is what the sandbox's memory matches now.
    ``memory_written``, if set, is still writing the memory layer (asked for with
    ``CaptureRequest.defer_memory``): it returns the layer's backing once the file is complete.
    """

    paused: float
    disk: Path
    sandbox_disk: Path
    memory: Path | None = None
    memory_backing: Path | None = None
    sandbox_memory: Path | None = None
    layers: tuple[Path, ...] = ()  # every layer the capture registered
    memory_written: Awaitable[Path | None] | None = None


class Instance(Protocol):
    """One running sandbox as a backend sees it."""

    pid: int
    agent: AgentLink

    def is_alive(self) -> bool:
        """True while the sandbox runs."""

    def failure_reason(self) -> str:
        """Why the sandbox stopped, for the person who asks."""

    def memory_bytes(self) -> int:
        """Memory a capture of the sandbox would have to store, in bytes."""

    async def open_egress(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Open the sandbox's egress channel: the byte stream its guest relays its proxy
        connections over (docs/agent-protocol.md); the engine reopens it after a loss."""

    async def disk_chain(self) -> list[Path]:
        """The sandbox's disk as it really is now: the written layer first."""

    async def resumed(self) -> None:
        """Called once a restored sandbox runs: refresh what its capture froze (clock,
        entropy) where the sandbox does not share them with the host."""

    def console_path(self) -> Path:
        """The file the sandbox's console is written to (cut by the backend as it grows)."""

    async def freeze(self) -> None:
        """Stop every process of the sandbox where it is, its memory kept, until :meth:`thaw`
        (a backend's adopt lets a frozen sandbox go on)."""

    async def thaw(self) -> None:
        """Let a frozen sandbox go on (its clock refreshed where it keeps its own)."""

    async def snapshot(self, dest: Path, request: CaptureRequest) -> Captured:
        """Capture the running sandbox at one instant: its state into the folder ``dest``,
        its disk and memory into layers made with ``request.new_layer``; it runs on."""

    async def destroy(self) -> None:
        """Stop the sandbox and delete everything it owns but its disk layers."""


class Backend(Protocol):
    """Creates sandboxes from templates and snapshots, and re-attaches to running ones."""

    name: str
    memory_suffix: str | None  # how memory layers' names end (None: it makes none)
    captures_in_memory: bool  # whether a fork's short-lived capture may live in RAM
    shares_memory: bool  # whether sandboxes restored from one capture share its pages
    # Files of a state folder (glob patterns of their path in it) a restore may read while
    # they are fetched (StartPoint.served): read by page as the sandbox needs them, and
    # read no more once it runs.
    fetched_lazily: tuple[str, ...]

    @property
    def images(self) -> DiskImages:
        """Its disk layers."""

    @property
    def accelerator(self) -> str:
        """How sandboxes run (``kvm``, ``tcg``, ``native``)."""

    @property
    def isolation(self) -> str:
        """What separates a sandbox from the host: ``vm`` or ``container``."""

    def machine_key(self) -> str:
        """What saved sandbox states depend on besides their spec (the hypervisor's or
        CRIU's build): a state only restores where this is the same."""

    def spec(self, template: BuiltTemplate, memory_mb: int, cpu: int) -> MachineSpec:
        """The spec of a sandbox of ``template`` with these resources."""

    def base_disk(self, template: BuiltTemplate) -> Path:
        """The template's image that sandboxes' disk chains end with."""

    async def create(
        self,
        spec: MachineSpec,
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
        start: StartPoint,
        directory: Path,
        disk: Path,
        spawned: Callable[[int], None] | None = None,
        *,
        host_access: bool = False,
    ) -> Instance:
        """Start a sandbox resuming ``start`` on ``disk`` (a fresh layer over
        ``start.disk``)."""

    async def boot_capture(self, spec: MachineSpec, template: BuiltTemplate, dest: Path) -> None:
        """Boot a sandbox of ``spec`` on the template's image, start its default kernel,
        capture it into the empty folder ``dest`` and stop it: what new sandboxes of the
        template start from (the folder is renamed into place after)."""

    def capture_at(self, directory: Path, spec: MachineSpec) -> StartPoint:
        """The boot capture in ``directory`` as new sandboxes start from it."""

    def capture_files(self, directory: Path) -> tuple[list[Path], Path]:
        """A boot capture's files (their sizes are checked before each use) and the one whose
        checksum is checked too."""

    async def adopt(self, directory: Path, disk: Path, pid: int) -> Instance:
        """Re-attach to a sandbox an earlier engine process started."""

    def release(self, directory: Path) -> None:
        """Delete what a sandbox whose processes are gone still holds (all but its disk)."""

    def sweep(self, root: Path, keep: set[str]) -> list[str]:
        """Stop and delete the sandboxes under ``root`` not named in ``keep`` (left by an
        engine that was killed); returns a line for each thing removed."""

    def unavailable(self) -> str | None:
        """Why this backend cannot run sandboxes here (one line), or ``None`` when it can."""
