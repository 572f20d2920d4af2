"""Building templates: ``ensure_template``, ``BuiltTemplate`` and the rootfs build.

A built template is two cached artifacts (see ``cache``):

- ``boot/<key16>/``: kernel and initramfs, shared by all templates (see ``boot``).
- ``rootfs/<name>-<key16>/``: the qcow2 base image. Key: the spec's build inputs, the apt
  mirror, the required packages and ``BUILDER_VERSION``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .boot import BUILDER_VERSION, KEY_CHARS, boot_inputs, build_boot, key16, source_inputs
from .cache import (
    Staging,
    build_lock,
    clean_stale,
    hash_key,
    read_manifest,
    sandfork_cache,
    template_roots,
)
from .debian import apt_mirror
from .errors import TemplateError
from .kernel import KERNEL_CMDLINE
from .progress import BuildProgress
from .rootfs import REQUIRED_APT
from .spec import TemplateSpec, load_spec
from .stage import Bootstrap, RootfsJob, bootstrap_tree, run_finish
from .userns import build_mode, check_build_host
from .wheels import PLATFORMS, download_wheels, guest_pip_conf, host_index_urls

__all__ = [
    "BUILDER_VERSION",
    "BuiltTemplate",
    "boot_inputs",
    "ensure_boot",
    "ensure_template",
    "rootfs_inputs",
]


def _as_spec(spec_or_name: TemplateSpec | str | Path) -> TemplateSpec:
    return spec_or_name if isinstance(spec_or_name, TemplateSpec) else load_spec(spec_or_name)


# --- keys ----------------------------------------------------------------------------------


def rootfs_inputs(spec: TemplateSpec) -> dict[str, Any]:
    """Everything the root filesystem of ``spec`` is built from (its key is their hash)."""
    return {
        "spec": spec.build_inputs(),
        "mirror": apt_mirror(spec.base_image.suite),
        "required_apt": list(REQUIRED_APT),
        "builder": BUILDER_VERSION,
    }


# --- the result ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltTemplate:
    """A template whose kernel, initramfs and root image are built and cached.

    ``kernel`` is for QEMU's ``-kernel``: the uncompressed PVH ELF ``vmlinux`` when it could
    be extracted (boots faster), else the bzImage ``vmlinuz`` (always there, ``bzimage``).
    ``rootfs`` is a qcow2 base image that is never written after the build: give every
    sandbox its own overlay on it. ``key`` identifies this exact build (boot + rootfs);
    memory snapshots can only be restored on a template with the same key.
    """

    name: str
    key: str
    kernel: Path
    initrd: Path
    rootfs: Path
    cmdline: str
    built_at: datetime
    spec: TemplateSpec
    boot_key: str
    rootfs_key: str

    @property
    def bzimage(self) -> Path:
        """The compressed kernel (bzImage), for boot loaders without PVH support."""
        return self.kernel.with_name("vmlinuz")

    @property
    def memory_mb(self) -> int:
        """Default memory of sandboxes of this template."""
        return self.spec.memory_mb

    @property
    def cpu(self) -> int:
        """Default CPU count of sandboxes of this template."""
        return self.spec.cpu

    def to_dict(self) -> dict[str, Any]:
        """Plain data, e.g. for an API response or a snapshot's metadata."""
        return {
            "name": self.name,
            "key": self.key,
            "kernel": str(self.kernel),
            "initrd": str(self.initrd),
            "rootfs": str(self.rootfs),
            "cmdline": self.cmdline,
            "built_at": self.built_at.isoformat(),
            "boot_key": self.boot_key,
            "rootfs_key": self.rootfs_key,
            "memory_mb": self.memory_mb,
            "cpu": self.cpu,
        }

    @classmethod
    def find(cls, spec_or_name: TemplateSpec | str | Path) -> BuiltTemplate | None:
        """The built template for a spec (or name, or path), or None; never builds.

        Looks in the user's cache, then in the shared read-only folders (see
        ``cache.template_roots``). A built root image goes with the boot artifact of the
        current kernel, which apt's local package lists name (no network); if apt knows
        nothing, with the newest boot artifact built from the same sources. An imported
        root image goes with the boot artifact it was exported with.
        """
        spec = _as_spec(spec_or_name)
        roots = template_roots()
        rootfs_dir = _find_rootfs(roots, spec)
        if rootfs_dir is None:
            return None
        pinned = (read_manifest(rootfs_dir) or {}).get("boot_key")
        if isinstance(pinned, str):
            boot_dir = next(
                (r / "boot" / pinned for r in roots if read_manifest(r / "boot" / pinned)), None
            )
        else:
            boot_dir = _find_boot_dir(roots)
        if boot_dir is None:
            return None
        return cls._from_dirs(spec, boot_dir, rootfs_dir)

    @classmethod
    def _from_dirs(cls, spec: TemplateSpec, boot_dir: Path, rootfs_dir: Path) -> BuiltTemplate:
        boot_m = read_manifest(boot_dir) or {}
        rootfs_m = read_manifest(rootfs_dir) or {}
        built_at = max(float(boot_m.get("built_at", 0)), float(rootfs_m.get("built_at", 0)))
        boot_key = boot_dir.name
        rootfs_key = rootfs_dir.name.rsplit("-", 1)[-1]
        pvh_kernel = boot_dir / "vmlinux"
        return cls(
            name=spec.name,
            key=hash_key([boot_key, rootfs_key])[:KEY_CHARS],
            kernel=pvh_kernel if pvh_kernel.is_file() else boot_dir / "vmlinuz",
            initrd=boot_dir / "initrd.img",
            rootfs=rootfs_dir / "rootfs.qcow2",
            cmdline=KERNEL_CMDLINE,
            built_at=datetime.fromtimestamp(built_at, UTC),
            spec=spec,
            boot_key=boot_key,
            rootfs_key=rootfs_key,
        )


