"""The engine's own rules, in this process on the fake backend: a sandbox's life, layer
collection, limits, leases, what a start cleans up after a killed engine, hibernation.

Each test fails when the rule it names is taken out of the engine. No VM, no subprocess, no
sleep: the watch loop is driven one tick at a time and the lease clock is the test's.
What a real VM or container does is tested with the real backends (the ``vm`` tests).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from engine_fake import Engines, FakeEngine, chain, set_status
from sandfork.backends.agent_link import AgentErrorReply
from sandfork.backends.fake import DISK, STATE, FakeHost
from sandfork.backends.fake_guest import TIMES_OUT
from sandfork.engine.boot_captures import MANIFEST
from sandfork.engine.config import EngineConfig
from sandfork.engine.db import Database
from sandfork.engine.errors import ApiError, BadRequest, Conflict, NotFound, OverLimit, Timeout
from sandfork.engine.execution import ShellCommand
from sandfork.engine.handlers.validate import metadata_field
from sandfork.engine.promotion import promote
from sandfork.protocol import ENGINE_METADATA_KEYS, BootMode, ErrorKind, OnExpiry, SandboxStatus


@pytest_asyncio.fixture
async def engines(tmp_path: Path, host: FakeHost) -> AsyncIterator[Engines]:
    runs = Engines(tmp_path, host)
    yield runs
    await runs.close()


@pytest_asyncio.fixture
async def fake_engine(engines: Engines) -> FakeEngine:
    """A started engine (not named ``engine``: that is conftest's engine process)."""
    return await engines.start()


def sandbox_dirs(fake_engine: FakeEngine) -> set[str]:
    folder = fake_engine.home / "sandboxes"
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


# -- a sandbox's life -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_created_sandbox_runs_and_a_kill_leaves_nothing(
    fake_engine: FakeEngine, host: FakeHost
) -> None:
    sandbox = await fake_engine.create()
    assert sandbox.status == "running"
    assert [r.status for r in fake_engine.db.all()] == ["running"]
    assert (await fake_engine.exec(sandbox.id, "echo hi"))["stdout"] == "echo hi"
    assert fake_engine.layers() == {Path(sandbox.disk)}
    assert sandbox.pid in host.guests

    await fake_engine.services.sandboxes.kill(sandbox.id)
    with pytest.raises(NotFound):
        fake_engine.services.sandboxes.get(sandbox.id)
    assert fake_engine.db.all() == []
    assert fake_engine.layers() == set()
    assert sandbox_dirs(fake_engine) == set()
    assert host.guests == {}


@pytest.mark.asyncio
async def test_a_sandbox_whose_process_ended_is_dead_at_the_next_tick(
    fake_engine: FakeEngine, host: FakeHost
) -> None:
    sandbox = await fake_engine.create()
    assert sandbox.pid is not None
    host.kill(sandbox.pid, "killed by signal 9 (out of memory?)")
    await fake_engine.services.sandboxes.tick()
    record = fake_engine.services.sandboxes.get(sandbox.id)
    assert (record.status, record.error) == ("dead", "killed by signal 9 (out of memory?)")
    assert [(r.status, r.error) for r in fake_engine.db.all()] == [(record.status, record.error)]
    with pytest.raises(Conflict, match="out of memory"):
        await fake_engine.exec(sandbox.id, "true")
    assert sandbox_dirs(fake_engine) == set()  # what it owned but its disk went with it


@pytest.mark.asyncio
async def test_a_dead_sandbox_is_reported_dead_once_its_files_are_released(
    fake_engine: FakeEngine, host: FakeHost
) -> None:
    """A client that sees ``dead`` may count on the host's files being gone (a VM's QMP
    socket, its RAM folder's files): the status comes after the release, not before."""
    sandbox = await fake_engine.create()
    assert sandbox.pid is not None
    host.kill(sandbox.pid, "killed by signal 9")
    gate = host.gate("destroy")
    tick = asyncio.ensure_future(fake_engine.services.sandboxes.tick())
    await gate.reached.wait()
    assert fake_engine.services.sandboxes.get(sandbox.id).status == "running"
    gate.opened.set()
    await tick
    assert fake_engine.services.sandboxes.get(sandbox.id).status == "dead"
    assert sandbox_dirs(fake_engine) == set()


@pytest.mark.asyncio
async def test_a_sandbox_that_fails_to_start_leaves_nothing(
    fake_engine: FakeEngine, host: FakeHost
) -> None:
    host.fail("create")  # once its process runs: what it holds must be released
    with pytest.raises(ApiError) as failed:
        await fake_engine.create()
    assert failed.value.status == 500
    assert fake_engine.services.sandboxes.all() == [] and fake_engine.db.all() == []
    assert fake_engine.layers() == set()
    assert sandbox_dirs(fake_engine) == set()
    assert host.guests == {}


