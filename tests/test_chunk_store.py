"""The chunk store (``sandfork.store``) on a folder and on a real S3 server (SeaweedFS):
round trips, deduplication (of chunks, and of pages an earlier upload stored), the manifest
written last, hostile manifests (and format 1's still read), clear errors."""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from s3_server import BUCKET, FLEET_KEY, SeaweedS3, new_prefix, s3_server
from sandfork.store.cache import ChunkCache
from sandfork.store.chunks import ChunkStore, chunk_key, manifest_key, signed
from sandfork.store.config import S3Store
from sandfork.store.manifest import CHUNK_SIZE, FORMAT, FORMAT_1, PAGE, ZERO, ManifestError
from sandfork.store.objects import FolderObjects, ObjectStore, StoreError
from sandfork.store.s3 import S3Objects

__all__ = ["s3_server"]

MiB = 2**20
LIMIT = 64 * MiB  # what a test's fetch may write in all


def s3_objects(server: SeaweedS3, prefix: str, bucket: str = BUCKET) -> S3Objects:
    return S3Objects(S3Store(endpoint_url=server.endpoint_url, bucket=bucket, prefix=prefix))


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch, s3_server: SeaweedS3) -> SeaweedS3:
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    return s3_server


@pytest.fixture(params=["folder", "s3"])
def objects(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """The bucket: a folder, or a prefix of the test's own on SeaweedFS."""
    if request.param == "folder":
        return FolderObjects(tmp_path / "bucket")
    server: SeaweedS3 = request.getfixturevalue("credentials")
    return s3_objects(server, new_prefix())


@pytest.fixture
def store(objects: ObjectStore, tmp_path: Path) -> ChunkStore:
    chunks = ChunkStore(objects, ChunkCache(tmp_path / "cache", 16 * MiB), FLEET_KEY)
    chunks.check()
    return chunks


def chunk_objects(objects: ObjectStore) -> list[str]:
    return objects.keys("chunks/")


def make_tree(root: Path, seed: bytes, chunks: int = 2) -> Path:
    """A snapshot's folder: a file of ``chunks`` chunks' worth of distinct pages, then zeros
    (a hole, and a short tail), a small file, an empty one, a read-only directory and a
    link."""
    root.mkdir(parents=True)
    with (root / "memory.img").open("wb") as f:
        f.write(random.Random(seed).randbytes(chunks * CHUNK_SIZE))
        f.truncate(chunks * CHUNK_SIZE + CHUNK_SIZE + 123)
    (root / "sub").mkdir()
    (root / "sub" / "state.json").write_text('{"x": 1}')
    (root / "sub" / "state.json").chmod(0o640)
    (root / "sub" / "empty").touch()
    (root / "sub" / "link").symlink_to("state.json")
    (root / "sub").chmod(0o500)
    return root


def same_tree(a: Path, b: Path) -> None:
    for folder, dirs, files in os.walk(a):
        for name in dirs + files:
            one = Path(folder) / name
            other = b / one.relative_to(a)
            s1, s2 = os.lstat(one), os.lstat(other)
            assert stat.S_IFMT(s1.st_mode) == stat.S_IFMT(s2.st_mode), one
            if not stat.S_ISLNK(s1.st_mode):
                assert stat.S_IMODE(s1.st_mode) == stat.S_IMODE(s2.st_mode), one
            if stat.S_ISREG(s1.st_mode):
                assert one.read_bytes() == other.read_bytes(), one
            if stat.S_ISLNK(s1.st_mode):
                assert os.readlink(one) == os.readlink(other)


@pytest.fixture(autouse=True)
def writable_trees(tmp_path: Path) -> Iterator[None]:
    yield
    for folder, dirs, _ in os.walk(tmp_path):  # read-only folders, for pytest to remove them
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o700, follow_symlinks=False)


