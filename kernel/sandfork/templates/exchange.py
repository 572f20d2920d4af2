"""Carrying a built template to another machine or user as one file.

The file is a zstd-compressed tar: ``manifest.json`` first (see ``exchange_schema``: the
template's name, its boot and root image artifacts with their keys and build manifests,
and the size and SHA-256 of every member), then ``vmlinuz``, ``vmlinux`` (a PVH kernel),
``initrd.img`` and ``rootfs.qcow2``.

An import trusts nothing in the file: the manifest must come first and pass the schema; the
template must be one this Sandfork knows with the same spec, packages and builder (so the
image is what a build here would make, and ``BuiltTemplate.find`` finds it), and its
kernel and initramfs must carry this Sandfork's guest agent; a member is written only if it
is listed, under its fixed name, only into a staging directory and only up to its listed
size, and must have its listed SHA-256; the root image must be a plain qcow2 (no backing or
data file) of the spec's disk size. Only then are the artifacts renamed into place, the
manifest written last, so a failed import leaves nothing that counts as a template. An
imported root image remembers its boot artifact (``boot_key`` in its manifest).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from tarfile import TarFile, TarInfo

from .. import archive
from ..archive import ArchiveError
from .boot import source_inputs
from .builder import BuiltTemplate, rootfs_inputs
from .cache import Staging, build_lock, read_manifest, sandfork_cache
from .errors import TemplateError
from .exchange_schema import BOOT_MEMBERS, MAX_MANIFEST_BYTES, ExportManifest, parse_manifest
from .proc import run
from .spec import TemplateSpec, load_spec

__all__ = ["export_template", "import_template"]

MANIFEST = "manifest.json"


def export_template(name: str, out: Path) -> ExportManifest:
    """Write the built template ``name`` to the new file ``out`` (via a temp file)."""
    built = BuiltTemplate.find(name)
    if built is None:
        raise TemplateError(
            f"template {name!r} is not built here: `sandfork template build {name}` first"
        )
    if out.exists():
        raise TemplateError(f"{out} exists: export to a new file")
    boot_dir, rootfs_dir = built.initrd.parent, built.rootfs.parent
    paths = {n: boot_dir / n for n in BOOT_MEMBERS if (boot_dir / n).is_file()}
    paths["rootfs.qcow2"] = built.rootfs
    manifest = ExportManifest(
        name=built.name,
        boot_key=built.boot_key,
        boot_manifest=read_manifest(boot_dir) or {},
        rootfs_key=built.rootfs_key,
        rootfs_manifest=read_manifest(rootfs_dir) or {},
        members={n: (p.stat().st_size, archive.sha256_file(p)) for n, p in paths.items()},
    )
    parse_manifest(manifest.to_json())  # what an import will demand
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(3)}")
    try:
        with archive.open_writer(tmp) as tar:
            archive.add_bytes(tar, MANIFEST, manifest.to_json())
            for member, path in paths.items():
                archive.add_file(tar, member, path, *manifest.members[member])
        os.rename(tmp, out)
    except ArchiveError as e:
        raise TemplateError(str(e)) from e
    finally:
        tmp.unlink(missing_ok=True)
    return manifest


def _check_fits(manifest: ExportManifest) -> TemplateSpec:
    """The local spec of the template in the file, if the file's image is what a build of
    it here would make (else a ``TemplateError`` saying what differs)."""
    spec = load_spec(manifest.name)
    theirs = manifest.rootfs_manifest["inputs"]
    ours = rootfs_inputs(spec)
    keys = (set(ours) | set(theirs)) - {"mirror"}  # the mirror changes nothing in the image
    differ = sorted(k for k in keys if ours.get(k) != theirs.get(k))
    if differ:
        raise TemplateError(
            f"the file's template {spec.name!r} is not the one this Sandfork builds: its "
            f"{', '.join(differ)} differ (`sandfork template build {spec.name}` builds it here)"
        )
    agent = source_inputs()
    boot_inputs = manifest.boot_manifest["inputs"]
    if any(boot_inputs.get(k) != v for k, v in agent.items()):
        raise TemplateError(
            "the file's kernel and initramfs carry another version's guest agent: export it "
            "again with this Sandfork version"
        )
    return spec


def _check_image(path: Path, spec: TemplateSpec) -> None:
    """A plain qcow2 of the spec's disk size: no backing file, no external data file."""
    info = json.loads(
        run(["qemu-img", "info", "--output=json", str(path)], what="qemu-img info").stdout
    )
    specific = info.get("format-specific", {}).get("data", {})
    if (
        info.get("format") != "qcow2"
        or "backing-filename" in info
        or "data-file" in specific
        or info.get("virtual-size") != spec.disk_size_mb << 20
    ):
        raise TemplateError(
            "the template file is invalid: rootfs.qcow2 is not a plain qcow2 image of "
            f"{spec.disk_size_mb} MiB"
        )


