"""The manifest of an exported snapshot file, checked against a strict schema.

Every field is known, typed and bounded: unknown fields, names that are not plain names,
members other than the fixed set (``devices.state``, ``memory.img``, ``layerN.qcow2`` for N
below ``layers``, ``attachment.<name>`` for each attachment) and a VM beyond this engine's
limits are refused with a 400 naming the field. Nothing here touches the file system.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandfork import manifest_checks as checks
from sandfork.engine.config import EngineConfig
from sandfork.engine.db import SnapshotRecord
from sandfork.engine.errors import BadRequest
from sandfork.engine.snapshot_store import (
    MAX_ATTACHMENT_BYTES,
    SNAPSHOT_ID,
    check_attachment_name,
    check_name,
)
from sandfork.protocol import CONTEXT_ID, ENGINE_METADATA_KEYS, MIN_MEMORY_MB, SANDBOX_ID
from sandfork.templates.errors import TemplateError
from sandfork.templates.spec import check_template_name

ATTACHMENT_PREFIX = "attachment."  # attachments travel flat in the tar: attachment.<name>
FORMAT = "sandfork-snapshot/2"  # /1 had the manifest last
MAX_LAYERS = 256
MAX_DEVICE_STATE_BYTES = 256 * 2**20
MAX_MANIFEST_BYTES = 2**20
MAX_DISK_BYTES = 64 * 2**30  # all layers of one snapshot together
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SANDBOX_ID = re.compile(SANDBOX_ID)
_CONTEXT_ID = re.compile(CONTEXT_ID)


SNAPSHOT_FIELDS = {
    "id",
    "name",
    "created_at",
    "sandbox_id",
    "template",
    "parent_id",
    "vm",
    "size_bytes",
    "paused_ms",
    "contexts",
    "metadata",
    "attachments",
}
# "cpus": the CPU count's name in export files (MachineSpec.to_dict), earlier ones included.
_VM_FIELDS = {"kernel", "initrd", "cmdline", "memory_mb", "cpus", "accelerator"}


@dataclass(frozen=True)
class ImportLimits:
    """What an imported snapshot may ask of this engine."""

    max_memory_mb: int
    max_cpus: int
    max_bytes: int  # all members together, decompressed

    @classmethod
    def of(cls, config: EngineConfig) -> ImportLimits:
        """The limits of an engine with ``config``."""
        memory = config.max_memory_mb * 2**20
        extra = MAX_DEVICE_STATE_BYTES + MAX_ATTACHMENT_BYTES + MAX_MANIFEST_BYTES
        return cls(config.max_memory_mb, config.max_cpus, memory + MAX_DISK_BYTES + extra)


@dataclass(frozen=True)
class Manifest:
    """A validated manifest: the imported snapshot's fields and the file's members."""

    original_id: str
    fields: dict[str, Any]  # name, created_at, sandbox_id, template, ... (SnapshotRecord's)
    memory_mb: int
    cpu: int
    accelerator: str
    boot_key: str
    rootfs_key: str
    layers: int
    members: dict[str, tuple[int, str]]  # name -> (size, sha256)

    @property
    def total_bytes(self) -> int:
        """The size of all members together."""
        return sum(size for size, _ in self.members.values())

    def record(self, snapshot_id: str, disk: Path, vm: dict[str, Any]) -> SnapshotRecord:
        """The record of the imported snapshot, under the new ``snapshot_id``."""
        return SnapshotRecord(
            id=snapshot_id, disk=str(disk), vm=vm, size_bytes=self.total_bytes, **self.fields
        )


def _fail(problem: str) -> BadRequest:
    return BadRequest(f"the snapshot file's manifest is invalid: {problem}")


def _object(value: object, where: str, required: set[str], optional: set[str]) -> dict[str, Any]:
    return checks.fields(value, where, required, _fail, optional)


def _int(value: object, where: str, lo: int, hi: int, fail: checks.Fail = _fail) -> int:
    return checks.integer(value, where, lo, hi, fail)


def _str(value: object, where: str, pattern: re.Pattern[str], fail: checks.Fail = _fail) -> str:
    return checks.matching(value, where, pattern, fail)


def _checked(check: Callable[[str], str], value: object, where: str, fail: checks.Fail) -> str:
    if not isinstance(value, str):
        raise fail(f"{where} must be a string")
    try:
        return check(value)
    except (BadRequest, TemplateError) as e:
        raise fail(f"{where}: {e}") from e


def _created_at(value: object, fail: checks.Fail) -> str:
    if not isinstance(value, str) or len(value) > 40:
        raise fail("snapshot.created_at must be an ISO 8601 time")
    try:
        datetime.datetime.fromisoformat(value)
    except ValueError as e:
        raise fail("snapshot.created_at must be an ISO 8601 time") from e
    return value


def record_fields(snap: dict[str, Any], fail: checks.Fail) -> dict[str, Any]:
    """The fields of a snapshot's record another engine wrote (``snap``: an object of
    :data:`SNAPSHOT_FIELDS`' names), checked; its relations to that engine's snapshots and
    sandboxes are dropped."""
    if snap.get("parent_id") is not None:
        _str(snap["parent_id"], "snapshot.parent_id", re.compile(SNAPSHOT_ID), fail)
    if snap.get("name") is not None:
        _checked(check_name, snap["name"], "snapshot.name", fail)
    _int(snap.get("size_bytes", 0), "snapshot.size_bytes", 0, 2**62, fail)
    contexts = snap.get("contexts", [])
    if not isinstance(contexts, list) or len(contexts) > 256:
        raise fail("snapshot.contexts must be a list of at most 256 context ids")
    for i, ctx in enumerate(contexts):
        _str(ctx, f"snapshot.contexts[{i}]", _CONTEXT_ID, fail)
    metadata = snap.get("metadata", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise fail("snapshot.metadata must map strings to strings")
    if len(json.dumps(metadata)) > 64 * 1024:
        raise fail("snapshot.metadata is larger than 64 KiB")
    attachments = snap.get("attachments", [])
    if not isinstance(attachments, list) or len(set(map(str, attachments))) != len(attachments):
        raise fail("snapshot.attachments must be a list of distinct file names")
    for i, name in enumerate(attachments):
        _checked(check_attachment_name, name, f"snapshot.attachments[{i}]", fail)
    return {
        "name": snap.get("name"),
        "created_at": _created_at(snap["created_at"], fail),
        "sandbox_id": _str(snap["sandbox_id"], "snapshot.sandbox_id", _SANDBOX_ID, fail),
        "template": _checked(check_template_name, snap["template"], "snapshot.template", fail),
        "parent_id": None,  # it names a snapshot of the other engine
        "paused_ms": _int(snap.get("paused_ms", 0), "snapshot.paused_ms", 0, 2**31, fail),
        "contexts": list(contexts),
        # The other engine's relations name its sandboxes; a hibernation capture's would hide it.
        "metadata": {k: v for k, v in metadata.items() if k not in ENGINE_METADATA_KEYS},
        "attachments": list(attachments),
    }


def _snapshot_fields(
    value: object, limits: ImportLimits
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    snap = _object(value, "snapshot", {"id", "created_at", "sandbox_id", "template", "vm"},
                   SNAPSHOT_FIELDS)  # fmt: skip
    original_id = _str(snap["id"], "snapshot.id", re.compile(SNAPSHOT_ID))
    fields = record_fields(snap, _fail)
    vm = _object(snap["vm"], "snapshot.vm", _VM_FIELDS, {"backend"})
    if vm.get("backend", "vm") != "vm":
        raise _fail("snapshot.vm.backend must be 'vm': only VM snapshots travel in files")
    if not isinstance(vm["cmdline"], str) or len(vm["cmdline"]) > 4096:
        raise _fail("snapshot.vm.cmdline must be a string")  # not used: ours is
    if vm["accelerator"] not in ("kvm", "tcg"):
        raise _fail("snapshot.vm.accelerator must be 'kvm' or 'tcg'")
    _int(vm["memory_mb"], "snapshot.vm.memory_mb", MIN_MEMORY_MB, limits.max_memory_mb)
    _int(vm["cpus"], "snapshot.vm.cpus", 1, limits.max_cpus)
    return original_id, fields, vm


def parse_manifest(data: bytes, limits: ImportLimits) -> Manifest:
    """Validate a manifest against the schema and this engine's ``limits``."""
    raw = checks.document(data, _fail)
    try:
        json.dumps(raw, ensure_ascii=False).encode()  # no lone surrogates from \ud800 escapes
    except UnicodeError as e:
        raise _fail("it is not JSON (UTF-8, without lone surrogates)") from e
    top = _object(raw, "the manifest", {"format", "snapshot", "boot_key", "rootfs_key",
                                        "layers", "members"}, set())  # fmt: skip
    if top["format"] != FORMAT:
        raise BadRequest(f"not a Sandfork snapshot file (format {str(top['format'])[:100]!r})")
    original_id, fields, vm = _snapshot_fields(top["snapshot"], limits)
    layers = _int(top["layers"], "layers", 1, MAX_LAYERS)
    expected = {"devices.state", "memory.img"} | {f"layer{i}.qcow2" for i in range(layers)}
    expected |= {ATTACHMENT_PREFIX + a for a in fields["attachments"]}
    listed = _object(top["members"], "members", expected, set())
    members: dict[str, tuple[int, str]] = {}
    for name in sorted(expected):
        members[name] = checks.member(listed[name], name, 0, _cap(name, limits), _fail)
    if members["memory.img"][0] > vm["memory_mb"] * 2**20:
        raise _fail("memory.img is larger than the snapshot's memory")
    attached = sum(s for n, (s, _) in members.items() if n.startswith(ATTACHMENT_PREFIX))
    if attached > MAX_ATTACHMENT_BYTES:
        raise _fail(f"attachments are limited to {MAX_ATTACHMENT_BYTES >> 20} MiB in all")
    if sum(size for size, _ in members.values()) > limits.max_bytes:
        raise _fail(f"the members add up to more than this engine's {limits.max_bytes} bytes")
    return Manifest(
        original_id=original_id,
        fields=fields,
        memory_mb=vm["memory_mb"],
        cpu=vm["cpus"],
        accelerator=vm["accelerator"],
        boot_key=_str(top["boot_key"], "boot_key", _KEY),
        rootfs_key=_str(top["rootfs_key"], "rootfs_key", _KEY),
        layers=layers,
        members=members,
    )


def _cap(name: str, limits: ImportLimits) -> int:
    """The most bytes the listed member ``name`` may have."""
    if name == "memory.img":
        return limits.max_memory_mb * 2**20
    if name == "devices.state":
        return MAX_DEVICE_STATE_BYTES
    if name.startswith(ATTACHMENT_PREFIX):
        return MAX_ATTACHMENT_BYTES
    return min(MAX_DISK_BYTES, limits.max_bytes)  # a layer
