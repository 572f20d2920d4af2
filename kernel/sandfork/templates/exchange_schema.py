"""The manifest of an exported template file, checked against a strict schema.

Every field is known and typed: the format, the template's name, its two artifacts (boot:
kernel + initramfs; rootfs: the root image), each with its key and its build manifest, and
the size and SHA-256 of each member. The members are a fixed set of plain names
(``MEMBERS``; ``vmlinux`` exactly when the kernel is a PVH ELF), so no name from the file
ever becomes a path. A key must be the hash of the inputs its manifest lists, so a file
cannot pass off one image under another's key. Nothing here touches the file system.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from sandfork import manifest_checks as checks

from .boot import key16
from .errors import TemplateError
from .spec import check_template_name

__all__ = ["FORMAT", "MAX_MANIFEST_BYTES", "MEMBERS", "ExportManifest", "parse_manifest"]

FORMAT = "sandfork-template/1"
MAX_MANIFEST_BYTES = 1 << 20
BOOT_MEMBERS = ("vmlinuz", "vmlinux", "initrd.img")
MEMBERS = (*BOOT_MEMBERS, "rootfs.qcow2")
"""Every member a file may have, in file order (after ``manifest.json``)."""
_BOOT_CAP = 512 << 20  # a kernel or an initramfs
_IMAGE_CAP = 64 << 30
_KEY = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class ExportManifest:
    """A validated manifest of an exported template."""

    name: str
    boot_key: str
    boot_manifest: dict[str, Any]
    rootfs_key: str
    rootfs_manifest: dict[str, Any]
    members: dict[str, tuple[int, str]]  # name -> (size, sha256), in file order

    def to_json(self) -> bytes:
        """The manifest as written into a file."""
        return json.dumps(
            {
                "format": FORMAT,
                "name": self.name,
                "boot": {"key": self.boot_key, "manifest": self.boot_manifest},
                "rootfs": {"key": self.rootfs_key, "manifest": self.rootfs_manifest},
                "members": {n: {"size": s, "sha256": h} for n, (s, h) in self.members.items()},
            },
            indent=1,
            sort_keys=True,
        ).encode()


def _fail(problem: str) -> TemplateError:
    return TemplateError(f"the template file's manifest is invalid: {problem}")


def _object(value: object, where: str, required: set[str]) -> dict[str, Any]:
    return checks.fields(value, where, required, _fail)


def _artifact(value: object, kind: str) -> tuple[str, dict[str, Any]]:
    """The key and build manifest of the artifact ``kind`` (boot or rootfs)."""
    entry = _object(value, kind, {"key", "manifest"})
    key = checks.matching(entry["key"], f"{kind}.key", _KEY, _fail)
    manifest = entry["manifest"]
    if not isinstance(manifest, dict):
        raise _fail(f"{kind}.manifest must be an object")
    if manifest.get("kind") != kind or manifest.get("key") != key:
        raise _fail(f"{kind}.manifest is not the manifest of the {kind} artifact {key}")
    inputs = manifest.get("inputs")
    if not isinstance(inputs, dict) or key16(inputs) != key:
        raise _fail(f"{kind}.key is not the key of the inputs its manifest lists")
    return key, manifest


def parse_manifest(data: bytes) -> ExportManifest:
    """Validate the manifest ``data`` (the first member of an exported template file)."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise _fail("it is larger than 1 MiB")
    raw = checks.document(data, _fail)
    top = _object(raw, "the manifest", {"format", "name", "boot", "rootfs", "members"})
    if top["format"] != FORMAT:
        raise TemplateError(f"not a Sandfork template file (format {str(top['format'])[:100]!r})")
    if not isinstance(top["name"], str):
        raise _fail("name must be a string")
    name = check_template_name(top["name"])
    boot_key, boot_manifest = _artifact(top["boot"], "boot")
    rootfs_key, rootfs_manifest = _artifact(top["rootfs"], "rootfs")
    if rootfs_manifest.get("name") != name:
        raise _fail(f"rootfs.manifest is not of the template {name!r}")
    pvh = boot_manifest.get("kernel_format") == "pvh-elf"
    expected = {n for n in MEMBERS if n != "vmlinux" or pvh}
    listed = _object(top["members"], "members", expected)
    members: dict[str, tuple[int, str]] = {}
    for member in (n for n in MEMBERS if n in expected):
        cap = _IMAGE_CAP if member == "rootfs.qcow2" else _BOOT_CAP
        members[member] = checks.member(listed[member], member, 1, cap, _fail)
    return ExportManifest(name, boot_key, boot_manifest, rootfs_key, rootfs_manifest, members)