def _unpack(
    tar: TarFile,
    members: Iterator[TarInfo],
    manifest: ExportManifest,
    boot: Staging,
    rootfs: Staging,
) -> None:
    """Write each member the manifest lists, checked, into its staging directory."""
    staged: list[str] = []
    for member in members:
        name = member.name
        if name not in manifest.members or name in staged or not member.isreg():
            raise TemplateError(f"the template file has an unexpected entry {name[:200]!r}")
        size, sha256 = manifest.members[name]
        if member.size != size:  # checked before a byte is written: no bombs
            raise _corrupted(f"{name} is not of its listed size")
        target = (rootfs if name == "rootfs.qcow2" else boot).path / name
        if archive.copy_member(tar, member, target, size) != sha256:
            raise _corrupted(f"checksum mismatch in {name}")
        target.chmod(0o444 if name == "rootfs.qcow2" else 0o644)
        staged.append(name)
    missing = [n for n in manifest.members if n not in staged]
    if missing:
        raise TemplateError(f"the template file is truncated: {missing[0]} is missing")


def _corrupted(problem: str) -> TemplateError:
    return TemplateError(f"the template file is corrupted: {problem}")


def import_template(file: Path, into: Path | None = None) -> tuple[str, Path]:
    """Add the template exported to ``file`` to the user's cache (or to the folder
    ``into``: e.g. a shared one, ``/usr/share/sandfork/templates``); its name and the root
    image's directory. Nothing is written unless every check passes."""
    dest = into if into is not None else sandfork_cache()
    for area in ("boot", "rootfs"):
        (dest / area).mkdir(parents=True, exist_ok=True, mode=0o755)
    try:
        with build_lock(dest), archive.open_reader(file) as tar, ExitStack() as stack:
            members = iter(tar)
            first = next(members, None)
            if first is None or first.name != MANIFEST or not first.isreg():
                raise TemplateError("not a Sandfork template file: its manifest must come first")
            if first.size > MAX_MANIFEST_BYTES:
                raise TemplateError("the template file's manifest is too large")
            manifest = parse_manifest(archive.member_reader(tar, first).read())
            spec = _check_fits(manifest)
            boot_final = dest / "boot" / manifest.boot_key
            rootfs_final = dest / "rootfs" / f"{manifest.name}-{manifest.rootfs_key}"
            if read_manifest(rootfs_final) is not None and read_manifest(boot_final):
                return manifest.name, rootfs_final  # already here
            boot = stack.enter_context(Staging(boot_final))
            rootfs = stack.enter_context(Staging(rootfs_final))
            _unpack(tar, members, manifest, boot, rootfs)
            _check_image(rootfs.path / "rootfs.qcow2", spec)
            for staging in (boot, rootfs):
                staging.path.chmod(0o755)
            if read_manifest(boot_final) is None:
                boot.commit(manifest.boot_manifest)
            rootfs.commit({**manifest.rootfs_manifest, "boot_key": manifest.boot_key})
    except ArchiveError as e:
        raise _corrupted(str(e)) from e
    return manifest.name, rootfs_final