def _same_image(inputs: object, wanted: dict[str, Any]) -> bool:
    """True if ``inputs`` are ``wanted`` but for the apt mirror (which does not change what
    an image holds: the mirror only matters when building)."""
    if not isinstance(inputs, dict):
        return False
    return {k: v for k, v in inputs.items() if k != "mirror"} == {
        k: v for k, v in wanted.items() if k != "mirror"
    }


def _find_rootfs(roots: list[Path], spec: TemplateSpec) -> Path | None:
    """The root image of ``spec``: built here (its key), else an imported one of the same
    spec, builder and packages."""
    inputs = rootfs_inputs(spec)
    name = f"{spec.name}-{key16(inputs)}"
    for root in roots:
        if read_manifest(root / "rootfs" / name) is not None:
            return root / "rootfs" / name
    for root in roots:
        for d in sorted((root / "rootfs").glob(f"{spec.name}-*")):
            m = read_manifest(d)
            if m is not None and "boot_key" in m and _same_image(m.get("inputs"), inputs):
                return d
    return None


def _find_boot_dir(roots: list[Path]) -> Path | None:
    try:
        inputs = boot_inputs(allow_update=False)
    except TemplateError:
        # apt knows nothing (offline, lists removed): any boot artifact built from the same
        # sources will do; take the newest.
        wanted = source_inputs()
        best: tuple[float, Path] | None = None
        boots = [d for root in roots if (root / "boot").is_dir() for d in (root / "boot").iterdir()]
        for d in boots:
            m = read_manifest(d)
            if m is None or not isinstance(m.get("inputs"), dict):
                continue
            if all(m["inputs"].get(k) == v for k, v in wanted.items()):
                at = float(m.get("built_at", 0))
                if best is None or at > best[0]:
                    best = (at, d)
        return best[1] if best else None
    key = key16(inputs)
    return next((r / "boot" / key for r in roots if read_manifest(r / "boot" / key)), None)


# --- building ------------------------------------------------------------------------------


class _WheelDownload(threading.Thread):
    """Downloads the spec's wheels (cached in ``wheels/<hash>/``) while the bootstrap runs."""

    def __init__(self, root: Path, spec: TemplateSpec, progress: BuildProgress) -> None:
        super().__init__(name="sandfork-wheels", daemon=True)
        self.requirements = list(spec.pip)
        self.python_version = spec.base_image.python_version
        self.inputs: dict[str, Any] = {
            "pip": list(spec.pip),
            "python": spec.base_image.python_version,
            "platforms": list(PLATFORMS),
        }
        self.final = root / "wheels" / key16(self.inputs)
        self.progress = progress
        self.error: BaseException | None = None
        self.elapsed = 0.0

    def run(self) -> None:
        try:
            if read_manifest(self.final) is not None:
                return
            with Staging(self.final) as st, self.progress.step("Wheels (pip download)") as s:
                wheels = download_wheels(self.requirements, self.python_version, st.path, s.update)
                total = sum(w.stat().st_size for w in wheels)
                s.done(f"{len(wheels)} wheels, {total / 2**20:.0f} MiB")
                self.elapsed = round(s.elapsed, 2)
                st.commit(
                    {"kind": "wheels", "inputs": self.inputs, "files": [w.name for w in wheels]}
                )
        except BaseException as e:
            self.error = e

    def result(self) -> Path:
        """Wait for the download; the wheel directory or the download's error."""
        self.join()
        if self.error is not None:
            raise self.error
        return self.final


