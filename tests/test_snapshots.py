"""Snapshot, restore and fork of whole sandboxes on real VMs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from conftest import EngineProcess
from sandfork.sdk import Client, NotFoundError, Sandbox, Snapshot
from turns import TURN2_FINDS

pytestmark = [pytest.mark.vm, pytest.mark.portable]

TURNS = Path(__file__).with_name("turns.py")


def _turn(engine: EngineProcess, *args: str) -> str:
    env = {**os.environ, "SANDFORK_API": engine.url, "SANDFORK_API_KEY": engine.api_key}
    done = subprocess.run(
        [sys.executable, str(TURNS), *args], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_two_turns_in_two_processes_across_an_engine_restart(own_engine: EngineProcess) -> None:
    snapshot_id = _turn(own_engine, "turn1")
    assert snapshot_id.startswith("snap_")
    own_engine.stop()
    own_engine.start()
    found = json.loads(_turn(own_engine, "turn2", snapshot_id))
    assert found == TURN2_FINDS


def test_restores_diverge_and_files_follow_the_snapshot(client: Client) -> None:
    sb = Sandbox.create(client=client)
    ctx = sb.create_code_context()
    ctx.run_code("counter = 10")
    sb.filesystem.write("/root/before.txt", "before")
    snap = sb.snapshot("diverge")
    sb.filesystem.write("/root/after.txt", "after")
    ctx.run_code("counter = -1")
    a = Sandbox.create(from_snapshot=snap, client=client)
    b = Sandbox.create(from_snapshot=snap, client=client)
    try:
        a.create_code_context().run_code("counter += 1")
        b.create_code_context().run_code("counter += 100")
        assert a.create_code_context().run_code("counter").text == "11"
        assert b.create_code_context().run_code("counter").text == "110"
        assert ctx.run_code("counter").text == "-1"
        for restored in (a, b):
            assert restored.filesystem.read_text("/root/before.txt") == "before"
            assert not restored.filesystem.exists("/root/after.txt")
        info = Snapshot.get(snap, client=client)
        assert info.name == "diverge" and info.sandbox_id == sb.id
        assert info.contexts == ["default"] and info.size_bytes > 0
        # the guest clock was set from the host on restore
        asked = time.time()
        guest_time = float(a.exec("date +%s.%N").stdout)
        assert asked - 5 < guest_time < time.time() + 5  # however long the exec took
    finally:
        for s in (sb, a, b):
            s.kill()


def test_forks_are_isolated(client: Client) -> None:
    parent = Sandbox.create(client=client)
    ctx = parent.create_code_context()
    ctx.run_code("import random\nitems = [1, 2]")
    children = parent.fork_tree(3, reseed_python=True)
    single = parent.fork()
    try:
        assert len(children) == 3 and len({c.id for c in children}) == 3
        for i, child in enumerate(children):
            child.create_code_context().run_code(f"items.append({i})")
            child.filesystem.write("/root/mine", str(i))
        for i, child in enumerate(children):
            assert child.create_code_context().run_code("items").text == f"[1, 2, {i}]"
            assert child.filesystem.read_text("/root/mine") == str(i)
        assert ctx.run_code("items").text == "[1, 2]"
        assert not parent.filesystem.exists("/root/mine")
        assert single.create_code_context().run_code("items").text == "[1, 2]"
        draws = {c.create_code_context().run_code("random.random()").text for c in children}
        assert len(draws) == 3  # reseeded: the forks do not share a random stream
        assert all(c.refresh().metadata["fork_parent_id"] == parent.id for c in children)
        assert Snapshot.list(client=client, sandbox_id=parent.id) == []  # forks leave no snapshot
    finally:
        for s in (parent, single, *children):
            s.kill()


def test_deleting_a_snapshot_keeps_its_dependants_restorable(client: Client) -> None:
    sb = Sandbox.create(client=client)
    sb.filesystem.write("/root/layer1", "one")
    first = sb.snapshot()
    middle = Sandbox.create(from_snapshot=first, client=client)
    middle.filesystem.write("/root/layer2", "two")
    second = middle.snapshot()
    sb.kill()
    middle.kill()
    Snapshot.get(first, client=client).delete()
    with pytest.raises(NotFoundError):
        Sandbox.create(from_snapshot=first, client=client)
    last = Sandbox.create(from_snapshot=second, client=client)
    try:
        assert last.filesystem.read_text("/root/layer1") == "one"
        assert last.filesystem.read_text("/root/layer2") == "two"
    finally:
        last.kill()
    Snapshot.get(second, client=client).delete()


def test_snapshot_management_api(client: Client, engine: EngineProcess) -> None:
    sb = Sandbox.create(client=client)
    snap = Snapshot.get(sb.snapshot(), client=client)
    snap.rename("renamed")
    assert Snapshot.get(snap.id, client=client).name == "renamed"
    assert [s.id for s in Snapshot.list(sandbox_id=sb.id, client=client)] == [snap.id]
    bad = [
        ("PATCH", f"/v1/snapshots/{snap.id}", {"name": ""}, 400),
        ("PATCH", f"/v1/snapshots/{snap.id}", {"name": "a\nb"}, 400),
        ("GET", "/v1/snapshots/snap_0000000000000000", None, 404),
        ("POST", "/v1/sandboxes", {"from_snapshot": "snap_0000000000000000"}, 404),
        ("POST", f"/v1/sandboxes/{sb.id}/fork-tree", {"count": 0}, 400),
        ("POST", f"/v1/sandboxes/{sb.id}/fork-tree", {"count": 17}, 400),
        ("POST", f"/v1/sandboxes/{sb.id}/snapshots", {"name": 5}, 400),
        ("POST", f"/v1/sandboxes/{sb.id}/snapshots", {"attachments": {"../x": "a"}}, 400),
        ("POST", f"/v1/sandboxes/{sb.id}/snapshots", {"attachments": {"a": 5}}, 400),
        (
            "POST",
            f"/v1/sandboxes/{sb.id}/snapshots",
            {"attachments": {"a": "x" * (2**26 + 1)}},
            400,
        ),
        ("GET", f"/v1/snapshots/{snap.id}/attachments/notebook.ipynb", None, 404),
    ]
    for method, path, body, status in bad:
        response = requests.request(
            method, f"{engine.url}{path}", json=body, headers=engine.auth, timeout=60
        )
        assert response.status_code == status, (path, response.text)
        assert response.json()["error"]
    assert [s.id for s in Snapshot.list(sandbox_id=sb.id, client=client)] == [snap.id]
    sb.kill()
    # A snapshot outlives its sandbox, and the list still finds it by that sandbox.
    assert [s.id for s in Snapshot.list(sandbox_id=sb.id, client=client)] == [snap.id]
    snap.delete()
