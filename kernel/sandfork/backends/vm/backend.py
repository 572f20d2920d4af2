"""The VM backend: each sandbox is a QEMU virtual machine."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

from sandfork.backends.base import CaptureRequest, MachineSpec, StartPoint
from sandfork.backends.processes import kill_process
from sandfork.backends.vm.accel import Accelerator, detect_accelerator
from sandfork.backends.vm.images import Qcow2Images
from sandfork.backends.vm.launch_record import RECORD, qemu_processes
from sandfork.backends.vm.machine import DEVICES_FILE, Machine, release
from sandfork.backends.vm.memory_layers import materialize
from sandfork.backends.vm.process_memory import PAGE
from sandfork.backends.vm.qemu import (
    MACHINE_REVISION,
    VM_FILE_SUFFIXES,
    Network,
    VmLayout,
    VmSpec,
    qemu_binary,
    qemu_version,
)
from sandfork.templates import BuiltTemplate

#: A boot capture's files: the frozen disk and the memory image of its sandboxes' chains.
CAPTURE_DISK = "disk.qcow2"
CAPTURE_MEMORY = "memory.img"


class VmBackend:
    """Runs sandboxes as QEMU VMs over qcow2 overlays of a template's root image."""

    name = "vm"
    isolation = "vm"
    images = Qcow2Images()
    memory_suffix: str | None = ".mem"
    captures_in_memory = True  # a fork's device state is small; its memory is a layer
    shares_memory = True  # copies map one image copy-on-write
    # QEMU maps a memory layer for the VM's whole life: read through a lazy server, the VM
    # would depend on that server until it ends, so a VM's snapshot is fetched whole.
    fetched_lazily: tuple[str, ...] = ()

    def __init__(
        self,
        ram_dir: Path,
        accelerator: str = "auto",
        boot_timeout: float = 120.0,
        *,
        copy_memory: bool = False,
        track_writes: bool = True,
    ):
        self.accel: Accelerator = detect_accelerator(accelerator)
        self.boot_timeout = boot_timeout
        self.ram_dir = ram_dir
        ram_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.copy_memory = copy_memory  # the way before copy-on-write, to compare
        self.track_writes = track_writes

    @property
    def accelerator(self) -> str:
        return self.accel.name

    def unavailable(self) -> str | None:
        """Why VMs cannot run here (QEMU missing), or ``None``."""
        try:
            qemu_binary()
        except FileNotFoundError as e:
            return str(e)
        return None

    def spec(self, template: BuiltTemplate, memory_mb: int, cpu: int) -> MachineSpec:
        """The VM description of a sandbox of ``template`` with these resources."""
        return VmSpec(
            kernel=template.kernel,
            initrd=template.initrd,
            cmdline=template.cmdline,
            memory_mb=memory_mb,
            cpu=cpu,
            accel=self.accel,
        ).machine_spec()

    def base_disk(self, template: BuiltTemplate) -> Path:
        """The template's qcow2 root image."""
        return template.rootfs

    def flatten_memory(self, chain: list[Path], out: Path, memory_mb: int) -> None:
        """Write the memory ``chain`` describes as one full image at ``out``."""
        materialize(out, chain, memory_mb * 2**20 // PAGE)

    def machine_key(self) -> str:
        """The QEMU build and the revision of our VM's devices: saved states need both."""
        return f"{qemu_version()} / machine revision {MACHINE_REVISION}"

    async def create(
        self,
        spec: MachineSpec,
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
            VmSpec.from_machine_spec(spec),
            layout,
            self.boot_timeout,
            spawned=spawned,
            network=Network(host_access),
            copy_memory=self.copy_memory,
            track_writes=self.track_writes,
        )

    async def restore(
        self,
        start: StartPoint,
        directory: Path,
        disk: Path,
        spawned: Callable[[int], None] | None = None,
        *,
        host_access: bool = False,
    ) -> Machine:
        """Start a VM that resumes the snapshot in ``start.dir`` on ``disk``, its RAM the
        memory chain ``start.memory`` (its full image mapped copy-on-write).

        The network is the new VM's own choice: a snapshot taken under either restores in both.
        """
        layout = VmLayout(directory, disk, self.ram_dir)
        return await Machine.launch(
            VmSpec.from_machine_spec(start.spec),
            layout,
            self.boot_timeout,
            start.dir,
            spawned,
            Network(host_access),
            start.memory,
            self.copy_memory,
            self.track_writes,
        )

    async def boot_capture(self, spec: MachineSpec, template: BuiltTemplate, dest: Path) -> None:
        """Boot a VM of ``spec`` on an overlay of the template's image, start its default
        kernel and capture it into ``dest``: ``disk.qcow2`` (frozen), ``memory.img``,
        ``devices.state``."""
        disk = dest / CAPTURE_DISK
        self.images.create_overlay(template.rootfs, disk)
        # Named uniquely: its RAM file and sockets share the engine's RAM folder.
        machine = await self.create(spec, dest / f"boot-{secrets.token_hex(6)}", disk)
        scratch = dest / "scratch.qcow2"
        names = {".qcow2": scratch, ".mem": dest / CAPTURE_MEMORY}
        try:
            await machine.agent.request("ctx.create", {"isolated": False})
            request = CaptureRequest(disk, [], lambda _backing, suffix: names[suffix])
            await machine.snapshot(dest, request)
        finally:
            await machine.destroy()
            scratch.unlink(missing_ok=True)
            shutil.rmtree(machine.layout.dir, ignore_errors=True)

    def capture_at(self, directory: Path, spec: MachineSpec) -> StartPoint:
        """The boot capture in ``directory`` as sandboxes start from it."""
        return StartPoint(directory, spec, directory / CAPTURE_DISK, [directory / CAPTURE_MEMORY])

    def capture_files(self, directory: Path) -> tuple[list[Path], Path]:
        """A boot capture's files, and the one whose checksum is checked before each use (the
        memory image is too big to read every time)."""
        names = (CAPTURE_DISK, CAPTURE_MEMORY, DEVICES_FILE)
        return [directory / name for name in names], directory / DEVICES_FILE

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
        QEMU processes, directories and RAM files that no sandbox owns. Returns what went.

        QEMU processes are found from their command lines, not from the launch records: an
        engine killed right after starting QEMU may not have written one.
        """
        gone = []
        for name, pid in qemu_processes(root).items():
            if name not in keep:
                kill_process(pid)
                gone.append(f"QEMU process {pid} ({name})")
        for directory in list(root.iterdir()) if root.exists() else []:
            vm_files = ("qemu.log", "console.log", RECORD)
            if directory.name not in keep and any((directory / n).exists() for n in vm_files):
                release(self.ram_dir, directory)
                gone.append(f"directory {directory}")
        for path in list(self.ram_dir.iterdir()):
            if path.suffix in VM_FILE_SUFFIXES and path.stem not in keep:
                path.unlink(missing_ok=True)
                gone.append(f"file {path}")
        return gone
