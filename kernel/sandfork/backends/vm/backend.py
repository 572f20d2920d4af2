"""The VM backend: each sandbox is a QEMU virtual machine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandfork.backends.vm.accel import Accelerator, detect_accelerator
from sandfork.backends.vm.images import Qcow2Images
from sandfork.backends.vm.machine import Machine, kill_process, qemu_processes, release
from sandfork.backends.vm.memory_layers import materialize
from sandfork.backends.vm.process_memory import PAGE
from sandfork.backends.vm.qemu import (
    MACHINE_REVISION,
    VM_FILE_SUFFIXES,
    Network,
    VmLayout,
    VmSpec,
    qemu_version,
)
from sandfork.templates import BuiltTemplate


class VmBackend:
    """Runs sandboxes as QEMU VMs over qcow2 overlays of a template's root image."""

    name = "vm"
    images = Qcow2Images()

    def __init__(
        self,
        ram_dir: Path,
        accelerator: str = "auto",
        boot_timeout: float = 120.0,
        *,
        copy_memory: bool = False,
    ):
        self.accel: Accelerator = detect_accelerator(accelerator)
        self.boot_timeout = boot_timeout
        self.ram_dir = ram_dir
        ram_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.copy_memory = copy_memory  # the way before copy-on-write memory, to compare

    @property
    def accelerator(self) -> str:
        return self.accel.name

    def spec(self, template: BuiltTemplate, memory_mb: int, cpus: int) -> dict[str, Any]:
        """The VM description of a sandbox of ``template`` with these resources."""
        return VmSpec(
            kernel=template.kernel,
            initrd=template.initrd,
            cmdline=template.cmdline,
            memory_mb=memory_mb,
            cpus=cpus,
            accel=self.accel,
        ).to_dict()

    def flatten_memory(self, chain: list[Path], out: Path, memory_mb: int) -> None:
        """Write the memory ``chain`` describes as one full image at ``out``."""
        materialize(out, chain, memory_mb * 2**20 // PAGE)

    def machine_key(self) -> str:
        """The QEMU build and the revision of our VM's devices: saved states need both."""
        return f"{qemu_version()} / machine revision {MACHINE_REVISION}"

    async def create(
        self,
        spec: dict[str, Any],
        directory: Path,
        disk: Path,
        spawned: Callable[[int], None] | None = None,
        *,
        host_access: bool = False,
    ) -> Machine:
        """Boot a new VM of ``spec`` on ``disk``; ``spawned`` gets QEMU's pid at once.

        Its network reaches nothing unless ``host_access``: its way out is the egress channel.
        """
        layout = VmLayout(directory, disk, self.ram_dir)
        return await Machine.launch(
            VmSpec.from_dict(spec),
            layout,
            self.boot_timeout,
            spawned=spawned,
            network=Network(host_access),
            copy_memory=self.copy_memory,
        )

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
    ) -> Machine:
        """Start a VM that resumes the snapshot in ``snapshot`` on ``disk``, its RAM the
        memory chain ``memory`` (its full image mapped copy-on-write).

        The network is the new VM's own choice: a snapshot taken under either restores in both.
        """
        layout = VmLayout(directory, disk, self.ram_dir)
        return await Machine.launch(
            VmSpec.from_dict(spec),
            layout,
            self.boot_timeout,
            snapshot,
            spawned,
            Network(host_access),
            memory,
            self.copy_memory,
        )

    async def adopt(self, directory: Path, disk: Path, pid: int) -> Machine:
        """Re-attach to a VM an earlier engine process started."""
        return await Machine.adopt(
            VmLayout(directory, disk, self.ram_dir), pid, copy_memory=self.copy_memory
        )

    def release(self, directory: Path) -> None:
        """Delete the directory and RAM file of a VM that is gone."""
        release(self.ram_dir, directory)

    def sweep(self, root: Path, keep: set[str]) -> list[str]:
        """Kill and delete every VM under ``root`` whose directory name is not in ``keep``:
        QEMU processes, directories and RAM files that no sandbox owns. Returns what went."""
        gone = []
        for name, pid in qemu_processes(root).items():
            if name not in keep:
                kill_process(pid)
                gone.append(f"QEMU process {pid} ({name})")
        for directory in list(root.iterdir()) if root.exists() else []:
            if directory.name not in keep:
                release(self.ram_dir, directory)
                gone.append(f"directory {directory}")
        for path in list(self.ram_dir.iterdir()):
            if path.suffix in VM_FILE_SUFFIXES and path.stem not in keep:
                path.unlink(missing_ok=True)
                gone.append(f"file {path}")
        return gone
