"""The guest kernel: Debian's cloud kernel package, unpacked, and its module load order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .debian import extract_deb
from .errors import TemplateError
from .proc import run

__all__ = [
    "KERNEL_CMDLINE",
    "KERNEL_METAPACKAGE",
    "MODULES",
    "ModuleFile",
    "UnpackedKernel",
    "module_load_order",
    "parse_modules_dep",
    "unpack_kernel",
]

#: The metapackage that names the current cloud kernel.
KERNEL_METAPACKAGE = "linux-image-cloud-amd64"

#: Modules the guest needs (their dependencies are added from modules.dep): PCI transport,
#: root disk, agent port (virtio-serial), network, entropy. ext4 is built into the kernel.
MODULES = ("virtio_pci", "virtio_blk", "virtio_console", "virtio_net", "virtio_rng")

#: Kernel command line for every sandbox. These options were measured to boot fastest under
#: TCG on our machines: skip crypto self-tests, trust the CPU RNG, trust the TSC and skip
#: the timer check, one 8250 UART (the console), no audit, no KASLR (also keeps memory
#: snapshots comparable), no Spectre-style mitigations; panic=-1 reboots at once on a panic
#: (run QEMU with -no-reboot so that it exits instead).
KERNEL_CMDLINE = (
    "console=ttyS0 quiet mitigations=off cryptomgr.notests random.trust_cpu=on tsc=reliable"
    " no_timer_check 8250.nr_uarts=1 audit=0 nokaslr panic=-1"
)


@dataclass(frozen=True)
class UnpackedKernel:
    """A kernel package unpacked into ``root`` with ``depmod`` run on it."""

    root: Path
    release: str
    vmlinuz: Path
    modules_dir: Path
    config: dict[str, str]


@dataclass(frozen=True)
class ModuleFile:
    """A loadable module: its name (``virtio_pci``) and file."""

    name: str
    path: Path


def _module_name(path: str) -> str:
    base = path.rsplit("/", 1)[-1]
    for ext in (".ko.xz", ".ko.zst", ".ko.gz", ".ko"):
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    return base.replace("-", "_")


def _read_config(path: Path) -> dict[str, str]:
    config = {}
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("CONFIG_") and "=" in line:
                k, _, v = line.partition("=")
                config[k] = v
    return config


def unpack_kernel(deb: Path, dest: Path) -> UnpackedKernel:
    """Unpack the kernel ``deb`` into ``dest`` and generate ``modules.dep`` with ``depmod -b``."""
    extract_deb(deb, dest)
    for mod_root in (dest / "lib" / "modules", dest / "usr" / "lib" / "modules"):
        if mod_root.is_dir():
            break
    else:
        raise TemplateError(f"{deb.name} contains no lib/modules directory")
    releases = sorted(p.name for p in mod_root.iterdir() if p.is_dir())
    if len(releases) != 1:
        raise TemplateError(f"{deb.name}: expected one kernel release, found {releases}")
    release = releases[0]
    vmlinuz = dest / "boot" / f"vmlinuz-{release}"
    if not vmlinuz.is_file():
        raise TemplateError(f"{deb.name} contains no boot/vmlinuz-{release}")
    base = mod_root.parent.parent  # depmod -b wants the dir holding lib/modules
    run(["depmod", "-b", str(base), release], what="depmod")
    return UnpackedKernel(
        root=dest,
        release=release,
        vmlinuz=vmlinuz,
        modules_dir=mod_root / release,
        config=_read_config(dest / "boot" / f"config-{release}"),
    )


def parse_modules_dep(text: str) -> dict[str, tuple[str, list[str]]]:
    """``modules.dep`` -> module name -> (its path, the names of its direct dependencies)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        path, _, deps = line.partition(":")
        out[_module_name(path.strip())] = (path.strip(), [_module_name(d) for d in deps.split()])
    return out


def module_load_order(modules_dir: Path, wanted: tuple[str, ...] = MODULES) -> list[ModuleFile]:
    """The modules ``wanted`` and everything they need, dependencies first.

    Built-in modules (listed in ``modules.builtin``) are skipped; a module that is neither
    built in nor in ``modules.dep`` is an error.
    """
    try:
        deps = parse_modules_dep((modules_dir / "modules.dep").read_text())
    except OSError as e:
        raise TemplateError(f"cannot read modules.dep in {modules_dir}: {e}") from e
    builtin_file = modules_dir / "modules.builtin"
    builtin = (
        {_module_name(line.strip()) for line in builtin_file.read_text().splitlines()}
        if builtin_file.is_file()
        else set()
    )
    order: list[ModuleFile] = []
    seen: set[str] = set()
    visiting: set[str] = set()

    def visit(name: str, needed_by: str | None) -> None:
        name = name.replace("-", "_")
        if name in seen:
            return
        if name not in deps:
            if name in builtin:
                seen.add(name)
                return
            why = f" (needed by {needed_by})" if needed_by else ""
            raise TemplateError(f"kernel module {name}{why} not found in {modules_dir}")
        if name in visiting:
            raise TemplateError(f"dependency cycle in modules.dep at {name}")
        visiting.add(name)
        path, requires = deps[name]
        # modules.dep lists the deepest dependencies last; load those first.
        for dep in reversed(requires):
            visit(dep, name)
        visiting.discard(name)
        seen.add(name)
        order.append(ModuleFile(name, modules_dir / path))

    for name in wanted:
        visit(name, None)
    return order
