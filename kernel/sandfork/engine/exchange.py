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

import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

import zstandard

from sandfork.backends.base import DiskImages
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
from sandfork.engine.snapshots import ATTACHMENTS

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

_CHUNK = 1 << 20
_BLOCK = 1 << 16  # granularity of the zero test of sparse writes
_ZEROS = bytes(_BLOCK)
_MAX_WINDOW = 1 << 27  # zstd's default window limit; a frame asking for more is refused


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class _Hashing:
    """A reader that hashes what passes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha256 = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.sha256.update(data)
        return data


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)  # no owner, times or modes of this host in the file
    info.size, info.mode = size, 0o644
    return info


def export_snapshot(snap: SnapshotRecord, snap_dir: Path, out: Path, images: DiskImages) -> None:
    """Write ``snap`` (its files in ``snap_dir``) to ``out``, manifest first."""
    chain = images.backing_chain(Path(snap.disk))
    rootfs = chain[-1]  # the template's root image, which the importing machine builds itself
    layers = list(reversed(chain[:-1]))
    files = {"devices.state": snap_dir / "devices.state", "memory.img": snap_dir / "memory.img"}
    files |= {f"layer{i}.qcow2": layer for i, layer in enumerate(layers)}
    files |= {ATTACHMENT_PREFIX + a: snap_dir / ATTACHMENTS / a for a in snap.attachments}
    members = {n: {"size": p.stat().st_size, "sha256": _sha256(p)} for n, p in files.items()}
    manifest = {
        "format": FORMAT,
        "snapshot": {k: getattr(snap, k) for k in sorted(SNAPSHOT_FIELDS)},
        "boot_key": Path(snap.vm["kernel"]).parent.name,
        "rootfs_key": rootfs.parent.name,
        "layers": len(layers),
        "members": members,
    }
    data = json.dumps(manifest, indent=1).encode()
    with (
        out.open("wb") as raw,
        zstandard.ZstdCompressor(level=3, threads=-1).stream_writer(raw) as compressed,
        tarfile.open(fileobj=compressed, mode="w|") as tar,
    ):
        tar.addfile(_tarinfo(MANIFEST, len(data)), io.BytesIO(data))
        for name, path in files.items():
            with path.open("rb") as f:
                reader = _Hashing(f)
                tar.addfile(_tarinfo(name, members[name]["size"]), reader)  # type: ignore[arg-type]
            if reader.sha256.hexdigest() != members[name]["sha256"]:
                raise ApiError(f"{name} of snapshot {snap.id} changed while it was exported", 409)


# --- unpacking -----------------------------------------------------------------------------


def _write_sparse(source: IO[bytes], path: Path, size: int) -> str:
    """Copy ``size`` bytes to the new file ``path``, seeking over zero blocks; their SHA-256."""
    digest = hashlib.sha256()
    written = 0
    with path.open("xb") as dest:
        while written < size and (chunk := source.read(min(_CHUNK, size - written))):
            digest.update(chunk)
            for start in range(0, len(chunk), _BLOCK):
                block = chunk[start : start + _BLOCK]
                if block == _ZEROS[: len(block)]:
                    dest.seek(len(block), io.SEEK_CUR)
                else:
                    dest.write(block)
            written += len(chunk)
        dest.truncate(written)
    return digest.hexdigest()


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
        with (
            file.open("rb") as raw,
            zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW).stream_reader(
                raw, read_across_frames=True
            ) as decompressed,
            tarfile.open(fileobj=decompressed, mode="r|") as tar,
        ):
            return _extract(tar, staging, limits, admit)
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as e:
        raise BadRequest(f"the snapshot file is corrupted or truncated: {e}") from e
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
            manifest = parse_manifest(_member(tar, member).read(), limits)
            if admit is not None:
                admit(manifest)
            continue
        if not member.isreg() or name not in manifest.members or name in staged:
            raise BadRequest(f"the snapshot file has an unexpected entry {name[:200]!r}")
        size, sha256 = manifest.members[name]
        if member.size != size:  # checked before a byte is written: no bombs
            raise BadRequest(f"the snapshot file is corrupted: {name} is not of its listed size")
        if _write_sparse(_member(tar, member), staging / name, size) != sha256:
            raise BadRequest(f"the snapshot file is corrupted: checksum mismatch in {name}")
        staged.add(name)
    if manifest is None:
        raise BadRequest("the snapshot file is empty or truncated: it has no manifest")
    missing = sorted(set(manifest.members) - staged)
    if missing:
        raise BadRequest(f"the snapshot file is truncated: {missing[0]} is incomplete")
    return manifest


def _member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    source = tar.extractfile(member)
    assert source is not None  # a regular file
    return source


# --- layers --------------------------------------------------------------------------------


def check_layers(staging: Path, count: int, rootfs: Path, images: DiskImages) -> None:
    """A 400 unless every staged layer passes the backend's check against the local root
    image (see :meth:`sandfork.backends.base.DiskImages.check_layer`)."""
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