@pytest.mark.asyncio
async def test_a_command_killed_at_its_timeout_is_a_timeout_also_in_the_ledger(
    fake_engine: FakeEngine,
) -> None:
    sandbox = await fake_engine.create()
    with pytest.raises(Timeout) as killed:
        await fake_engine.exec(sandbox.id, TIMES_OUT)
    assert killed.value.kind is ErrorKind.TIMEOUT and killed.value.message.startswith("timeout")
    (call,) = fake_engine.services.execution.ledger_events(sandbox.id)
    failed = {"status": 504, "error": killed.value.message, "kind": "timeout"}
    assert call["result"] == {"failed": failed}  # what a resume replays
    stream = fake_engine.services.execution.exec_stream(sandbox.id, ShellCommand(TIMES_OUT))
    with pytest.raises(Timeout) as streamed:
        async for _ in stream:
            pass
    assert streamed.value.kind is ErrorKind.TIMEOUT


# -- records ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_relations_are_fields_of_the_record_and_shown_in_its_metadata_too(
    engines: Engines, fake_engine: FakeEngine
) -> None:
    snapshots = fake_engine.services.snapshots
    parent = await fake_engine.create()
    (child,) = await snapshots.fork(parent.id, 1, metadata={"mine": "x"}, reseed_python=False)
    assert (child.fork_parent_id, child.metadata) == (parent.id, {"mine": "x"})
    shown = child.to_api()
    assert shown["fork_parent_id"] == parent.id and shown["fork_tree_id"] == child.fork_tree_id
    relations = {"fork_parent_id": parent.id, "fork_tree_id": child.fork_tree_id}
    assert shown["metadata"] == {"mine": "x", **relations}  # PandaStack's clients read it there
    await snapshots.checkpoint(parent.id, "c")
    resumed, _ = await snapshots.resume(parent.id, "c")
    assert (resumed.resumed_from, resumed.metadata) == (parent.id, {})

    fake_engine = await engines.restart(fake_engine)
    again = fake_engine.services.sandboxes.get(child.id)
    assert (again.fork_parent_id, again.fork_tree_id) == (parent.id, child.fork_tree_id)
    assert again.metadata == {"mine": "x"}
    assert fake_engine.services.sandboxes.get(resumed.id).resumed_from == parent.id


# The tables of an engine of an earlier version: the CPUs in "cpus", no lease or host access
# yet, the relations in the metadata.
_EARLIER_TABLES = """
CREATE TABLE sandboxes (id TEXT PRIMARY KEY, template TEXT NOT NULL, status TEXT NOT NULL,
    cpus INTEGER NOT NULL, memory_mb INTEGER NOT NULL, created_at TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}', persistent INTEGER NOT NULL DEFAULT 0,
    backend TEXT NOT NULL, accelerator TEXT NOT NULL, dir TEXT NOT NULL, pid INTEGER,
    boot_ms INTEGER, error TEXT, from_snapshot TEXT, disk TEXT NOT NULL, vm TEXT NOT NULL,
    boot_mode TEXT NOT NULL DEFAULT 'cold');
CREATE TABLE snapshots (id TEXT PRIMARY KEY, name TEXT, created_at TEXT NOT NULL,
    sandbox_id TEXT NOT NULL, template TEXT NOT NULL, parent_id TEXT, disk TEXT NOT NULL,
    vm TEXT NOT NULL, contexts TEXT NOT NULL DEFAULT '[]', size_bytes INTEGER NOT NULL,
    paused_ms INTEGER NOT NULL DEFAULT 0, hidden INTEGER NOT NULL DEFAULT 0,
    metadata TEXT NOT NULL DEFAULT '{}');
INSERT INTO sandboxes VALUES ('sbx_0123456789abcdef', 'code-interpreter', 'hibernated', 2, 512,
    '2026-01-01T00:00:00Z', '{"mine": "kept", "fork_parent_id": "sbx_fedcba9876543210",
    "fork_tree_id": "tree_0123456789abcdef"}', 0, 'vm', 'tcg', '/x', NULL, 900, NULL, NULL,
    '/x/disk.qcow2', '{"cpus": 2}', 'template');
INSERT INTO snapshots VALUES ('snap_0123456789abcdef', NULL, '2026-01-01T00:00:01Z',
    'sbx_0123456789abcdef', 'code-interpreter', NULL, '/l.qcow2', '{"memory_mb": 512}', '[]',
    10, 5, 0, '{"hibernation_of": "sbx_0123456789abcdef"}');
"""


@pytest.mark.parametrize("key", sorted(ENGINE_METADATA_KEYS))
def test_a_client_cannot_write_a_relation_the_engine_records_itself(key: str) -> None:
    """Create, fork and snapshot read their metadata through this one check: a 400 for any
    key the engine records itself (``promote`` trusts those relations)."""
    with pytest.raises(BadRequest, match=f"metadata key {key!r} is the engine's own"):
        metadata_field({"metadata": {"mine": "x", key: "sbx_0123456789abcdef"}}, EngineConfig())
    assert metadata_field({"metadata": {"mine": "x"}}, EngineConfig()) == {"mine": "x"}


