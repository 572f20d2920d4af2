"""A stored snapshot's manifest: its files and their chunks, checked as hostile input.

The manifest comes from a bucket that others may write, so it is parsed by
:mod:`sandfork.strict_json`'s rule and a strict schema before anything is fetched: every field
known and typed; names relative, ``/``-separated, without ``.``/``..``/empty parts or NUL, each
under a directory listed before it and listed once; sizes within the caller's budget; exactly
the chunks a size needs (each a SHA-256); kinds only those a snapshot holds (files,
directories, symbolic links, FIFOs and overlayfs whiteouts: no device can be smuggled in);
extended attributes only of the allowed families. ``meta`` is the engine's own section, checked
by the engine (:mod:`sandfork.engine.remote`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from sandfork import manifest_checks as checks

FORMAT = "sandfork-store/1"
CHUNK_SIZE = 4 * 2**20
MAX_MANIFEST_BYTES = 64 * 2**20
MAX_ENTRIES = 1_000_000
MAX_NAME = 4096
MAX_XATTR_BYTES = 64 * 1024
KINDS = ("file", "dir", "symlink", "fifo", "whiteout")
XATTR_ALLOWED = ("user.", "trusted.overlay.opaque")  # prefixes; capabilities and ACLs stay out
_UINT32 = 2**32 - 1


class ManifestError(ValueError):
    """A manifest that is not one this engine accepts; the message says where it is wrong."""


def _fail(problem: str) -> ManifestError:
    return ManifestError(f"the stored snapshot's manifest is invalid: {problem}")


@dataclass(frozen=True)
class Entry:
    """One file, directory or link of a stored snapshot, named relative to its root."""

    name: str
    kind: str
    mode: int  # permission bits (set-id and sticky included)
    size: int = 0
    chunks: tuple[str, ...] = ()  # the file's content, in order
    target: str = ""  # a symbolic link's
    uid: int = 0
    gid: int = 0
    xattrs: dict[str, bytes] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The entry as the manifest writes it (defaults left out)."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "mode": self.mode}
        if self.kind == "file":
            out |= {"size": self.size, "chunks": list(self.chunks)}
        if self.kind == "symlink":
            out["target"] = self.target
        if self.uid or self.gid:
            out |= {"uid": self.uid, "gid": self.gid}
        if self.xattrs:
            out["xattrs"] = {k: base64.b64encode(v).decode() for k, v in self.xattrs.items()}
        return out


@dataclass(frozen=True)
class Manifest:
    """What a snapshot's manifest says: its id, the engine's ``meta`` and its entries,
    parents before children."""

    snapshot_id: str
    meta: dict[str, Any]
    entries: tuple[Entry, ...]

    @property
    def total_bytes(self) -> int:
        """The size of every file together."""
        return sum(e.size for e in self.entries)

    def chunks(self) -> set[str]:
        """Every distinct chunk the snapshot's files are made of."""
        return {c for e in self.entries for c in e.chunks}

    def encode(self) -> bytes:
        """The manifest as stored."""
        doc = {
            "format": FORMAT,
            "snapshot_id": self.snapshot_id,
            "chunk_size": CHUNK_SIZE,
            "meta": self.meta,
            "entries": [e.to_json() for e in self.entries],
        }
        return json.dumps(doc, separators=(",", ":")).encode()


