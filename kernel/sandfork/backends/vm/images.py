"""The VM backend's disk images: qcow2 layers made, inspected and re-based with ``qemu-img``.

The engine never runs ``qemu-img`` itself: it reaches these through the backend's
``images`` (:class:`Qcow2Images`), so another backend can bring its own disk format.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

_QCOW2_MAGIC = b"QFI\xfb"
_QCOW2_EXTERNAL_DATA_FILE = 1 << 2  # incompatible feature bit of qcow2 version 3


class ImageError(ValueError):
    """A disk image that may not be used: the message says why."""


def _info(image: Path, *options: str) -> Any:
    """``qemu-img info`` of ``image`` as JSON."""
    out = subprocess.run(
        ["qemu-img", "info", "--output=json", *options, str(image)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


class Qcow2Images:
    """Copy-on-write layers of qcow2 images."""

    suffix = ".qcow2"

    def create_overlay(self, base: Path, overlay: Path) -> None:
        """Make ``overlay`` a copy-on-write layer over ``base``."""
        subprocess.run(
            [
                "qemu-img",
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "qcow2",
                "-b",
                str(base),
                str(overlay),
            ],
            check=True,
            capture_output=True,
        )

    def backing_chain(self, image: Path) -> list[Path]:
        """``image`` and the images below it, top first (from the image headers)."""
        return [Path(entry["filename"]) for entry in _info(image, "--backing-chain", "-U")]

    def virtual_size(self, image: Path) -> int:
        """The size of the disk ``image`` holds, in bytes."""
        return int(_info(image, "-U")["virtual-size"])

    def rebase(self, layer: Path, backing: Path) -> None:
        """Point a layer at a new backing file (header only; contents unchanged)."""
        subprocess.run(
            ["qemu-img", "rebase", "-u", "-F", "qcow2", "-b", str(backing), str(layer)],
            check=True,
            capture_output=True,
        )

    def check_layer(self, layer: Path, max_virtual_size: int) -> None:
        """Raise :class:`ImageError` unless ``layer`` (from an untrusted file) is a plain
        qcow2 image, no external data file, not encrypted, no larger than
        ``max_virtual_size``. Its backing file name is ignored: :meth:`rebase` replaces it."""
        with layer.open("rb") as f:
            header = f.read(104)
        version = int.from_bytes(header[4:8], "big")
        if header[:4] != _QCOW2_MAGIC or version not in (2, 3):
            raise ImageError(f"{layer.name} is not a qcow2 image")
        if version == 3 and int.from_bytes(header[72:80], "big") & _QCOW2_EXTERNAL_DATA_FILE:
            raise ImageError(f"{layer.name} has an external data file")
        try:  # opens neither the backing file nor (as checked) a data file
            info = _info(layer, "-f", "qcow2")
        except subprocess.CalledProcessError as e:
            raise ImageError(f"{layer.name} is not a valid qcow2 image") from e
        specific = info.get("format-specific", {}).get("data", {})
        if info.get("format") != "qcow2" or "data-file" in specific:
            raise ImageError(f"{layer.name} has an external data file")
        if info.get("encrypted"):
            raise ImageError(f"{layer.name} is encrypted")
        if info.get("virtual-size", 0) > max_virtual_size:
            raise ImageError(f"{layer.name} is larger than the disk")
