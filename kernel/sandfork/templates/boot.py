"""The boot artifact: kernel (bzImage + PVH ELF) and initramfs, in ``boot/<key16>/``.

Key: the kernel and busybox package versions, the agent's source files, the init scripts,
the module list and ``BUILDER_VERSION``; one boot artifact serves every template.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from .cache import Staging, hash_key, read_manifest, sandfork_cache
from .chroot import safe_rmtree
from .debian import Package, download_debs, extract_deb, resolve_packages
from .initramfs import (
    GUEST_INIT,
    INITRAMFS_INIT,
    agent_dir,
    agent_files,
    files_hash,
    pyc_tag,
    write_initramfs,
)
from .kernel import KERNEL_CMDLINE, KERNEL_METAPACKAGE, MODULES, module_load_order, unpack_kernel
from .progress import BuildProgress
from .pvh import extract_pvh_vmlinux

__all__ = [
    "BUILDER_VERSION",
    "KEY_CHARS",
    "boot_inputs",
    "build_boot",
    "key16",
    "link_kernel_files",
    "source_inputs",
]

#: Bump when a change to the build steps must invalidate every cached artifact.
BUILDER_VERSION = 1

BUSYBOX_PACKAGE = "busybox-static"
INITRD_COMPRESSION = "gzip"
KEY_CHARS = 16


def key16(inputs: dict[str, Any]) -> str:
    """The 16-hex-digit cache key of ``inputs``."""
    return hash_key(inputs)[:KEY_CHARS]


def source_inputs() -> dict[str, Any]:
    """The boot inputs that come from this source tree (agent, scripts, settings)."""
    agent = agent_dir()
    return {
        "agent": files_hash((f"agent/{p.as_posix()}", agent / p) for p in agent_files(agent)),
        "scripts": files_hash([("init", GUEST_INIT), ("initramfs-init", INITRAMFS_INIT)]),
        "modules": list(MODULES),
        "compression": INITRD_COMPRESSION,
        "pyc": pyc_tag(),
        "pvh": True,
        "builder": BUILDER_VERSION,
    }


def _resolve_boot_packages(root: Path, *, allow_update: bool) -> tuple[Package, Package]:
    pkgs = resolve_packages(
        [KERNEL_METAPACKAGE, BUSYBOX_PACKAGE],
        follow=[KERNEL_METAPACKAGE],
        memo=root / "apt-packages.json",
        allow_update=allow_update,
    )
    return pkgs[KERNEL_METAPACKAGE], pkgs[BUSYBOX_PACKAGE]


def boot_inputs(*, allow_update: bool = False) -> dict[str, Any]:
    """Everything the kernel + initramfs artifact is built from (its key is their hash)."""
    root = sandfork_cache()
    kernel, busybox = _resolve_boot_packages(root, allow_update=allow_update)
    return {
        "kernel": {"name": kernel.name, "version": kernel.version},
        "busybox": {"name": busybox.name, "version": busybox.version},
        **source_inputs(),
    }


def link_kernel_files(root: Path, kernel: dict[str, str], dest: Path) -> bool:
    """Hard-link vmlinuz (and vmlinux) from a complete boot artifact of the same kernel
    package, so that rebuilding the initramfs (a new agent) costs no kernel-sized files."""
    for d in sorted((root / "boot").iterdir()):
        m = read_manifest(d)
        if m is None or m.get("inputs", {}).get("kernel") != kernel:
            continue
        names = ["vmlinuz"] + (["vmlinux"] if m.get("kernel_format") == "pvh-elf" else [])
        try:
            for name in names:
                os.link(d / name, dest / name)
        except OSError:
            for name in names:
                (dest / name).unlink(missing_ok=True)
            continue
        return True
    return False


def build_boot(root: Path, inputs: dict[str, Any], progress: BuildProgress) -> Path:
    """Build the boot artifact for ``inputs`` (see ``boot_inputs``); caller holds the lock."""
    key = key16(inputs)
    final = root / "boot" / key
    kernel = Package(**inputs["kernel"])
    busybox = Package(**inputs["busybox"])
    timings: dict[str, float] = {}
    with Staging(final) as st:
        work = st.path / "work"
        with progress.step("Kernel") as s:
            kernel_deb, busybox_deb = download_debs([kernel, busybox], root / "debs", s.update)
            s.update("unpacking, depmod")
            unpacked = unpack_kernel(kernel_deb, work / "kernel")
            modules = module_load_order(unpacked.modules_dir)
            if link_kernel_files(root, inputs["kernel"], st.path):
                pvh = (st.path / "vmlinux").exists()
            else:
                shutil.copyfile(unpacked.vmlinuz, st.path / "vmlinuz")
                (st.path / "vmlinuz").chmod(0o644)
                s.update("extracting the PVH kernel")
                pvh = extract_pvh_vmlinux(st.path / "vmlinuz", st.path / "vmlinux")
            kind = "PVH ELF" if pvh else "bzImage only"
            release = kernel.name.removeprefix("linux-image-")
            s.done(f"{release} {kernel.version}, {kind}, {len(modules)} modules")
        timings["kernel"] = round(s.elapsed, 2)
        with progress.step("Initramfs") as s:
            extract_deb(busybox_deb, work / "busybox")
            members = write_initramfs(
                st.path / "initrd.img",
                busybox=work / "busybox" / "bin" / "busybox",
                modules=modules,
                compression=INITRD_COMPRESSION,
            )
            safe_rmtree(work)
            size = (st.path / "initrd.img").stat().st_size
            s.done(f"{len(members)} files, {size / 2**20:.1f} MiB")
        timings["initramfs"] = round(s.elapsed, 2)
        st.commit(
            {
                "kind": "boot",
                "key": key,
                "inputs": inputs,
                "kernel_release": unpacked.release,
                "kernel_format": "pvh-elf" if pvh else "bzimage",
                "modules": [m.name for m in modules],
                "cmdline": KERNEL_CMDLINE,
                "sizes": {
                    **({"vmlinux": (st.path / "vmlinux").stat().st_size} if pvh else {}),
                    "vmlinuz": (st.path / "vmlinuz").stat().st_size,
                    "initrd.img": size,
                },
                "timings": timings,
            }
        )
    return final