def test_round_trip_keeps_files_modes_links_and_holes(store: ChunkStore, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a", b"one")
    done = store.upload("snap-1", {"snapshot": src}, {"note": "x"})
    assert done.committed and store.is_durable("snap-1")
    manifest = store.manifest("snap-1", LIMIT)
    assert manifest is not None and manifest.meta == {"note": "x"}
    out = tmp_path / "out"
    store.fetch(manifest, out)
    same_tree(src, out / "snapshot")
    memory = out / "snapshot" / "memory.img"
    assert memory.stat().st_blocks * 512 < memory.stat().st_size  # the zeros are a hole
    assert not list(tmp_path.glob(".fetch-*"))


def test_identical_chunks_are_stored_once(
    store: ChunkStore, objects: ObjectStore, tmp_path: Path
) -> None:
    first = make_tree(tmp_path / "a", b"shared", chunks=3)
    one = store.upload("snap-1", {"snapshot": first}, {})
    # 3 chunks of pages (the zeros are holes, stored as nothing) and the small file.
    assert (one.sent, len(chunk_objects(objects))) == (4, 4)
    second = make_tree(tmp_path / "b", b"shared", chunks=3)
    (second / "extra.bin").write_bytes(b"\1" * 1000)
    fresh = ChunkStore(objects, ChunkCache(tmp_path / "cache2", 0), FLEET_KEY)  # another host
    two = fresh.upload("snap-2", {"snapshot": second}, {})  # no pages known: packed alike
    assert (two.sent, two.skipped) == (1, 4)
    assert len(chunk_objects(objects)) == 5
    assert objects.keys("manifests/") == [manifest_key("snap-1"), manifest_key("snap-2")]


def test_an_upload_run_again_writes_no_second_manifest(store: ChunkStore, tmp_path: Path) -> None:
    src = make_tree(tmp_path / "a", b"again")
    assert store.upload("snap-1", {"snapshot": src}, {"run": 1}).committed
    again = store.upload("snap-1", {"snapshot": src}, {"run": 2})
    assert not again.committed and again.sent == 0
    manifest = store.manifest("snap-1", LIMIT)
    assert manifest is not None and manifest.meta == {"run": 1}


def test_the_manifest_is_last_when_the_server_dies_mid_upload(
    credentials: SeaweedS3, tmp_path: Path
) -> None:
    objects = s3_objects(credentials, new_prefix())
    store = ChunkStore(objects, ChunkCache(tmp_path / "cache", 0), FLEET_KEY)
    src = make_tree(tmp_path / "a", b"killed")
    _entries, done = store.put_files({"snapshot": src})
    assert done.sent == 3
    credentials.kill()
    try:
        with pytest.raises(StoreError, match="cannot be reached"):
            store.upload("snap-1", {"snapshot": src}, {})
    finally:
        credentials.start()
    assert not store.is_durable("snap-1")  # chunks are in, the snapshot is not visible
    assert objects.keys("manifests/") == []
    again = ChunkStore(objects, ChunkCache(tmp_path / "cache2", 0), FLEET_KEY).upload(
        "snap-1", {"snapshot": src}, {}
    )
    assert again.committed and (again.sent, again.skipped) == (0, 3)  # it resumed
    assert store.is_durable("snap-1")


def test_an_upload_given_the_last_ones_pages_sends_only_the_changed_pages(
    store: ChunkStore, objects: ObjectStore, tmp_path: Path
) -> None:
    src = make_tree(tmp_path / "a", b"before", chunks=2)
    one = store.upload("snap-1", {"snapshot": src}, {})
    memory = src / "memory.img"
    data = bytearray(memory.read_bytes())
    for page in (3, 700, 1500):  # scattered over both chunks, as a process's writes are
        data[page * PAGE : page * PAGE + 8] = b"changed!"
    memory.write_bytes(bytes(data))
    two = store.upload("snap-2", {"snapshot": src}, {}, known=one.pages)
    assert (two.sent, two.bytes_sent) == (1, 3 * PAGE)  # the three pages, packed in one chunk
    data[5 * PAGE] ^= 1
    memory.write_bytes(bytes(data))
    three = store.upload("snap-3", {"snapshot": src}, {}, known=two.pages)
    assert (three.sent, three.bytes_sent) == (1, PAGE)  # its pages are all the next one knows
    manifest = store.manifest("snap-3", LIMIT)
    assert manifest is not None
    store.fetch(manifest, tmp_path / "out")
    same_tree(src, tmp_path / "out" / "snapshot")


def test_a_format_1_manifest_still_restores(
    store: ChunkStore, objects: ObjectStore, tmp_path: Path
) -> None:
    whole = random.Random(1).randbytes(CHUNK_SIZE)
    chunks = [put_chunk(objects, whole), put_chunk(objects, b"tail")]
    entry = {"name": "x", "kind": "file", "mode": 0o600, "size": CHUNK_SIZE + 4, "chunks": chunks}
    doc = {"format": FORMAT_1, "snapshot_id": "evil", "chunk_size": CHUNK_SIZE, "meta": {}}
    put_signed(objects, json.dumps({**doc, "entries": [entry]}).encode())
    manifest = store.manifest("evil", LIMIT)
    assert manifest is not None
    store.fetch(manifest, tmp_path / "out")
    assert (tmp_path / "out" / "x").read_bytes() == whole + b"tail"


# --- hostile manifests ---------------------------------------------------------------------


def put_manifest(objects: ObjectStore, entries: list[dict[str, object]], **top: object) -> None:
    doc = {"format": FORMAT, "snapshot_id": "evil", "meta": {}}
    doc |= {"entries": entries, **top}
    put_signed(objects, json.dumps(doc).encode())


def put_signed(objects: ObjectStore, manifest: bytes, key: str = FLEET_KEY) -> None:
    """A manifest in the bucket under the fleet's key: what the checks after the signature's
    must hold against (an engine of the fleet gone rogue, a bug)."""
    objects.put(manifest_key("evil"), signed(key, manifest))


def put_chunk(objects: ObjectStore, data: bytes, digest: str | None = None) -> str:
    digest = digest or hashlib.sha256(data).hexdigest()
    objects.put(chunk_key(digest), data)
    return digest


def file_entry(name: str, size: int, spans: list[list[object]]) -> dict[str, object]:
    return {"name": name, "kind": "file", "mode": 0o644, "size": size, "spans": spans}


A_CHUNK = hashlib.sha256(b"a chunk").hexdigest()


HOSTILE: dict[str, tuple[Callable[[ObjectStore], None], str]] = {
    "parent path": (lambda o: put_manifest(o, [file_entry("../x", 0, [])]), "plain relative"),
    "absolute path": (lambda o: put_manifest(o, [file_entry("/tmp/x", 0, [])]), "plain relative"),
    "inner dot-dot": (
        lambda o: put_manifest(
            o, [{"name": "a", "kind": "dir", "mode": 0o700}, file_entry("a/../../x", 0, [])]
        ),
        "plain relative",
    ),
    "through a link": (
        lambda o: put_manifest(
            o,
            [
                {"name": "a", "kind": "symlink", "mode": 0o777, "target": "/tmp"},
                file_entry("a/x", 0, []),
            ],
        ),
        "not under a directory",
    ),
    "huge size": (
        lambda o: put_manifest(o, [file_entry("x", 2**50, [])]),
        "must be an integer from 0",
    ),
    "spans short of the size": (
        lambda o: put_manifest(o, [file_entry("x", 10, [])]),
        "add up to 0 bytes, not its size 10",
    ),
    "a span past its chunk": (
        lambda o: put_manifest(
            o, [file_entry("x", 2 * PAGE, [[A_CHUNK, CHUNK_SIZE - PAGE, 2 * PAGE]])]
        ),
        "not whole pages of one chunk",
    ),
    "a span inside a page": (
        lambda o: put_manifest(o, [file_entry("x", PAGE, [[A_CHUNK, 100, PAGE]])]),
        "not whole pages of one chunk",
    ),
    "a part page first": (
        lambda o: put_manifest(
            o, [file_entry("x", PAGE + 10, [[A_CHUNK, 0, 10], [A_CHUNK, PAGE, PAGE]])]
        ),
        "not whole pages of one chunk",
    ),
    "more spans than pages": (
        lambda o: put_manifest(o, [file_entry("x", 10, [[A_CHUNK, 0, 5], [A_CHUNK, 0, 5]])]),
        "at most one span per page",
    ),
    "a hole at an offset": (
        lambda o: put_manifest(o, [file_entry("x", PAGE, [[ZERO, PAGE, PAGE]])]),
        "a hole at an offset or of part of a page",
    ),
    "a span not a triple": (
        lambda o: put_manifest(o, [file_entry("x", PAGE, [[A_CHUNK, 0]])]),
        "must be \\[chunk, offset, length\\]",
    ),
    "format 1's chunks in format 2": (
        lambda o: put_manifest(
            o, [{"name": "x", "kind": "file", "mode": 0o644, "size": 3, "chunks": [A_CHUNK]}]
        ),
        "it has no 'chunks'",
    ),
    "a device": (
        lambda o: put_manifest(o, [{"name": "sda", "kind": "block", "mode": 0o600}]),
        "kind must be one of",
    ),
    "twice": (
        lambda o: put_manifest(o, [file_entry("x", 0, []), file_entry("x", 0, [])]),
        "listed twice",
    ),
    "unknown field": (lambda o: put_manifest(o, [], extra=1), "unknown field 'extra'"),
    "capability": (
        lambda o: put_manifest(
            o,
            [{"name": "x", "kind": "dir", "mode": 0o700, "xattrs": {"security.capability": ""}}],
        ),
        "not allowed",
    ),
    "not json": (lambda o: put_signed(o, b"\xff{not json"), "invalid"),
    "duplicate key": (lambda o: put_signed(o, b'{"format": 1, "format": 2}'), "appears twice"),
    "unsigned": (lambda o: o.put(manifest_key("evil"), b"{}"), "not signed with this fleet"),
    "another fleet's": (
        lambda o: put_signed(o, b"{}", secrets.token_hex(32)),
        "not signed with this fleet",
    ),
    "signature cut": (
        lambda o: o.put(manifest_key("evil"), signed(FLEET_KEY, b"{}")[1:]),
        "not signed with this fleet",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_crafted_manifest_is_refused_before_anything_is_written(
    store: ChunkStore, objects: ObjectStore, tmp_path: Path, case: str
) -> None:
    craft, message = HOSTILE[case]
    craft(objects)
    with pytest.raises(ManifestError, match=message):
        store.manifest("evil", LIMIT)


def fetch_refused(store: ChunkStore, tmp_path: Path, message: str) -> None:
    manifest = store.manifest("evil", LIMIT)
    assert manifest is not None
    target = tmp_path / "target" / "snap"
    target.parent.mkdir()
    with pytest.raises(ManifestError, match=message):
        store.fetch(manifest, target)
    assert list(target.parent.iterdir()) == []  # neither the snapshot nor its staging


def test_a_chunk_that_does_not_match_its_hash_is_refused(
    store: ChunkStore, objects: ObjectStore, tmp_path: Path
) -> None:
    digest = put_chunk(objects, b"tampered", hashlib.sha256(b"original").hexdigest())
    put_manifest(objects, [file_entry("x", 8, [[digest, 0, 8]])])
    fetch_refused(store, tmp_path, "does not match its hash")


def test_a_span_beyond_its_chunk_is_refused(
    store: ChunkStore, objects: ObjectStore, tmp_path: Path
) -> None:
    digest = put_chunk(objects, b"short")
    put_manifest(objects, [file_entry("x", PAGE, [[digest, 0, PAGE]])])
    fetch_refused(store, tmp_path, "ends at byte 4096 of a chunk of 5 bytes")


def test_a_missing_chunk_is_refused(
    store: ChunkStore, objects: ObjectStore, tmp_path: Path
) -> None:
    put_manifest(objects, [file_entry("x", 3, [[hashlib.sha256(b"abc").hexdigest(), 0, 3]])])
    fetch_refused(store, tmp_path, "missing from the bucket")


def test_a_manifest_over_the_budget_is_refused(store: ChunkStore, objects: ObjectStore) -> None:
    put_manifest(objects, [file_entry("x", LIMIT, [[ZERO, 0, CHUNK_SIZE]] * (LIMIT // CHUNK_SIZE))])
    assert store.manifest("evil", LIMIT) is not None
    with pytest.raises(ManifestError, match="integer from 0 to"):
        store.manifest("evil", LIMIT - 1)


# --- configuration errors -------------------------------------------------------------------


def test_a_short_signing_key_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="signing_key must have at least 32 characters"):
        ChunkStore(FolderObjects(tmp_path / "b"), ChunkCache(tmp_path / "c", 0), "short")


def test_wrong_credentials_are_one_clear_line(
    s3_server: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "sandfork-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(StoreError, match="refused this engine's credentials") as e:
        s3_objects(s3_server, new_prefix()).check()
    assert "\n" not in str(e.value) and "AWS_SECRET_ACCESS_KEY" in str(e.value)


def test_a_missing_bucket_is_one_clear_line(credentials: SeaweedS3) -> None:
    with pytest.raises(StoreError, match="the bucket 'no-such-bucket' does not exist"):
        s3_objects(credentials, new_prefix(), bucket="no-such-bucket").check()


def test_an_unreachable_server_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    objects = S3Objects(S3Store(endpoint_url="http://127.0.0.1:9", bucket="b"))
    with pytest.raises(StoreError, match="cannot be reached"):
        objects.check()


# --- the cache ----------------------------------------------------------------------------


def test_the_cache_keeps_the_most_recently_used_within_its_size(tmp_path: Path) -> None:
    cache = ChunkCache(tmp_path / "cache", 3000)
    for name in "abc":
        cache.put(name, name.encode() * 1000)
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("d", b"d" * 1000)
    assert cache.get("b") is None and cache.size == 3000
    reopened = ChunkCache(tmp_path / "cache", 2000)  # order survives a restart: c goes
    assert reopened.get("c") is None and reopened.get("d") is not None
