"""The chunk store: a snapshot's files up into the bucket as chunks and a manifest, and down
again into a directory.

A file is stored as spans of chunks, its pages packed (:mod:`sandfork.store.pages`): pages an
earlier upload stored are referenced, not sent again. An upload sends each chunk the bucket
lacks (a chunk already there, from another snapshot or another host, is not sent again), then
the manifest with a
create-only-if-absent put: until that put succeeds, nothing of the snapshot is visible as a
snapshot, whatever chunks are in already, and an upload cut short is simply run again. The
manifest is stored after its HMAC-SHA256 under the fleet's key and a newline; a fetch refuses a
manifest the key did not sign (the bucket's other writers cannot make an engine restore a
snapshot of their making), parses it as hostile input, checks every chunk's SHA-256 and
that each span lies within its chunk, writes the files under a temporary name beside the
destination and renames it into place.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandfork.store import tree
from sandfork.store.ahead import Ahead
from sandfork.store.cache import Cache
from sandfork.store.manifest import ZERO, Entry, Manifest, ManifestError, parse
from sandfork.store.objects import ObjectMissing, ObjectStore, StoreError
from sandfork.store.pages import Packer, PageIndex

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


MIN_SIGNING_KEY = 32  # characters of S3Store.signing_key
RECENT_CHUNKS = 16  # chunks a fetch keeps in memory (64 MiB at most)


def signed(key: str, manifest: bytes) -> bytes:
    """A manifest as it is stored: its HMAC-SHA256 under the fleet's ``key`` (hex), a
    newline, the manifest."""
    return hmac.new(key.encode(), manifest, hashlib.sha256).hexdigest().encode() + b"\n" + manifest


def chunk_key(digest: str) -> str:
    """Where the chunk ``digest`` is kept."""
    return f"chunks/{digest[:2]}/{digest}"


def manifest_key(snapshot_id: str) -> str:
    """Where the manifest of ``snapshot_id`` is kept."""
    return f"manifests/{snapshot_id}.json"


@dataclass(frozen=True)
class Sent:
    """What sending a snapshot's files took: chunks sent and those the bucket already had."""

    sent: int
    skipped: int
    bytes_sent: int
    pages: PageIndex  # where each page of the upload is stored: give it to the next one


@dataclass(frozen=True)
class Uploaded(Sent):
    """How an upload went: what was sent, the manifest and whether this upload wrote it."""

    manifest: Manifest
    seconds: float
    committed: bool  # False: the manifest was there already (an earlier run wrote it)