def test_a_database_of_an_earlier_version_opens_its_relations_moved_out_of_metadata(
    tmp_path: Path,
) -> None:
    path = tmp_path / "engine.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as earlier:
        earlier.executescript(_EARLIER_TABLES)
    db = Database(path)
    (record,) = db.all()
    assert (record.status, record.cpu, record.boot_mode) == ("hibernated", 2, "template")
    assert isinstance(record.status, SandboxStatus) and isinstance(record.boot_mode, BootMode)
    assert (record.on_expiry, record.host_access, record.lease_seconds) == (
        OnExpiry.KILL,
        False,
        None,
    )
    assert record.metadata == {"mine": "kept"}
    assert (record.fork_parent_id, record.fork_tree_id) == (
        "sbx_fedcba9876543210",
        "tree_0123456789abcdef",
    )
    (snap,) = db.snapshots()
    assert (snap.hibernation_of, snap.metadata, snap.memory_mb) == (record.id, {}, 512)
    record.cpu, record.on_expiry = 4, OnExpiry.HIBERNATE
    db.put(record)
    db.close()
    assert Database(path).all() == [record]


@pytest.mark.asyncio
async def test_the_snapshot_listing_keeps_those_whose_metadata_matches(
    fake_engine: FakeEngine,
) -> None:
    snapshots = fake_engine.services.snapshots
    sandbox = await fake_engine.create()
    one = await snapshots.snapshot(sandbox.id, metadata={"kernel": "k1", "cell": "1"})
    two = await snapshots.snapshot(sandbox.id, metadata={"kernel": "k1", "cell": "2"})
    await snapshots.snapshot(sandbox.id, metadata={"kernel": "k2"})

    def listed(**wanted: str) -> set[str]:
        return {s.id for s in snapshots.visible(sandbox.id, wanted)}

    assert listed(kernel="k1") == {one.id, two.id}
    assert listed(kernel="k1", cell="2") == {two.id}
    assert listed(kernel="k1", cell="3") == listed(cell="") == set()
    assert len(listed()) == 3


# -- layers ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_layers_are_collected_exactly_when_nothing_uses_them(fake_engine: FakeEngine) -> None:
    sandboxes, snapshots = fake_engine.services.sandboxes, fake_engine.services.snapshots
    a = await fake_engine.create()
    l0 = Path(a.disk)
    s1 = await snapshots.snapshot(a.id, "s1")
    l1 = Path(sandboxes.get(a.id).disk)
    b = await fake_engine.restore(s1.id)
    l2 = Path(b.disk)
    s2 = await snapshots.snapshot(b.id, "s2")
    l3 = Path(sandboxes.get(b.id).disk)
    assert (Path(s1.disk), Path(s2.disk)) == (l0, l2)
    assert chain(l1)[:2] == [l1, l0] and chain(l3)[:3] == [l3, l2, l0]
    assert fake_engine.layers() == {l0, l1, l2, l3}

    snapshots.delete(s1.id)  # l0 is still below both sandboxes' disks
    assert fake_engine.layers() == {l0, l1, l2, l3}
    assert not fake_engine.store.path(s1.id, hidden=False).exists()
    await sandboxes.kill(a.id)  # l1 was a's alone
    assert fake_engine.layers() == {l0, l2, l3}
    await sandboxes.kill(b.id)  # s2 keeps its layer and the one below
    assert fake_engine.layers() == {l0, l2}
    snapshots.delete(s2.id)
    assert fake_engine.layers() == set()


@pytest.mark.asyncio
async def test_a_layer_registered_but_not_yet_settled_survives_a_collect(
    fake_engine: FakeEngine, host: FakeHost
) -> None:
    """The 24%-failure bug of design-notes ("Crash safety"): one request's clean-up must not
    collect the layer another's capture has just made."""
    a, other = await fake_engine.create(), await fake_engine.create()
    gate = host.gate("snapshot")
    capture = asyncio.create_task(fake_engine.services.snapshots.snapshot(a.id, "s"))
    await gate.reached.wait()
    (made,) = {Path(p) for p in fake_engine.db.layers()} - {Path(a.disk), Path(other.disk)}
    await fake_engine.services.sandboxes.kill(other.id)  # collects
    fake_engine.store.drain()
    assert made.exists()
    gate.opened.set()
    snap = await capture
    assert fake_engine.services.sandboxes.get(a.id).disk == str(made)
    assert fake_engine.layers() == {made, Path(snap.disk)}
    assert chain(made)[1] == Path(snap.disk)


