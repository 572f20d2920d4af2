"""The VM backend: each sandbox is a QEMU virtual machine."""

from __future__ import annotations

from pathlib import Path

from sandfork.backends.vm.accel import Accelerator, detect_accelerator
from sandfork.backends.vm.machine import Machine
from sandfork.backends.vm.qemu import VmSpec
from sandfork.templates import BuiltTemplate


class VmBackend:
    """Runs sandboxes as QEMU VMs over qcow2 overlays of a template's root image."""

    name = "vm"

    def __init__(self, accelerator: str = "auto", boot_timeout: float = 120.0) -> None:
        self.accel: Accelerator = detect_accelerator(accelerator)
        self.boot_timeout = boot_timeout

    @property
    def accelerator(self) -> str:
        return self.accel.name

    async def create(
        self, template: BuiltTemplate, memory_mb: int, cpus: int, directory: Path
    ) -> Machine:
        spec = VmSpec(
            kernel=template.kernel,
            initrd=template.initrd,
            cmdline=template.cmdline,
            memory_mb=memory_mb,
            cpus=cpus,
            accel=self.accel,
        )
        return await Machine.launch(spec, template.rootfs, directory, self.boot_timeout)

    async def adopt(self, directory: Path, pid: int) -> Machine:
        return await Machine.adopt(directory, pid)
