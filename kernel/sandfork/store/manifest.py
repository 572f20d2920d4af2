"""A stored snapshot's manifest: its files and their chunks, checked as hostile input.

The manifest comes from a bucket that others may write, so it is parsed by
:mod:`sandfork.strict_json`'s rule and a strict schema before anything is fetched: every field
known and typed; names relative, ``/``-separated, without ``.``/``..``/empty parts or NUL, each
under a directory listed before it and listed once; sizes within the caller's budget; exactly
spans of chunks that add up to a file's size, page-aligned, each within a chunk (a chunk a
SHA-256, or the zero sentinel of a hole); kinds only those a snapshot holds (files,
directories, symbolic links, FIFOs and overlayfs whiteouts: no device can be smuggled in);
extended attributes only of the allowed families. ``meta`` is the engine's own section, checked
by the engine (:mod:`sandfork.engine.stored`).

Format 2 stores a file as spans ``[chunk, offset, length]`` (:mod:`sandfork.store.pages`);
format 1 (whole chunks of :data:`CHUNK_SIZE`, in order) is still read.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from sandfork import manifest_checks as checks

FORMAT = "sandfork-store/2"
FORMAT_1 = "sandfork-store/1"  # whole chunks in order: read, no longer written
CHUNK_SIZE = 4 * 2**20  # the largest chunk
PAGE = 4096  # spans start at a page of their chunk; all but a file's last are whole pages
ZERO = "0" * 64  # the chunk of a span that is a hole (zeros, never stored)
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


Span = tuple[str, int, int]
"""Bytes of a file: a chunk (or :data:`ZERO`), an offset in it and a length."""


def span_bytes(what: str, data: bytes, offset: int, length: int) -> memoryview | None:
    """The bytes of the span ``what`` (a file's, for the message) at ``offset`` in the
    chunk ``data``: ``None`` when they are all zeros (a hole to keep); a span beyond its
    chunk raises :class:`ManifestError`."""
    if offset + length > len(data):
        raise ManifestError(
            f"{what} ends at byte {offset + length} of a chunk of {len(data)} bytes"
        )
    if data.count(0, offset, offset + length) == length:
        return None
    return memoryview(data)[offset : offset + length]


@dataclass(frozen=True)
class Entry:
    """One file, directory or link of a stored snapshot, named relative to its root."""

    name: str
    kind: str
    mode: int  # permission bits (set-id and sticky included)
    size: int = 0
    spans: tuple[Span, ...] = ()  # the file's content, in order
    target: str = ""  # a symbolic link's
    uid: int = 0
    gid: int = 0
    xattrs: dict[str, bytes] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The entry as the manifest writes it (defaults left out)."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "mode": self.mode}
        if self.kind == "file":
            out |= {"size": self.size, "spans": [list(s) for s in self.spans]}
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
        """Every distinct chunk the snapshot's files are made of (holes are none)."""
        return {d for e in self.entries for d, _, _ in e.spans if d != ZERO}

    def encode(self) -> bytes:
        """The manifest as stored."""
        doc = {
            "format": FORMAT,
            "snapshot_id": self.snapshot_id,
            "meta": self.meta,
            "entries": [e.to_json() for e in self.entries],
        }
        return json.dumps(doc, separators=(",", ":")).encode()


def _chunk_count(size: int) -> int:
    """How many whole chunks format 1 stores a file of ``size`` bytes as."""
    return -(-size // CHUNK_SIZE)


def _spans_1(chunks: object, size: int, where: str) -> tuple[Span, ...]:
    """Format 1's chunk list as spans: every chunk whole, the last one the rest."""
    count = _chunk_count(size)
    if not isinstance(chunks, list) or len(chunks) != count:
        raise _fail(f"{where}.chunks must list the {count} chunks of {size} bytes")
    for j, chunk in enumerate(chunks):
        checks.matching(chunk, f"{where}.chunks[{j}]", checks.SHA256, _fail)
    return tuple(
        (digest, 0, min(CHUNK_SIZE, size - j * CHUNK_SIZE)) for j, digest in enumerate(chunks)
    )


def _spans(raw: object, size: int, where: str) -> tuple[Span, ...]:
    """A file's spans if they are well formed and add up to ``size``: each in its chunk,
    at a page of it, every one but the last whole pages; a hole at offset 0."""
    if not isinstance(raw, list) or len(raw) > -(-size // PAGE):
        raise _fail(f"{where}.spans must be a list of at most one span per page of the file")
    spans: list[Span] = []
    total = 0
    for j, item in enumerate(raw):
        at = f"{where}.spans[{j}]"
        if not isinstance(item, list) or len(item) != 3:
            raise _fail(f"{at} must be [chunk, offset, length]")
        digest = item[0]
        if digest != ZERO:
            checks.matching(digest, at, checks.SHA256, _fail)
        offset = checks.integer(item[1], f"{at}.offset", 0, CHUNK_SIZE - 1, _fail)
        hole = digest == ZERO  # as long as the file's zeros, in no chunk
        length = checks.integer(item[2], f"{at}.length", 1, size if hole else CHUNK_SIZE, _fail)
        last = j == len(raw) - 1
        if offset % PAGE or (not last and length % PAGE) or offset + length > CHUNK_SIZE:
            if not hole:
                raise _fail(f"{at} is not whole pages of one chunk")
        if hole and (offset or (not last and length % PAGE)):
            raise _fail(f"{at} is a hole at an offset or of part of a page")
        spans.append((digest, offset, length))
        total += length
    if total != size:
        raise _fail(f"{where}.spans add up to {total} bytes, not its size {size}")
    return tuple(spans)


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


def _entry(raw: object, i: int, max_bytes: int, version: str) -> Entry:
    where = f"entries[{i}]"
    fields = checks.fields(
        raw,
        where,
        {"name", "kind", "mode"},
        _fail,
        {"size", "spans", "chunks", "target", "uid", "gid", "xattrs"},
    )
    name = check_name(fields["name"], f"{where}.name")
    kind = fields["kind"]
    if kind not in KINDS:
        raise _fail(f"{where}.kind must be one of {', '.join(KINDS)}")
    content = "chunks" if version == FORMAT_1 else "spans"
    allowed = {"file": {"size", content}, "symlink": {"target"}}.get(kind, set())
    stray = sorted(set(fields) & {"size", "spans", "chunks", "target"} - allowed)
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
    if version == FORMAT_1:
        spans = _spans_1(fields.get("chunks"), size, where)
    else:
        spans = _spans(fields.get("spans"), size, where)
    return dataclasses.replace(entry, size=size, spans=spans)


def parse(data: bytes, snapshot_id: str, max_bytes: int) -> Manifest:
    """The manifest ``data`` of ``snapshot_id`` if it passes the schema and its files add up
    to at most ``max_bytes``; else :class:`ManifestError`."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise _fail(f"it is larger than {MAX_MANIFEST_BYTES} bytes")
    top = checks.fields(
        checks.document(data, _fail),
        "the manifest",
        {"format", "snapshot_id", "meta", "entries"},
        _fail,
        {"chunk_size"},
    )
    version = top["format"]
    if version not in (FORMAT, FORMAT_1):
        raise _fail(f"its format is {str(version)[:100]!r}, not {FORMAT!r}")
    if top["snapshot_id"] != snapshot_id:
        raise _fail(f"it describes {str(top['snapshot_id'])[:100]!r}, not {snapshot_id!r}")
    if top.get("chunk_size") != (CHUNK_SIZE if version == FORMAT_1 else None):
        raise _fail(
            f"its chunk_size is not {CHUNK_SIZE}" if version == FORMAT_1 else "it has a chunk_size"
        )
    if not isinstance(top["meta"], dict):
        raise _fail("meta must be an object")
    raw = top["entries"]
    if not isinstance(raw, list) or len(raw) > MAX_ENTRIES:
        raise _fail(f"entries must be a list of at most {MAX_ENTRIES}")
    entries: list[Entry] = []
    kinds: dict[str, str] = {}
    total = 0
    for i, item in enumerate(raw):
        entry = _entry(item, i, max_bytes, version)
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