@pytest.mark.asyncio
async def test_deleting_a_snapshot_while_it_is_restored_is_a_409(
    fake_engine: FakeEngine, host: FakeHost
) -> None:
    a = await fake_engine.create()
    snap = await fake_engine.services.snapshots.snapshot(a.id, "s")
    gate = host.gate("restore")
    restore = asyncio.create_task(fake_engine.restore(snap.id))
    await gate.reached.wait()
    with pytest.raises(Conflict) as refused:
        fake_engine.services.snapshots.delete(snap.id)
    assert refused.value.status == 409
    gate.opened.set()
    assert (await restore).status == "running"
    fake_engine.services.snapshots.delete(snap.id)  # once the restore is done
    assert fake_engine.services.snapshots.visible() == []


@pytest.mark.asyncio
async def test_a_restore_has_exactly_its_snapshots_state(fake_engine: FakeEngine) -> None:
    a = await fake_engine.create()
    await fake_engine.write(a.id, "kept", b"at the snapshot")
    snap = await fake_engine.services.snapshots.snapshot(a.id, "s")
    await fake_engine.write(a.id, "kept", b"changed after it")
    await fake_engine.write(a.id, "later", b"written after it")
    b = await fake_engine.restore(snap.id)
    assert await fake_engine.read(b.id, "kept") == b"at the snapshot"
    with pytest.raises(ApiError) as missing:
        await fake_engine.read(b.id, "later")
    assert missing.value.status == 404
    assert await fake_engine.read(a.id, "kept") == b"changed after it"  # the parent runs on


@pytest.mark.asyncio
async def test_a_failed_capture_lists_nothing_and_the_sandbox_runs_on(
    fake_engine: FakeEngine, host: FakeHost
) -> None:
    a = await fake_engine.create()
    host.fail("snapshot")  # after it made its disk layer
    with pytest.raises(ApiError) as failed:
        await fake_engine.services.snapshots.snapshot(a.id, "s")
    assert failed.value.status == 500
    assert fake_engine.services.snapshots.visible() == [] and fake_engine.db.snapshots() == []
    assert list(fake_engine.store.dir.iterdir()) == []  # no staging folder left
    assert fake_engine.services.sandboxes.get(a.id).disk == a.disk
    fake_engine.store.collect(fake_engine.services.sandboxes.all())  # the next clean-up
    assert fake_engine.layers() == {Path(a.disk)}  # the failed capture's layer was given up
    assert (await fake_engine.services.snapshots.snapshot(a.id, "s")).name == "s"


@pytest.mark.asyncio
async def test_a_failed_restore_leaves_nothing(fake_engine: FakeEngine, host: FakeHost) -> None:
    a = await fake_engine.create()
    snap = await fake_engine.services.snapshots.snapshot(a.id, "s")
    before = fake_engine.layers()
    host.fail("restore")  # once its process runs
    with pytest.raises(ApiError) as failed:
        await fake_engine.restore(snap.id)
    assert failed.value.status == 500
    assert [r.id for r in fake_engine.services.sandboxes.all()] == [a.id]
    assert sandbox_dirs(fake_engine) == {a.id}
    assert set(host.guests) == {a.pid}
    assert fake_engine.layers() == before


# -- limits ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_max_sandboxes_refuses_before_any_work(engines: Engines, host: FakeHost) -> None:
    engine = await engines.start(limits={"max_sandboxes": 2})
    first, _ = await engine.create(), await engine.create()
    with pytest.raises(OverLimit, match="max_sandboxes") as refused:
        await engine.create()
    assert refused.value.status == 429
    assert host.calls["create"] == 2
    assert len(engine.db.all()) == 2 and len(engine.layers()) == 2
    assert first.pid is not None
    host.kill(first.pid, "crashed")
    await engine.services.sandboxes.tick()  # a dead sandbox takes no room
    assert (await engine.create()).status == "running"


@pytest.mark.asyncio
async def test_max_total_memory_refuses_before_any_work(engines: Engines, host: FakeHost) -> None:
    engine = await engines.start(limits={"max_total_memory_mb": 1000})
    await engine.create(memory_mb=600)
    with pytest.raises(OverLimit, match="max_total_memory_mb") as refused:
        await engine.create(memory_mb=600)
    assert refused.value.status == 429
    assert host.calls["create"] == 1 and len(engine.layers()) == 1
    assert (await engine.create(memory_mb=400)).status == "running"