class ChunkStore:
    """Snapshots as chunks and manifests in ``objects``, fetched through ``cache``."""

    def __init__(self, objects: ObjectStore, cache: Cache, signing_key: str) -> None:
        if len(signing_key) < MIN_SIGNING_KEY:
            raise StoreError(
                f"S3Store.signing_key must have at least {MIN_SIGNING_KEY} characters, the same "
                "on every engine of the fleet: it signs the manifests, and unsigned ones are "
                "never restored (`python -c 'import secrets; print(secrets.token_hex(32))'` "
                "makes one)"
            )
        self.objects = objects
        self.cache = cache
        self._key = signing_key
        self._present: set[str] = set()  # chunks known to be in the bucket

    def check(self) -> None:
        """Raise :class:`StoreError` (one line) unless the bucket can be used."""
        self.objects.check()

    def put_files(
        self,
        sources: dict[str, Path],
        progress: Progress | None = None,
        known: PageIndex | None = None,
    ) -> tuple[list[Entry], Sent]:
        """Send the chunks of ``sources`` (a name in the manifest -> a file or directory)
        that the bucket lacks, their pages packed (:mod:`sandfork.store.pages`; ``known``:
        the pages of an earlier upload, referenced rather than sent); the entries with their
        spans, and what was sent."""
        scanned = [item for name, path in sources.items() for item in tree.scan(name, path)]
        total = sum(entry.size for entry, _ in scanned)
        counts = [0, 0, 0, 0]  # chunks sent, skipped, bytes sent, bytes read

        def put(data: bytes) -> str:
            digest = hashlib.sha256(data).hexdigest()
            if digest in self._present or self.objects.exists(chunk_key(digest)):
                counts[1] += 1
            else:
                self.objects.put(chunk_key(digest), data)
                counts[0] += 1
                counts[2] += len(data)
            self._present.add(digest)
            return digest

        def read(size: int) -> None:
            counts[3] += size
            if progress is not None:
                progress(counts[3], total)

        packer = Packer(put, known)
        entries: list[Entry] = []
        for entry, path in scanned:
            spans = tuple(packer.spans(path, read)) if entry.kind == "file" else ()
            if sum(length for _, _, length in spans) != entry.size:
                raise StoreError(f"{path} changed while it was uploaded (snapshots are immutable)")
            entries.append(dataclasses.replace(entry, spans=spans))
        return entries, Sent(counts[0], counts[1], counts[2], packer.index)

    def commit(self, manifest: Manifest) -> bool:
        """Write the manifest, create-only: the snapshot is durable from now on. False if a
        manifest was there already (an earlier run of the same upload wrote it)."""
        missing = [d for d in manifest.chunks() if d not in self._present]
        if missing:
            raise StoreError(f"the chunk {missing[0]} was not uploaded first")
        stored = signed(self._key, manifest.encode())
        return self.objects.put_if_absent(manifest_key(manifest.snapshot_id), stored)

    def upload(
        self,
        snapshot_id: str,
        sources: dict[str, Path],
        meta: dict[str, Any],
        progress: Progress | None = None,
        known: PageIndex | None = None,
    ) -> Uploaded:
        """Store ``sources`` as the snapshot ``snapshot_id``: its chunks, then its manifest
        (``known``: the pages of an earlier upload, see :meth:`put_files`)."""
        started = time.monotonic()
        entries, sent = self.put_files(sources, progress, known)
        manifest = Manifest(snapshot_id, meta, tuple(entries))
        committed = self.commit(manifest)
        seconds = time.monotonic() - started
        return Uploaded(**vars(sent), manifest=manifest, seconds=seconds, committed=committed)

    def is_durable(self, snapshot_id: str) -> bool:
        """Whether the bucket has the snapshot's manifest."""
        return self.objects.exists(manifest_key(snapshot_id))

    def manifest(self, snapshot_id: str, max_bytes: int) -> Manifest | None:
        """The snapshot's manifest, checked (files of at most ``max_bytes`` in all), or
        ``None`` if the bucket has none; :class:`ManifestError` if it is not valid."""
        try:
            data = self.objects.get(manifest_key(snapshot_id))
        except ObjectMissing:
            return None
        _, _, body = data.partition(b"\n")
        if not hmac.compare_digest(data, signed(self._key, body)):
            raise ManifestError(
                f"the manifest of {snapshot_id} is not signed with this fleet's key "
                "(S3Store.signing_key): it was not written by one of its engines"
            )
        return parse(body, snapshot_id, max_bytes)

    def chunk(self, digest: str) -> bytes:
        """The chunk ``digest``, from the cache or the bucket, its hash checked."""
        data = self.cache.get(digest)
        if data is not None and hashlib.sha256(data).hexdigest() == digest:
            return data
        try:
            data = self.objects.get(chunk_key(digest))
        except ObjectMissing:
            raise ManifestError(f"the chunk {digest} is missing from the bucket") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise ManifestError(f"the chunk {digest} in the bucket does not match its hash")
        self.cache.put(digest, data)
        return data

    def fetch(self, manifest: Manifest, dest: Path, later: frozenset[str] = frozenset()) -> None:
        """Write the snapshot's files into the new directory ``dest``, whole or not at all
        (under a temporary name beside it, renamed once complete); the files named in
        ``later`` are left as holes (:func:`~sandfork.store.tree.materialise`)."""
        staging = dest.with_name(f".fetch-{dest.name}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(mode=0o700)
        order = (
            d for e in manifest.entries if e.name not in later for d, _, _ in e.spans if d != ZERO
        )
        try:
            with Ahead(self.chunk, order) as ahead:
                # Spans in a row mostly come from one chunk: its checked bytes kept at hand.
                recent = functools.lru_cache(maxsize=RECENT_CHUNKS)(ahead)
                tree.materialise(manifest.entries, staging, recent, later)
            staging.rename(dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