def _build_rootfs(
    root: Path, spec: TemplateSpec, inputs: dict[str, Any], progress: BuildProgress
) -> Path:
    key = key16(inputs)
    final = root / "rootfs" / f"{spec.name}-{key}"
    mode = build_mode()
    manifest: dict[str, Any] = {"kind": "rootfs", "key": key, "name": spec.name, "inputs": inputs}
    manifest["built_with"] = f"mmdebstrap --mode={mode}"  # not an input: the same image
    wheels = _WheelDownload(root, spec, progress)
    if spec.pip:
        wheels.start()
    try:
        with Staging(final) as st:
            tree = st.path / "tree"
            source = Bootstrap(inputs["mirror"], root / "debs", mode)
            timings: dict[str, float] = {}
            if mode != "fakechroot":  # else the build steps' child makes it, in its session
                timings["bootstrap"] = bootstrap_tree(spec, tree, source, progress)
            job = RootfsJob(
                tree=tree,
                spec=spec,
                wheels=wheels.result() if spec.pip else None,
                pip_conf=guest_pip_conf(host_index_urls()),
                qcow2=st.path / "rootfs.qcow2",
                bootstrap=source if mode == "fakechroot" else None,
            )
            finished = run_finish(job, progress, mode)
            timings |= finished.pop("timings")
            if spec.pip:
                timings["wheels_download"] = wheels.elapsed
            st.commit({**manifest, **finished, "timings": timings})
    finally:
        if wheels.is_alive():
            wheels.join()
    return final


def ensure_boot(progress: bool = False) -> Path:
    """The directory of the current boot artifact (kernel + initramfs), built if missing.

    ``ensure_template`` does this too; this is for callers that need only the boot files.
    """
    inputs = boot_inputs(allow_update=True)
    root = sandfork_cache()
    final = root / "boot" / key16(inputs)
    if read_manifest(final) is not None:
        return final
    with BuildProgress(progress) as p:
        with build_lock(root, on_wait=lambda: p.note("waiting for another template build...")):
            if read_manifest(final) is not None:
                return final
            check_build_host()
            clean_stale(root)
            return build_boot(root, inputs, p)


def ensure_template(
    spec_or_name: TemplateSpec | str | Path, progress: bool = True
) -> BuiltTemplate:
    """The built template for a spec, name or ``.toml`` path; builds what is missing.

    Cached artifacts are reused, so this returns at once for a built template. Safe to call
    from several processes at once: builds are serialised with a file lock on the cache and
    a waiting caller then finds the template built. Shows progress on stderr with
    ``progress``. Raises ``TemplateError`` (with the failing command and its output).
    """
    spec = _as_spec(spec_or_name)
    found = BuiltTemplate.find(spec)
    if found is not None:
        return found
    root = sandfork_cache()
    with BuildProgress(progress) as p:
        started = time.monotonic()
        with build_lock(root, on_wait=lambda: p.note("waiting for another template build...")):
            found = BuiltTemplate.find(spec)
            if found is not None:
                return found
            check_build_host()
            clean_stale(root)
            boot_in = boot_inputs(allow_update=True)
            boot_dir = root / "boot" / key16(boot_in)
            if read_manifest(boot_dir) is None:
                boot_dir = build_boot(root, boot_in, p)
            r_in = rootfs_inputs(spec)
            rootfs_dir = root / "rootfs" / f"{spec.name}-{key16(r_in)}"
            if read_manifest(rootfs_dir) is None:
                rootfs_dir = _build_rootfs(root, spec, r_in, p)
            built = BuiltTemplate._from_dirs(spec, boot_dir, rootfs_dir)
        p.note(
            f"[bold]template {spec.name}[/] ready in {time.monotonic() - started:.0f} s"
            f" (key {built.key})"
        )
        return built