@pytest.mark.asyncio
async def test_a_fork_whose_copy_cannot_be_reseeded_leaves_no_copy_running(
    fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = await fake_engine.create()
    execution = fake_engine.services.execution
    reseeded: list[str] = []

    async def reseed(sandbox_id: str) -> None:
        reseeded.append(sandbox_id)
        if len(reseeded) == 2:
            raise ApiError("its kernel is gone", 502)

    monkeypatch.setattr(execution, "reseed_python", reseed)
    with pytest.raises(ApiError, match="reseeding a copy failed: its kernel is gone"):
        await fake_engine.services.snapshots.fork(parent.id, 3, metadata={}, reseed_python=True)
    assert len(reseeded) == 3  # all at once: one failing stops none of the others
    alive = [r.id for r in fake_engine.services.sandboxes.all()]
    assert alive == [parent.id]


@pytest.mark.asyncio
async def test_a_fork_that_would_not_fit_is_refused_before_its_capture(
    engines: Engines, host: FakeHost
) -> None:
    engine = await engines.start(limits={"max_sandboxes": 3})
    parent = await engine.create()
    fork = engine.services.snapshots.fork
    with pytest.raises(OverLimit, match="max_sandboxes"):
        await fork(parent.id, 3, metadata={}, reseed_python=False)
    assert host.calls["snapshot"] == 0 and host.calls["restore"] == 0
    children = await fork(parent.id, 2, metadata={}, reseed_python=False)
    assert [c.status for c in children] == ["running", "running"]
    assert host.calls["snapshot"] == 1
    assert engine.db.snapshots() == []  # the fork's capture goes once the children run


@pytest.mark.asyncio
async def test_a_promote_kills_the_parent_only_when_asked_and_siblings_of_its_tree(
    fake_engine: FakeEngine,
) -> None:
    sandboxes, fork = fake_engine.services.sandboxes, fake_engine.services.snapshots.fork
    parent = await fake_engine.create()
    first = await fork(parent.id, 2, metadata={}, reseed_python=False)
    second = await fork(parent.id, 1, metadata={}, reseed_python=False)
    tree = first[0].fork_tree_id
    assert first[1].fork_tree_id == tree != second[0].fork_tree_id
    assert first[0].fork_parent_id == parent.id and first[0].metadata == {}

    done = await promote(sandboxes, first[0].id, kill_siblings=True, tree_id=tree)
    assert (done.siblings, done.parent, done.failures) == ([first[1].id], [], {})
    assert sandboxes.get(parent.id).status == "running"  # PandaStack's promote: never the parent
    assert sandboxes.get(second[0].id).status == "running"  # another fork call's child
    promoted = sandboxes.get(first[0].id)
    assert (promoted.fork_parent_id, promoted.fork_tree_id) == (None, None)
    assert promoted.promoted_from == parent.id
    assert promoted.to_api()["metadata"] == {"promoted_from": parent.id}  # PandaStack reads it

    done = await promote(sandboxes, second[0].id, kill_siblings=False, kill_parent=True)
    assert done.parent == [parent.id]
    with pytest.raises(NotFound):
        sandboxes.get(parent.id)


@pytest.mark.asyncio
async def test_the_snapshot_quota_counts_stored_snapshots(engines: Engines, host: FakeHost) -> None:
    engine = await engines.start(limits={"snapshot_quota_mb": 1})
    a = await engine.create()
    await engine.write(a.id, "data", b"x" * 450 * 1024)  # a capture stores ~600 KiB
    first = await engine.services.snapshots.snapshot(a.id, "first")
    with pytest.raises(OverLimit, match="snapshot_quota_mb") as refused:
        await engine.services.snapshots.snapshot(a.id, "second")
    assert refused.value.status == 429
    assert host.calls["snapshot"] == 1
    engine.services.snapshots.delete(first.id)
    assert (await engine.services.snapshots.snapshot(a.id, "second")).name == "second"


# -- leases ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_lease_not_renewed_kills_its_sandbox(
    fake_engine: FakeEngine, host: FakeHost
) -> None:
    sandbox = await fake_engine.create()
    fake_engine.services.sandboxes.lease(sandbox.id, 10)
    await fake_engine.advance(9)
    assert fake_engine.services.sandboxes.get(sandbox.id).status == "running"
    await fake_engine.advance(1)
    with pytest.raises(NotFound):
        fake_engine.services.sandboxes.get(sandbox.id)
    assert fake_engine.layers() == set() and host.guests == {}


@pytest.mark.asyncio
async def test_a_renewal_extends_the_lease(fake_engine: FakeEngine) -> None:
    sandboxes = fake_engine.services.sandboxes
    sandbox = await fake_engine.create()
    sandboxes.lease(sandbox.id, 10)
    await fake_engine.advance(8)
    sandboxes.lease(sandbox.id, None)  # a renewal: the same period again
    await fake_engine.advance(8)
    assert sandboxes.get(sandbox.id).status == "running"
    assert sandboxes.lease_remaining(sandbox.id) == pytest.approx(2)
    await fake_engine.advance(2)
    with pytest.raises(NotFound):
        sandboxes.get(sandbox.id)


