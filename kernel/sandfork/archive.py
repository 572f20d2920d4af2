"""Streaming zstd-compressed tar files of verified members: what exported files are made of.

Writing: :func:`open_writer` gives a streaming tar whose members carry no owner, mode or time
of this host; :func:`add_file` adds a file while hashing it, so a file that changes while it
is written is noticed. Reading: :func:`open_reader` streams the members in order, with a
bounded zstd window; :func:`copy_member` writes one member to a new file (never over an
existing one), exactly the listed number of bytes, skipping runs of zeros so disk images
stay sparse, and returns its SHA-256. Nothing here decides which members are allowed: the
caller checks each name against its own manifest before writing anything.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import zstandard

__all__ = [
    "ArchiveError",
    "add_bytes",
    "add_file",
    "copy_member",
    "member_reader",
    "open_reader",
    "open_writer",
    "sha256_file",
]

_CHUNK = 1 << 20
_BLOCK = 1 << 16  # granularity of the zero test of sparse writes
_ZEROS = bytes(_BLOCK)
MAX_WINDOW = 1 << 27
"""zstd's default window limit; a frame asking for more memory is refused."""


class ArchiveError(Exception):
    """The file is not a readable zstd tar (corrupted, truncated), or a member changed."""


def sha256_file(path: Path) -> str:
    """The SHA-256 hex digest of the file ``path``."""
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


@contextmanager
def open_writer(out: Path, level: int = 3) -> Iterator[tarfile.TarFile]:
    """A streaming tar written to the new file ``out`` through zstd (all cores)."""
    with (
        out.open("xb") as raw,
        zstandard.ZstdCompressor(level=level, threads=-1).stream_writer(raw) as compressed,
        tarfile.open(fileobj=compressed, mode="w|") as tar,
    ):
        yield tar


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Add the member ``name`` holding ``data``."""
    tar.addfile(_tarinfo(name, len(data)), io.BytesIO(data))


def add_file(tar: tarfile.TarFile, name: str, path: Path, size: int, sha256: str) -> None:
    """Add ``path`` as the member ``name``; :class:`ArchiveError` unless it still has the
    ``size`` and ``sha256`` listed for it (it changed while it was written)."""
    with path.open("rb") as f:
        reader = _Hashing(f)
        tar.addfile(_tarinfo(name, size), reader)  # type: ignore[arg-type]
    if reader.sha256.hexdigest() != sha256:
        raise ArchiveError(f"{path} changed while it was exported")


@contextmanager
def open_reader(path: Path) -> Iterator[tarfile.TarFile]:
    """The zstd tar ``path``, to iterate over in file order (read each member with
    :func:`member_reader` or :func:`copy_member` before going on to the next).

    A damaged or truncated file raises :class:`ArchiveError`, while it is read too.
    """
    try:
        with (
            path.open("rb") as raw,
            zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(
                raw, read_across_frames=True
            ) as decompressed,
            tarfile.open(fileobj=decompressed, mode="r|") as tar,
        ):
            yield tar
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as e:
        raise ArchiveError(f"the file is corrupted or truncated: {e}") from e


def member_reader(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    """A reader of the regular-file ``member`` of ``tar``."""
    source = tar.extractfile(member) if member.isreg() else None
    if source is None:
        raise ArchiveError(f"{member.name[:200]!r} is not a regular file")
    return source


def copy_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path, size: int) -> str:
    """Write the first ``size`` bytes of ``member`` to the new file ``dest`` (sparse where
    zero); the SHA-256 of what was written. The caller checks ``member.size`` first."""
    source = member_reader(tar, member)
    digest = hashlib.sha256()
    written = 0
    with dest.open("xb") as out:
        while written < size and (chunk := source.read(min(_CHUNK, size - written))):
            digest.update(chunk)
            for start in range(0, len(chunk), _BLOCK):
                block = chunk[start : start + _BLOCK]
                if block == _ZEROS[: len(block)]:
                    out.seek(len(block), io.SEEK_CUR)
                else:
                    out.write(block)
            written += len(chunk)
        out.truncate(written)
    return digest.hexdigest()
