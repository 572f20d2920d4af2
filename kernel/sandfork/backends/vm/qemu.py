"""The QEMU command line of a sandbox VM and the files that go with it."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sandfork.backends.base import MachineSpec
from sandfork.backends.vm.accel import Accelerator

# qboot starts a -kernel guest noticeably faster than SeaBIOS (measured under TCG: 4.35 s vs
# 4.90 s to the initramfs); fall back to QEMU's default firmware where it is not installed.
_QBOOT = Path("/usr/share/qemu/qboot.rom")


def default_ram_dir(state_dir: Path) -> Path:
    """Where one engine's guest RAM files live: shared memory, so guest RAM never waits on a
    disk, in a folder of that engine alone (``$SANDFORK_RAM_DIR`` names it outright)."""
    if os.environ.get("SANDFORK_RAM_DIR"):
        return Path(os.environ["SANDFORK_RAM_DIR"])
    engine = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return Path("/dev/shm") / f"sandfork-{os.getuid()}" / engine


def ram_file(ram_dir: Path, directory: Path) -> Path:
    """The RAM file of the VM whose directory is ``directory``."""
    return ram_dir / f"{directory.name}.ram"


VM_FILE_SUFFIXES = (".ram", ".qmp", ".agent", ".egress")  # what a VM keeps in the RAM folder


@dataclass(frozen=True)
class VmLayout:
    """The files of one VM: its directory (logs), its disk, and in the RAM folder its RAM file
    and sockets (a short path there: a Unix socket's path has room for 107 bytes)."""

    dir: Path
    disk: Path
    ram_dir: Path

    @property
    def ram_file(self) -> Path:
        """The zeroed memory image a booting VM maps (privately) as its RAM; a restored VM
        maps its snapshot's image instead and has none."""
        return ram_file(self.ram_dir, self.dir)

    @property
    def qmp_socket(self) -> Path:
        return self.ram_dir / f"{self.dir.name}.qmp"

    @property
    def agent_socket(self) -> Path:
        return self.ram_dir / f"{self.dir.name}.agent"

    @property
    def egress_socket(self) -> Path:
        """The guest's egress channel (its ``sandfork.egress`` port), served by QEMU."""
        return self.ram_dir / f"{self.dir.name}.egress"

    @property
    def sockets(self) -> tuple[Path, ...]:
        """Every Unix socket QEMU listens on for this VM."""
        return (self.qmp_socket, self.agent_socket, self.egress_socket)

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
    cpu: int
    accel: Accelerator

    def machine_spec(self) -> MachineSpec:
        """The spec as the engine keeps it (the kernel, initramfs and command line are ours)."""
        details = {"kernel": str(self.kernel), "initrd": str(self.initrd), "cmdline": self.cmdline}
        return MachineSpec("vm", self.memory_mb, self.cpu, self.accel.name, details)

    @classmethod
    def from_machine_spec(cls, spec: MachineSpec) -> VmSpec:
        """The VM a spec made by :meth:`machine_spec` describes."""
        return cls(
            kernel=Path(spec.details["kernel"]),
            initrd=Path(spec.details["initrd"]),
            cmdline=str(spec.details["cmdline"]),
            memory_mb=spec.memory_mb,
            cpu=spec.cpu,
            accel=Accelerator(spec.accelerator, "as recorded with the sandbox or snapshot"),
        )


# Bump when command_line() changes the VM's devices: saved VM states depend on them.
# 2: restricted user network with the egress proxy's guestfwd.
# 3: private copy-on-write RAM; device state saved without RAM or configuration.
# 4: the egress channel's virtio-serial port (sandfork.egress) instead of the guestfwd.
MACHINE_REVISION = 4


@dataclass(frozen=True)
class Network:
    """A VM's user-mode network; not part of :class:`VmSpec`, so a snapshot restores in either.

    By default the network is restricted (``restrict=on``): the guest reaches neither the host
    (``10.0.2.2`` is the host's loopback) nor anything else; its way out is the egress channel,
    a virtio-serial port and no network at all. ``host_access`` gives the unrestricted slirp
    network (host loopback included).
    """

    host_access: bool = False

    def netdev(self) -> str:
        """The ``-netdev`` option value."""
        return "user,id=net0" if self.host_access else "user,id=net0,restrict=on"


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


def command_line(spec: VmSpec, layout: VmLayout, network: Network, image: Path) -> list[str]:
    """The full QEMU command line for ``spec`` with its files in ``layout``, its RAM a
    private (copy-on-write) mapping of the memory image ``image``."""
    firmware = ["-bios", str(_QBOOT)] if _QBOOT.exists() else []
    for path in (image, layout.disk):
        if "," in str(path):
            raise ValueError(f"QEMU cannot be given a path with a ',' in it: {path}")
    return [
        qemu_binary(),
        "-name", "sandfork,debug-threads=on",
        "-M", "q35,memory-backend=ram0",
        *firmware,
        *spec.accel.qemu_args(),
        "-smp", str(spec.cpu),
        "-m", f"{spec.memory_mb}M",
        "-object",
        f"memory-backend-file,id=ram0,size={spec.memory_mb}M,mem-path={image},share=off",
        # Saved device states carry no configuration section (xen-save-devices-state).
        "-global", "migration.send-configuration=off",
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
        "-chardev", f"socket,id=egress,path={layout.egress_socket},server=on,wait=off",
        "-device", "virtserialport,chardev=egress,name=sandfork.egress",
        "-netdev", network.netdev(),
        "-device", "virtio-net-pci,netdev=net0",
        "-object", "rng-random,id=rng0,filename=/dev/urandom",
        "-device", "virtio-rng-pci,rng=rng0",
        "-qmp", f"unix:{layout.qmp_socket},server=on,wait=off",
    ]  # fmt: skip