@pytest.mark.asyncio
async def test_time_the_engine_stood_still_is_not_held_against_a_lease(
    fake_engine: FakeEngine,
) -> None:
    sandbox = await fake_engine.create()
    fake_engine.services.sandboxes.lease(sandbox.id, 10)
    await fake_engine.advance(1)
    fake_engine.clock.now += 100  # the engine was suspended: no tick ran, renewals wait unread
    await fake_engine.services.sandboxes.tick()
    assert fake_engine.services.sandboxes.get(sandbox.id).status == "running"


@pytest.mark.asyncio
async def test_an_engine_start_gives_every_lease_a_fresh_full_period(
    engines: Engines, fake_engine: FakeEngine
) -> None:
    sandbox = await fake_engine.create()
    fake_engine.services.sandboxes.lease(sandbox.id, 10)
    await fake_engine.advance(8)
    fake_engine = await engines.restart(fake_engine)
    sandboxes = fake_engine.services.sandboxes
    assert sandboxes.get(sandbox.id).status == "running"  # adopted
    assert sandboxes.lease_remaining(sandbox.id) == pytest.approx(10)
    await fake_engine.advance(9)
    assert sandboxes.get(sandbox.id).status == "running"
    await fake_engine.advance(1)
    with pytest.raises(NotFound):
        sandboxes.get(sandbox.id)


@pytest.mark.asyncio
async def test_a_persistent_sandbox_holds_no_lease(fake_engine: FakeEngine) -> None:
    sandbox = await fake_engine.create(persistent=True)
    with pytest.raises(BadRequest, match="persistent"):
        fake_engine.services.sandboxes.lease(sandbox.id, 10)
    assert fake_engine.services.sandboxes.lease_remaining(sandbox.id) is None


@pytest.mark.asyncio
async def test_made_persistent_a_sandbox_outlives_its_lease_and_an_ended_lease_kills_nothing(
    engines: Engines, fake_engine: FakeEngine
) -> None:
    sandboxes = fake_engine.services.sandboxes
    kept, freed = await fake_engine.create(), await fake_engine.create()
    for sandbox in (kept, freed):
        sandboxes.lease(sandbox.id, 10)
    sandboxes.set_persistent(kept.id, True)
    sandboxes.end_lease(freed.id)
    await fake_engine.advance(20)
    assert sandboxes.get(kept.id).persistent and sandboxes.get(kept.id).lease_seconds is None
    assert sandboxes.get(freed.id).status == "running"
    fake_engine = await engines.restart(fake_engine)  # both are kept in the record
    sandboxes = fake_engine.services.sandboxes
    await fake_engine.advance(20)
    assert [sandboxes.lease_remaining(s.id) for s in (kept, freed)] == [None, None]
    assert {sandboxes.get(s.id).status for s in (kept, freed)} == {"running"}
    sandboxes.set_persistent(kept.id, False)
    sandboxes.lease(kept.id, 10)  # a TTL again: it runs out
    await fake_engine.advance(10)
    with pytest.raises(NotFound):
        sandboxes.get(kept.id)


# -- pause -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_paused_sandbox_refuses_work_keeps_its_lease_and_goes_on_when_resumed(
    fake_engine: FakeEngine, host: FakeHost
) -> None:
    sandboxes = fake_engine.services.sandboxes
    sandbox = await fake_engine.create()
    sandboxes.lease(sandbox.id, 10)
    await fake_engine.write(sandbox.id, "/root/kept", b"state")
    paused = await sandboxes.pause(sandbox.id, wait=5)
    assert paused.status == "paused" and host.guests[sandbox.pid].frozen
    assert (await sandboxes.pause(sandbox.id, wait=5)).status == "paused"  # idempotent
    with pytest.raises(Conflict, match="is paused: resume it first"):
        await fake_engine.exec(sandbox.id, "echo hi")
    with pytest.raises(Conflict, match="is paused"):
        await fake_engine.services.snapshots.snapshot(sandbox.id, "s")
    with pytest.raises(Conflict, match="is paused"):
        await fake_engine.services.sandboxes.hibernate(sandbox.id)
    await fake_engine.advance(8)
    sandboxes.lease(sandbox.id, None)  # a renewal while paused
    await fake_engine.advance(8)
    resumed = await sandboxes.unpause(sandbox.id)
    assert resumed.status == "running" and not host.guests[sandbox.pid].frozen
    assert await fake_engine.read(sandbox.id, "/root/kept") == b"state"
    assert (await sandboxes.unpause(sandbox.id)).status == "running"


@pytest.mark.asyncio
async def test_a_pause_waits_for_the_work_in_flight(
    fake_engine: FakeEngine, host: FakeHost
) -> None:
    sandboxes = fake_engine.services.sandboxes
    sandbox = await fake_engine.create()
    async with sandboxes.activity.operation(sandbox.id):  # an exec, say, still running
        pause = asyncio.create_task(sandboxes.pause(sandbox.id, wait=60))
        for _ in range(10):  # let it run as far as it can
            await asyncio.sleep(0)
        assert not pause.done() and not host.guests[sandbox.pid].frozen
    assert (await pause).status == "paused" and host.guests[sandbox.pid].frozen


