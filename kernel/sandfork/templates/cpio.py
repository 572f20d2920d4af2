"""A minimal writer and reader for the ``newc`` cpio format the kernel unpacks as initramfs."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from typing import BinaryIO

__all__ = ["CpioEntry", "CpioWriter", "read_cpio"]

_MAGIC = b"070701"
_TRAILER = "TRAILER!!!"


def _pad4(n: int) -> bytes:
    return b"\0" * (-n % 4)


@dataclass(frozen=True)
class CpioEntry:
    """One member of an archive (path without the leading ``/``)."""

    path: str
    mode: int
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)

    @property
    def is_dir(self) -> bool:
        """True for a directory."""
        return stat.S_ISDIR(self.mode)


class CpioWriter:
    """Writes a ``newc`` archive to a binary stream; parent directories are added as needed.

    All members are owned by root with a fixed mtime, so equal inputs give equal archives.
    """

    def __init__(self, out: BinaryIO, mtime: int = 0) -> None:
        self._out = out
        self._mtime = mtime
        self._ino = 0
        self._dirs: set[str] = set()
        self.paths: list[str] = []

    def _member(
        self, path: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)
    ) -> None:
        name = path.strip("/")
        self._ino += 1
        nlink = 2 if stat.S_ISDIR(mode) else 1
        fields = (self._ino, mode, 0, 0, nlink, self._mtime, len(data), 0, 0, *rdev)
        encoded = name.encode() + b"\0"
        header = _MAGIC + b"".join(b"%08X" % f for f in fields)
        header += b"%08X" % len(encoded) + b"%08X" % 0
        self._out.write(header + encoded + _pad4(len(header) + len(encoded)))
        self._out.write(data + _pad4(len(data)))
        if name != _TRAILER:
            self.paths.append("/" + name)

    def _parents(self, path: str) -> None:
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.directory("/".join(parts[:i]))

    def directory(self, path: str, mode: int = 0o755) -> None:
        """Add a directory (once; repeated calls are ignored)."""
        name = path.strip("/")
        if name in self._dirs:
            return
        self._parents(name)
        self._dirs.add(name)
        self._member(name, stat.S_IFDIR | mode)

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Add a regular file."""
        self._parents(path)
        self._member(path, stat.S_IFREG | mode, data)

    def symlink(self, path: str, target: str) -> None:
        """Add a symbolic link."""
        self._parents(path)
        self._member(path, stat.S_IFLNK | 0o777, target.encode())

    def char_device(self, path: str, major: int, minor: int, mode: int = 0o600) -> None:
        """Add a character device node (no root needed: it is only a record in the archive)."""
        self._parents(path)
        self._member(path, stat.S_IFCHR | mode, rdev=(major, minor))

    def close(self) -> None:
        """Write the trailer (the stream itself is left open)."""
        self._member(_TRAILER, 0)


def read_cpio(data: bytes) -> list[CpioEntry]:
    """Parse an uncompressed ``newc`` archive (used to verify what was written)."""
    entries = []
    pos = 0
    while pos + 110 <= len(data):
        if data[pos : pos + 6] != _MAGIC:
            raise ValueError(f"bad cpio magic at offset {pos}")
        f = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, rmaj, rmin, namesize = f[1], f[6], f[9], f[10], f[11]
        name_start = pos + 110
        name = data[name_start : name_start + namesize - 1].decode()
        pos = name_start + namesize
        pos += -pos % 4
        body = data[pos : pos + size]
        pos += size
        pos += -pos % 4
        if name == _TRAILER:
            break
        entries.append(CpioEntry(name, mode, body, (rmaj, rmin)))
    return entries