def chunk_count(size: int) -> int:
    """How many chunks a file of ``size`` bytes is stored as (an empty file: none)."""
    return -(-size // CHUNK_SIZE)


def check_name(name: object, where: str) -> str:
    """``name`` if it is a relative path that stays inside its root."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise _fail(f"{where} must be a name of 1 to {MAX_NAME} characters")
    parts = name.split("/")
    if "\0" in name or any(p in ("", ".", "..") for p in parts):
        raise _fail(f"{where} {name[:200]!r} is not a plain relative path")
    return name


def _xattrs(value: object, where: str) -> dict[str, bytes]:
    if not isinstance(value, dict) or len(value) > 64:
        raise _fail(f"{where} must be an object of at most 64 attributes")
    found: dict[str, bytes] = {}
    for name, encoded in value.items():
        if not any(name.startswith(p) for p in XATTR_ALLOWED) or len(name) > 255:
            raise _fail(f"{where} has the attribute {name[:100]!r}, which is not allowed")
        try:
            found[name] = base64.b64decode(checks.text(encoded, where, 2**17, _fail), validate=True)
        except binascii.Error as e:
            raise _fail(f"{where}[{name[:100]!r}] is not base64") from e
    if sum(len(v) for v in found.values()) > MAX_XATTR_BYTES:
        raise _fail(f"{where} holds more than {MAX_XATTR_BYTES} bytes")
    return found


def _entry(raw: object, i: int, max_bytes: int) -> Entry:
    where = f"entries[{i}]"
    fields = checks.fields(
        raw,
        where,
        {"name", "kind", "mode"},
        _fail,
        {"size", "chunks", "target", "uid", "gid", "xattrs"},
    )
    name = check_name(fields["name"], f"{where}.name")
    kind = fields["kind"]
    if kind not in KINDS:
        raise _fail(f"{where}.kind must be one of {', '.join(KINDS)}")
    allowed = {"file": {"size", "chunks"}, "symlink": {"target"}}.get(kind, set())
    stray = sorted(set(fields) & {"size", "chunks", "target"} - allowed)
    if stray:
        raise _fail(f"{where} is a {kind}: it has no {stray[0]!r}")
    entry = Entry(
        name=name,
        kind=kind,
        mode=checks.integer(fields["mode"], f"{where}.mode", 0, 0o7777, _fail),
        uid=checks.integer(fields.get("uid", 0), f"{where}.uid", 0, _UINT32, _fail),
        gid=checks.integer(fields.get("gid", 0), f"{where}.gid", 0, _UINT32, _fail),
        xattrs=_xattrs(fields.get("xattrs", {}), f"{where}.xattrs"),
    )
    if kind == "symlink":
        target = checks.text(fields.get("target"), f"{where}.target", MAX_NAME, _fail)
        if not target or "\0" in target:
            raise _fail(f"{where}.target must be a non-empty path")
        return dataclasses.replace(entry, target=target)
    if kind != "file":
        return entry
    size = checks.integer(fields.get("size"), f"{where}.size", 0, max_bytes, _fail)
    chunks = fields.get("chunks")
    if not isinstance(chunks, list) or len(chunks) != chunk_count(size):
        raise _fail(f"{where}.chunks must list the {chunk_count(size)} chunks of {size} bytes")
    for j, chunk in enumerate(chunks):
        checks.matching(chunk, f"{where}.chunks[{j}]", checks.SHA256, _fail)
    return dataclasses.replace(entry, size=size, chunks=tuple(chunks))


def parse(data: bytes, snapshot_id: str, max_bytes: int) -> Manifest:
    """The manifest ``data`` of ``snapshot_id`` if it passes the schema and its files add up
    to at most ``max_bytes``; else :class:`ManifestError`."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise _fail(f"it is larger than {MAX_MANIFEST_BYTES} bytes")
    top = checks.fields(
        checks.document(data, _fail),
        "the manifest",
        {"format", "snapshot_id", "chunk_size", "meta", "entries"},
        _fail,
    )
    if top["format"] != FORMAT:
        raise _fail(f"its format is {str(top['format'])[:100]!r}, not {FORMAT!r}")
    if top["snapshot_id"] != snapshot_id:
        raise _fail(f"it describes {str(top['snapshot_id'])[:100]!r}, not {snapshot_id!r}")
    if top["chunk_size"] != CHUNK_SIZE:
        raise _fail(f"its chunks are not of {CHUNK_SIZE} bytes")
    if not isinstance(top["meta"], dict):
        raise _fail("meta must be an object")
    raw = top["entries"]
    if not isinstance(raw, list) or len(raw) > MAX_ENTRIES:
        raise _fail(f"entries must be a list of at most {MAX_ENTRIES}")
    entries: list[Entry] = []
    kinds: dict[str, str] = {}
    total = 0
    for i, item in enumerate(raw):
        entry = _entry(item, i, max_bytes)
        parent = entry.name.rpartition("/")[0]
        if entry.name in kinds:
            raise _fail(f"{entry.name[:200]!r} is listed twice")
        if parent and kinds.get(parent) != "dir":
            raise _fail(f"{entry.name[:200]!r} is not under a directory listed before it")
        kinds[entry.name] = entry.kind
        total += entry.size
        if total > max_bytes:
            raise _fail(f"its files add up to more than the {max_bytes} bytes allowed")
        entries.append(entry)
    return Manifest(snapshot_id, top["meta"], tuple(entries))