@pytest.mark.asyncio
async def test_a_restart_and_a_kill_let_a_paused_sandbox_go(
    engines: Engines, fake_engine: FakeEngine, host: FakeHost
) -> None:
    kept, killed = await fake_engine.create(), await fake_engine.create()
    for sandbox in (kept, killed):
        await fake_engine.services.sandboxes.pause(sandbox.id, wait=5)
    await fake_engine.services.sandboxes.kill(killed.id)
    assert killed.pid not in host.guests
    fake_engine = await engines.restart(fake_engine)
    assert fake_engine.services.sandboxes.get(kept.id).status == "running"
    assert next(r for r in fake_engine.db.all() if r.id == kept.id).status == "running"
    assert not host.guests[kept.pid].frozen
    assert (await fake_engine.exec(kept.id, "echo again"))["stdout"] == "echo again"


# -- what a start cleans up after a killed engine -------------------------------------------


@pytest.mark.asyncio
async def test_a_sandbox_still_starting_is_dropped_and_swept(
    engines: Engines, fake_engine: FakeEngine, host: FakeHost
) -> None:
    sandbox = await fake_engine.create()
    fake_engine = await engines.restart(fake_engine, set_status(sandbox.id, SandboxStatus.STARTING))
    with pytest.raises(NotFound):
        fake_engine.services.sandboxes.get(sandbox.id)
    assert fake_engine.db.all() == []
    assert sandbox_dirs(fake_engine) == set()
    assert host.guests == {}
    assert fake_engine.layers() == set()


@pytest.mark.asyncio
async def test_a_sandbox_left_waking_sleeps_again_and_wakes_from_its_capture(
    engines: Engines, fake_engine: FakeEngine
) -> None:
    sandbox = await fake_engine.create()
    await fake_engine.write(sandbox.id, "f", b"before sleep")
    await fake_engine.services.sandboxes.hibernate(sandbox.id)
    fake_engine = await engines.restart(fake_engine, set_status(sandbox.id, SandboxStatus.WAKING))
    assert fake_engine.services.sandboxes.get(sandbox.id).status == "hibernated"
    assert await fake_engine.read(sandbox.id, "f") == b"before sleep"  # any use wakes it
    assert fake_engine.services.sandboxes.get(sandbox.id).status == "running"


@pytest.mark.asyncio
async def test_a_hibernation_capture_of_a_sandbox_not_asleep_is_dropped(
    engines: Engines, fake_engine: FakeEngine
) -> None:
    sandbox = await fake_engine.create()
    # What an engine killed between hibernate's capture and the stop of the sandbox leaves.
    sandboxes = fake_engine.services.sandboxes
    async with sandboxes.lock(sandbox.id):
        capture = await sandboxes.capture(sandbox.id, hibernation=True)
    assert sandboxes.hibernation_capture(sandbox.id) == capture
    fake_engine = await engines.restart(fake_engine)
    assert fake_engine.services.sandboxes.hibernation_capture(sandbox.id) is None
    assert fake_engine.db.snapshots() == []
    fake_engine.store.drain()
    assert not (fake_engine.store.dir / capture.id).exists()
    assert (await fake_engine.exec(sandbox.id, "true"))["exit_code"] == 0  # adopted, runs on


@pytest.mark.asyncio
async def test_a_forks_hidden_capture_is_dropped(engines: Engines, fake_engine: FakeEngine) -> None:
    sandbox = await fake_engine.create()
    # What an engine killed between a fork's capture and its children leaves.
    hidden = await fake_engine.services.snapshots.snapshot(sandbox.id, hidden=True)
    folder = fake_engine.store.path(hidden.id)
    assert folder.exists()
    fake_engine = await engines.restart(fake_engine)
    assert fake_engine.db.snapshots() == []
    fake_engine.store.drain()
    assert not folder.exists()
    assert fake_engine.layers() == {Path(p) for p in chain(fake_engine.db.all()[0].disk)[:2]}


@pytest.mark.asyncio
async def test_unknown_layers_incomplete_snapshots_and_trash_are_removed(
    engines: Engines, fake_engine: FakeEngine
) -> None:
    sandbox = await fake_engine.create()
    snap = await fake_engine.services.snapshots.snapshot(sandbox.id, "s")
    known = fake_engine.layers()
    store = fake_engine.store
    leftovers = [
        store.layers_dir / "0123456789abcdef.fake",  # made, never recorded
        store.layers_dir / ".trash-fedcba9876543210.fake",  # being deleted
        store.dir / ".trash-snp_gone",
        store.dir / ".tmp-snp_halfway",  # a capture that never finished
    ]

    def leave(db: Database) -> None:
        leftovers[0].write_text("{}")
        leftovers[1].write_text("{}")
        for folder in leftovers[2:]:
            folder.mkdir()
            (folder / "state.json").write_text("{}")

    fake_engine = await engines.restart(fake_engine, leave)
    fake_engine.store.drain()
    assert [p for p in leftovers if p.exists()] == []
    assert fake_engine.layers() == known
    assert (await fake_engine.restore(snap.id)).status == "running"


