"""Moving a snapshot between machines as one file.

The file is a zstd-compressed tar: the snapshot's device state and memory image, the disk
layers above the template's root image (bottom first), its attachments, and ``manifest.json``
last, with the size and SHA-256 of every member. The importing machine must have built the
same template (same boot and root image keys); the layers are re-based onto its copy. A
truncated or corrupted file fails the import with a clear error and leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import IO, Any

import zstandard

from sandfork.engine.db import SnapshotRecord
from sandfork.engine.errors import BadRequest
from sandfork.engine.snapshots import ATTACHMENTS

ATTACHMENT_PREFIX = "attachment."  # attachments travel flat in the tar: attachment.<name>

FORMAT = "sandfork-snapshot/1"
_CHUNK = 1 << 20


class _Hashing:
    """A reader that hashes what passes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha256 = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.sha256.update(data)
        return data


def backing_chain(image: Path) -> list[Path]:
    """``image`` and the images below it, top first (from the qcow2 headers)."""
    out = subprocess.run(
        ["qemu-img", "info", "--backing-chain", "--output=json", "-U", str(image)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [Path(entry["filename"]) for entry in json.loads(out)]


def export_snapshot(snap: SnapshotRecord, snap_dir: Path, out: Path) -> None:
    """Write ``snap`` (its files in ``snap_dir``) to ``out``."""
    chain = backing_chain(Path(snap.disk))
    rootfs = chain[-1]  # the template's root image, which the importing machine builds itself
    layers = list(reversed(chain[:-1]))
    members: dict[str, dict[str, Any]] = {}
    with (
        out.open("wb") as raw,
        zstandard.ZstdCompressor(level=3, threads=-1).stream_writer(raw) as compressed,
        tarfile.open(fileobj=compressed, mode="w|") as tar,
    ):
        files = {"devices.state": snap_dir / "devices.state", "memory.img": snap_dir / "memory.img"}
        files |= {f"layer{i}.qcow2": layer for i, layer in enumerate(layers)}
        files |= {ATTACHMENT_PREFIX + a: snap_dir / ATTACHMENTS / a for a in snap.attachments}
        for name, path in files.items():
            info = tar.gettarinfo(str(path), arcname=name)
            with path.open("rb") as f:
                reader = _Hashing(f)
                tar.addfile(info, reader)  # type: ignore[arg-type]
            members[name] = {"size": info.size, "sha256": reader.sha256.hexdigest()}
        manifest = {
            "format": FORMAT,
            "snapshot": {k: v for k, v in snap.__dict__.items() if k not in ("disk", "hidden")},
            "boot_key": Path(snap.vm["kernel"]).parent.name,
            "rootfs_key": rootfs.parent.name,
            "layers": len(layers),
            "members": members,
        }
        data = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        tar.addfile(info, _Hashing(_BytesReader(data)))  # type: ignore[arg-type]


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int = -1) -> bytes:
        chunk, self.data = (self.data, b"") if size < 0 else (self.data[:size], self.data[size:])
        return chunk


def unpack(file: Path, staging: Path) -> dict[str, Any]:
    """Extract an exported snapshot into ``staging`` and verify it; return its manifest."""
    try:
        with (
            file.open("rb") as raw,
            zstandard.ZstdDecompressor().stream_reader(raw) as decompressed,
            tarfile.open(fileobj=decompressed, mode="r|") as tar,
        ):
            for member in tar:
                if not member.isfile() or "/" in member.name or member.name.startswith("."):
                    raise BadRequest(f"unexpected entry {member.name!r} in the snapshot file")
                source = tar.extractfile(member)
                assert source is not None
                with (staging / member.name).open("wb") as dest:
                    shutil.copyfileobj(source, dest, _CHUNK)
    except (tarfile.TarError, zstandard.ZstdError, EOFError, OSError) as e:
        raise BadRequest(f"the snapshot file is corrupted or truncated: {e}") from e
    try:
        manifest: dict[str, Any] = json.loads((staging / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise BadRequest("the snapshot file has no readable manifest (truncated?)") from e
    if manifest.get("format") != FORMAT:
        raise BadRequest(f"not a Sandfork snapshot file (format {manifest.get('format')!r})")
    for name, expected in manifest["members"].items():
        path = staging / name
        if not path.exists() or path.stat().st_size != expected["size"]:
            raise BadRequest(f"the snapshot file is truncated: {name} is incomplete")
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
        if digest.hexdigest() != expected["sha256"]:
            raise BadRequest(f"the snapshot file is corrupted: checksum mismatch in {name}")
    return manifest


def rebase(layer: Path, backing: Path) -> None:
    """Point a qcow2 layer at a new backing file (header only; contents unchanged)."""
    subprocess.run(
        ["qemu-img", "rebase", "-u", "-F", "qcow2", "-b", str(backing), str(layer)],
        check=True,
        capture_output=True,
    )
