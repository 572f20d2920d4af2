"""Moving a snapshot between machines as one file.

The file is a zstd-compressed tar: ``manifest.json`` first (the snapshot's fields, the
template's boot and root image keys, and the size and SHA-256 of every member), then the
device state, the memory image, the disk layers above the template's root image (bottom
first) and the attachments. The importing machine must have built the same template; the
layers are re-based onto its copy.

An import trusts nothing in the file: the manifest must come first and pass a strict schema
(:mod:`sandfork.engine.manifest`: unknown fields, bad names and values beyond this engine's
limits are refused, and the sizes add up to no more than its cap); a member is written only
if the manifest lists it, only into the staging directory, and only if its tar header gives
the listed size, so no byte is written beyond that (a zip bomb is refused at its header);
runs of zeros are skipped so images stay sparse; layers must be plain qcow2 images without an
external data file. The imported snapshot gets a new id; where the file names paths (kernel,
initrd, backing files), the local ones are used.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

from sandfork import archive
from sandfork.backends.vm.images import Qcow2Images
from sandfork.engine.db import SnapshotRecord
from sandfork.engine.errors import ApiError, BadRequest
from sandfork.engine.manifest import (
    ATTACHMENT_PREFIX,
    FORMAT,
    MAX_MANIFEST_BYTES,
    SNAPSHOT_FIELDS,
    ImportLimits,
    Manifest,
    parse_manifest,
)
from sandfork.engine.snapshot_store import ATTACHMENTS

__all__ = [
    "ATTACHMENT_PREFIX",
    "FORMAT",
    "MANIFEST",
    "ImportLimits",
    "Manifest",
    "check_layers",
    "export_snapshot",
    "reset_tmp",
    "unpack",
]

MANIFEST = "manifest.json"


def export_snapshot(
    snap: SnapshotRecord, snap_dir: Path, memory: Path, out: Path, images: Qcow2Images
) -> None:
    """Write ``snap`` (its files in ``snap_dir``, its memory as the full image ``memory``)
    to ``out``, manifest first."""
    chain = images.backing_chain(Path(snap.disk))
    rootfs = chain[-1]  # the template's root image, which the importing machine builds itself
    layers = list(reversed(chain[:-1]))
    files = {"devices.state": snap_dir / "devices.state", "memory.img": memory}
    files |= {f"layer{i}.qcow2": layer for i, layer in enumerate(layers)}
    files |= {ATTACHMENT_PREFIX + a: snap_dir / ATTACHMENTS / a for a in snap.attachments}
    sizes = {name: path.stat().st_size for name, path in files.items()}
    sums = {name: archive.sha256_file(path) for name, path in files.items()}
    members = {name: {"size": sizes[name], "sha256": sums[name]} for name in files}
    manifest = {
        "format": FORMAT,
        "snapshot": {k: getattr(snap, k) for k in sorted(SNAPSHOT_FIELDS)},
        "boot_key": Path(snap.vm["kernel"]).parent.name,
        "rootfs_key": rootfs.parent.name,
        "layers": len(layers),
        "members": members,
    }
    data = json.dumps(manifest, indent=1).encode()
    try:
        with archive.open_writer(out) as tar:
            archive.add_bytes(tar, MANIFEST, data)
            for name, path in files.items():
                archive.add_file(tar, name, path, sizes[name], sums[name])
    except archive.ArchiveError as e:
        raise ApiError(f"snapshot {snap.id} could not be exported: {e}", 409) from e


# --- unpacking -----------------------------------------------------------------------------


def unpack(
    file: Path,
    staging: Path,
    limits: ImportLimits,
    admit: Callable[[Manifest], None] | None = None,
) -> Manifest:
    """Extract an exported snapshot into the empty directory ``staging``; its manifest.

    Raises a 400 for anything but an intact file within ``limits``; files already written
    to ``staging`` are the caller's to remove. ``admit`` sees the valid manifest before any
    member is written, and may refuse it (a quota, say) by raising.
    """
    try:
        with archive.open_reader(file) as tar:
            return _extract(tar, staging, limits, admit)
    except archive.ArchiveError as e:
        raise BadRequest(f"the snapshot {e}") from e
    except OSError as e:
        raise ApiError(f"could not store the imported snapshot: {e.strerror or e}", 507) from e


def _extract(
    tar: tarfile.TarFile,
    staging: Path,
    limits: ImportLimits,
    admit: Callable[[Manifest], None] | None,
) -> Manifest:
    """Check the manifest (first), then stream each member it lists into ``staging``."""
    manifest: Manifest | None = None
    staged: set[str] = set()
    for member in tar:
        name = member.name
        if manifest is None:
            if name != MANIFEST or not member.isreg():
                raise BadRequest(
                    f"not a {FORMAT} file: its manifest must come first (a file exported "
                    "by an older Sandfork must be exported again)"
                )
            if member.size > MAX_MANIFEST_BYTES:
                raise BadRequest("the snapshot file's manifest is too large")
            manifest = parse_manifest(archive.member_reader(tar, member).read(), limits)
            if admit is not None:
                admit(manifest)
            continue
        if not member.isreg() or name not in manifest.members or name in staged:
            raise BadRequest(f"the snapshot file has an unexpected entry {name[:200]!r}")
        size, sha256 = manifest.members[name]
        if member.size != size:  # checked before a byte is written: no bombs
            raise BadRequest(f"the snapshot file is corrupted: {name} is not of its listed size")
        if archive.copy_member(tar, member, staging / name, size) != sha256:
            raise BadRequest(f"the snapshot file is corrupted: checksum mismatch in {name}")
        staged.add(name)
    if manifest is None:
        raise BadRequest("the snapshot file is empty or truncated: it has no manifest")
    missing = sorted(set(manifest.members) - staged)
    if missing:
        raise BadRequest(f"the snapshot file is truncated: {missing[0]} is incomplete")
    return manifest


# --- layers --------------------------------------------------------------------------------


def check_layers(staging: Path, count: int, rootfs: Path, images: Qcow2Images) -> None:
    """A 400 unless every staged layer passes the backend's check against the local root
    image (see :meth:`sandfork.backends.vm.images.Qcow2Images.check_layer`)."""
    disk_size = images.virtual_size(rootfs)
    for i in range(count):
        try:
            images.check_layer(staging / f"layer{i}.qcow2", disk_size)
        except ValueError as e:
            raise BadRequest(f"the snapshot file is invalid: {e}") from e


def reset_tmp(directory: Path) -> None:
    """Empty (or create, mode 0700) the engine's directory of export and import files."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(mode=0o700, parents=True)
