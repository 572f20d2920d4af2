"""The QEMU command line of a sandbox VM and the files that go with it."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandfork.backends.vm.accel import Accelerator

# qboot starts a -kernel guest noticeably faster than SeaBIOS (measured under TCG: 4.35 s vs
# 4.90 s to the initramfs); fall back to QEMU's default firmware where it is not installed.
_QBOOT = Path("/usr/share/qemu/qboot.rom")


def ram_dir() -> Path:
    """Where guest RAM files live: shared memory, so guest RAM never waits on a disk."""
    return Path(os.environ.get("SANDFORK_RAM_DIR", "/dev/shm/sandfork"))


def ram_file(directory: Path) -> Path:
    """The RAM file of the VM whose directory is ``directory``."""
    return ram_dir() / f"{directory.name}.ram"


@dataclass(frozen=True)
class VmLayout:
    """The files of one VM: its directory (sockets, logs), its disk and its RAM file."""

    dir: Path
    disk: Path

    @property
    def ram_file(self) -> Path:
        """Guest RAM, a shared file mapping: a snapshot copies it while the VM is paused."""
        return ram_file(self.dir)

    @property
    def qmp_socket(self) -> Path:
        return self.dir / "qmp.sock"

    @property
    def agent_socket(self) -> Path:
        return self.dir / "agent.sock"

    @property
    def console_log(self) -> Path:
        return self.dir / "console.log"

    @property
    def qemu_log(self) -> Path:
        return self.dir / "qemu.log"


@dataclass(frozen=True)
class VmSpec:
    """What a VM is made of; the same spec must be used to restore its snapshots."""

    kernel: Path
    initrd: Path
    cmdline: str
    memory_mb: int
    cpus: int
    accel: Accelerator

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-able data, kept with sandboxes and snapshots."""
        return {
            "kernel": str(self.kernel),
            "initrd": str(self.initrd),
            "cmdline": self.cmdline,
            "memory_mb": self.memory_mb,
            "cpus": self.cpus,
            "accelerator": self.accel.name,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VmSpec:
        """The spec :meth:`to_dict` described."""
        return cls(
            kernel=Path(data["kernel"]),
            initrd=Path(data["initrd"]),
            cmdline=data["cmdline"],
            memory_mb=int(data["memory_mb"]),
            cpus=int(data["cpus"]),
            accel=Accelerator(data["accelerator"], "as recorded with the sandbox or snapshot"),
        )


# Bump when command_line() changes the VM's devices: saved VM states depend on them.
MACHINE_REVISION = 1


@functools.cache
def qemu_version() -> str:
    """The installed QEMU's version line (saved VM states only load into the same build)."""
    result = subprocess.run([qemu_binary(), "--version"], capture_output=True, text=True)
    return result.stdout.splitlines()[0] if result.stdout else "unknown"


def qemu_binary() -> str:
    """Path of ``qemu-system-x86_64``, or a clear error when QEMU is not installed."""
    path = shutil.which("qemu-system-x86_64")
    if path is None:
        raise FileNotFoundError(
            "qemu-system-x86_64 not found: install Debian's qemu-system-x86 package "
            "(scripts/install-system-deps.sh does)"
        )
    return path


def create_overlay(base: Path, overlay: Path) -> None:
    """Make a copy-on-write qcow2 overlay of ``base``."""
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base), str(overlay)],
        check=True,
        capture_output=True,
    )


def command_line(spec: VmSpec, layout: VmLayout) -> list[str]:
    """The full QEMU command line for ``spec`` with its files in ``layout``."""
    firmware = ["-bios", str(_QBOOT)] if _QBOOT.exists() else []
    return [
        qemu_binary(),
        "-name", "sandfork,debug-threads=on",
        "-M", "q35,memory-backend=ram0",
        *firmware,
        *spec.accel.qemu_args(),
        "-smp", str(spec.cpus),
        "-m", f"{spec.memory_mb}M",
        "-object",
        f"memory-backend-file,id=ram0,size={spec.memory_mb}M,mem-path={layout.ram_file},share=on",
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-serial", f"file:{layout.console_log}",
        "-kernel", str(spec.kernel),
        "-initrd", str(spec.initrd),
        "-append", spec.cmdline,
        "-drive", f"id=root,file={layout.disk},if=none,format=qcow2,discard=unmap",
        "-device", "virtio-blk-pci,drive=root",
        "-device", "virtio-serial-pci",
        "-chardev", f"socket,id=agent,path={layout.agent_socket},server=on,wait=off",
        "-device", "virtserialport,chardev=agent,name=sandfork.agent",
        "-netdev", "user,id=net0",
        "-device", "virtio-net-pci,netdev=net0",
        "-object", "rng-random,id=rng0,filename=/dev/urandom",
        "-device", "virtio-rng-pci,rng=rng0",
        "-qmp", f"unix:{layout.qmp_socket},server=on,wait=off",
    ]  # fmt: skip
