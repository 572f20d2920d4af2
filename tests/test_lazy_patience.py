"""A lazy server's fetch through a store outage (:func:`sandfork.store.lazy_serve.patient`):
a store that fails is tried again until it answers or the wait is over; a chunk that is not
as its manifest says fails at once. The store's failures are injected around a real chunk
store in a folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfork.store import lazy_serve
from sandfork.store.cache import ChunkCache
from sandfork.store.chunks import ChunkStore
from sandfork.store.manifest import ManifestError
from sandfork.store.objects import FolderObjects, StoreError

KEY = "k" * 32


class Outage:
    """The chunk store's fetch, failing as an unreachable store ``failures`` times first."""

    def __init__(self, store: ChunkStore, failures: int) -> None:
        self.store = store
        self.failures = failures
        self.calls = 0

    def __call__(self, digest: str) -> bytes:
        self.calls += 1
        if self.calls <= self.failures:
            raise StoreError("the S3 server cannot be reached (injected)")
        return self.store.chunk(digest)


@pytest.fixture
def chunk(tmp_path: Path) -> tuple[ChunkStore, str, bytes]:
    """A chunk store in a folder holding one chunk: the store, its digest, its bytes (as a
    fetch returns them)."""
    store = ChunkStore(FolderObjects(tmp_path / "bucket"), ChunkCache(tmp_path / "c", 0), KEY)
    data = bytes(range(256)) * 64
    source = tmp_path / "file"
    source.write_bytes(data)
    digest, start, length = store.upload("s", {"f": source}, {}).manifest.entries[0].spans[0]
    fetched = store.chunk(digest)
    assert fetched[start : start + length] == data[:length]
    return store, digest, fetched


@pytest.fixture(autouse=True)
def short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lazy_serve, "RETRY_FIRST_S", 0.001)
    monkeypatch.setattr(lazy_serve, "RETRY_MOST_S", 0.002)


def test_a_fetch_waits_out_a_store_that_fails_then_answers(
    chunk: tuple[ChunkStore, str, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    store, digest, data = chunk
    outage = Outage(store, failures=5)
    assert lazy_serve.patient(outage, wait_s=3600)(digest) == data
    assert outage.calls == 6
    assert "the store failed, trying again" in caplog.text
    assert "the store answers again" in caplog.text


def test_a_store_down_longer_than_the_wait_fails_the_fetch(
    chunk: tuple[ChunkStore, str, bytes],
) -> None:
    store, digest, _ = chunk
    outage = Outage(store, failures=10**9)
    with pytest.raises(StoreError, match="cannot be reached"):
        lazy_serve.patient(outage, wait_s=0.05)(digest)
    assert outage.calls > 1  # tried again before it gave up


def test_a_chunk_unlike_its_manifest_fails_at_once(
    chunk: tuple[ChunkStore, str, bytes], tmp_path: Path
) -> None:
    store, digest, data = chunk
    (stored,) = [p for p in (tmp_path / "bucket").rglob(f"*{digest}*") if p.is_file()]
    stored.write_bytes(data[::-1])  # the bucket's copy, altered (the cache holds none)
    outage = Outage(store, failures=0)
    with pytest.raises(ManifestError, match="does not match its hash"):
        lazy_serve.patient(outage, wait_s=3600)(digest)
    assert outage.calls == 1