# -- hibernation ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_hibernate_and_wake_keep_the_id_and_restore_the_captured_state(
    fake_engine: FakeEngine, host: FakeHost
) -> None:
    sandboxes, snapshots = fake_engine.services.sandboxes, fake_engine.services.snapshots
    sandbox = await fake_engine.create()
    slept = sandbox.pid
    await fake_engine.write(sandbox.id, "f", b"before sleep")
    asleep = await sandboxes.hibernate(sandbox.id)
    assert (asleep.id, asleep.status, asleep.pid) == (sandbox.id, "hibernated", None)
    assert host.guests == {} and sandbox_dirs(fake_engine) == set()
    assert snapshots.visible() == []  # its capture is not listed
    assert sandboxes.hibernation_capture(sandbox.id) is not None

    awake = await sandboxes.wake(sandbox.id)
    assert (awake.id, awake.status) == (sandbox.id, "running")
    assert awake.pid is not None and awake.pid != slept
    files = host.guests[awake.pid].files
    assert files == {"/root/f": base64.b64encode(b"before sleep").decode()}
    assert sandboxes.hibernation_capture(sandbox.id) is None  # deleted once it runs
    assert fake_engine.layers() == set(chain(awake.disk)[:-1])  # its chain, not the template's


@pytest.mark.asyncio
async def test_sandboxes_start_from_one_boot_capture(engines: Engines, host: FakeHost) -> None:
    engine = await engines.start(boot_captures=True)
    a, b = await engine.create(), await engine.create()
    assert (a.boot_mode, b.boot_mode) == ("template", "template")
    assert (host.calls["boot_capture"], host.calls["restore"], host.calls["create"]) == (1, 2, 0)
    capture_disk = chain(a.disk)[1]
    assert capture_disk == chain(b.disk)[1] and capture_disk.is_relative_to(engines.root)
    await engine.services.sandboxes.kill(a.id)
    await engine.services.sandboxes.kill(b.id)
    assert engine.layers() == set() and capture_disk.exists()  # the cache's, not the engine's


@pytest.mark.asyncio
async def test_a_boot_capture_that_fails_to_restore_is_rebuilt_once(
    engines: Engines, host: FakeHost
) -> None:
    engine = await engines.start(boot_captures=True)
    host.fail("restore")
    sandbox = await engine.create()
    assert sandbox.status == "running"
    assert (host.calls["boot_capture"], host.calls["restore"]) == (2, 2)
    assert [r.id for r in engine.db.all()] == [sandbox.id]


@pytest.mark.asyncio
@pytest.mark.parametrize("damage", ["short", "garbled"])
async def test_a_damaged_boot_capture_is_rebuilt_before_use(
    engines: Engines, host: FakeHost, damage: str
) -> None:
    """The checks before every use: a file shorter than its manifest says, or the checksummed
    file changed (the VM's own damage, a restore QEMU refuses, is test_boot_captures.py's)."""
    engine = await engines.start(boot_captures=True)
    await engine.services.sandboxes.kill((await engine.create()).id)
    captures = engines.root / "boot-captures"
    [first] = [p for p in captures.iterdir() if p.is_dir()]
    # Damage the fake backend would not notice: it would start from this capture as it is.
    if damage == "short":  # the same layer, one byte shorter
        disk = first / DISK
        disk.write_text(json.dumps(json.loads(disk.read_text()), separators=(",", ":")))
    else:  # the checksummed file, as long as before
        (first / STATE).write_text("[]")
    sandbox = await engine.create()
    assert sandbox.status == "running"
    assert (host.calls["boot_capture"], host.calls["restore"]) == (2, 2)
    generations = sorted(p.name for p in captures.iterdir() if p.is_dir())
    assert generations == [first.name, f"{first.name}.1"]
    assert not (first / MANIFEST).exists()  # discarded: never used again


@pytest.mark.asyncio
async def test_a_first_boot_the_guest_fails_is_a_clear_error_and_leaves_nothing(
    engines: Engines, host: FakeHost
) -> None:
    engine = await engines.start(boot_captures=True)
    failure = AgentErrorReply("Timeout", "kernel did not become ready within 600 s")
    host.fail("boot_capture", failure)
    with pytest.raises(ApiError, match=r"first boot of template .* within 600 s") as caught:
        await engine.create()
    assert caught.value.status == 504
    assert engine.db.all() == []
    assert (await engine.create()).status == "running"  # the next create builds it again
