"""The VM backend: each sandbox is a QEMU virtual machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandfork.backends.vm.accel import Accelerator, detect_accelerator
from sandfork.backends.vm.machine import Machine, release
from sandfork.backends.vm.qemu import VmLayout, VmSpec, create_overlay
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

    def new_disk(self, base: Path, disk: Path) -> None:
        """Create ``disk`` as a copy-on-write overlay of ``base``."""
        create_overlay(base, disk)

    async def create(self, spec: dict[str, Any], directory: Path, disk: Path) -> Machine:
        """Boot a new VM of ``spec`` on ``disk``."""
        layout = VmLayout(directory, disk)
        return await Machine.launch(VmSpec.from_dict(spec), layout, self.boot_timeout)

    async def restore(
        self, spec: dict[str, Any], snapshot: Path, directory: Path, disk: Path
    ) -> Machine:
        """Start a VM that resumes the snapshot in ``snapshot`` on ``disk``."""
        layout = VmLayout(directory, disk)
        return await Machine.launch(VmSpec.from_dict(spec), layout, self.boot_timeout, snapshot)

    async def adopt(self, directory: Path, disk: Path, pid: int) -> Machine:
        """Re-attach to a VM an earlier engine process started."""
        return await Machine.adopt(VmLayout(directory, disk), pid)

    def release(self, directory: Path) -> None:
        """Delete the directory and RAM file of a VM that is gone."""
        release(directory)
