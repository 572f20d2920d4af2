"""Copy-on-write memory: snapshots store what changed, in chains, and every one restores.

A sandbox restored from a snapshot maps that snapshot's memory image copy-on-write; its next
snapshot stores only the pages that differ (a delta over the snapshot's memory layer). These
tests build such chains with real VMs and check that each link restores to exactly its own
state (a NumPy array in the kernel and a file on disk, by checksum), that deleting a middle
link or exporting the top one loses nothing, and that forks of a restored sandbox share
nothing writable.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import requests

from conftest import EngineProcess
from sandfork.sdk import Client, Sandbox, Snapshot

pytestmark = pytest.mark.vm

SETUP = (
    "import hashlib, numpy as np\n"
    "data = np.random.default_rng(7).integers(0, 2**31, 4_000_000)\n"  # 32 MB
    "def digests():\n"
    "    return (hashlib.sha256(data).hexdigest(),\n"  # no copy: a copy is changed memory
    "            hashlib.sha256(open('/root/step.txt', 'rb').read()).hexdigest())\n"
    "open('/root/step.txt', 'w').write('0')\n"
)
CHANGE = (  # about 4 MB of the array and the file, different at every step
    "data[{step} * 500_000 : {step} * 500_000 + 500_000] += {step}\n"
    "open('/root/step.txt', 'w').write('{step}' * 1000)\n"
)


def _digests(sandbox: Sandbox) -> tuple[str, str]:
    result = sandbox.create_code_context().run_code("digests()")
    assert result.error is None, result.error
    memory, disk = eval(result.text)  # a tuple of two hex strings from our own code
    return memory, disk


def _run(sandbox: Sandbox, code: str) -> None:
    result = sandbox.create_code_context().run_code(code)
    assert result.error is None, result.error


def _memory_layers(engine: EngineProcess) -> dict[str, str]:
    """Each snapshot's memory layer, mapped to the layer it is a delta over ('' if none)."""
    with sqlite3.connect(f"file:{engine.home / 'engine.sqlite'}?mode=ro", uri=True) as db:
        layers = dict(db.execute("SELECT path, backing FROM layers").fetchall())
        rows = db.execute("SELECT id, memory FROM snapshots").fetchall()
    return {snap: layers.get(memory, "") for snap, memory in rows}


def _restores_to(client: Client, snapshot_id: str, expected: tuple[str, str]) -> None:
    restored = Sandbox.create(from_snapshot=snapshot_id, client=client)
    try:
        assert _digests(restored) == expected, snapshot_id
    finally:
        restored.kill()


def test_a_chain_of_five_snapshots_restores_link_by_link(
    own_engine: EngineProcess, tmp_path: Path
) -> None:
    client = own_engine.client()
    original = Sandbox.create(client=client)
    _run(original, SETUP)
    base = original.snapshot("base").id
    original.kill()
    sandbox = Sandbox.create(from_snapshot=base, client=client)
    chain: list[tuple[str, tuple[str, str]]] = []
    try:
        for step in range(1, 6):  # change, snapshot, change, ...
            _run(sandbox, CHANGE.format(step=step))
            chain.append((sandbox.snapshot(f"step {step}").id, _digests(sandbox)))
    finally:
        sandbox.kill()
    assert len({digests for _, digests in chain}) == 5  # five different states

    # Each link is a delta holding about what changed: never the 32 MB array again, let alone
    # the guest's RAM. The fourth would make five deltas over the template's boot image: it
    # squashes them into one delta over that image (MAX_DELTAS), and the fifth goes over it.
    backing = _memory_layers(own_engine)
    for snapshot_id, _ in chain:
        assert backing[snapshot_id], f"{snapshot_id} was stored whole"
    for snapshot_id, _ in [*chain[:3], chain[4]]:
        assert Snapshot.get(snapshot_id, client=client).size_bytes < 30 * 2**20
    assert backing[chain[3][0]] == backing[base]  # squashed onto the boot image

    for snapshot_id, expected in chain:
        _restores_to(client, snapshot_id, expected)

    # Deleting a middle link keeps the links above it restorable.
    client.request("DELETE", f"/snapshots/{chain[2][0]}")
    client.request("DELETE", f"/snapshots/{base}")
    for snapshot_id, expected in chain[3:]:
        _restores_to(client, snapshot_id, expected)

    # The top of the chain, exported, imports and restores on another engine.
    exported = own_engine.get(f"/v1/snapshots/{chain[-1][0]}/export")
    assert exported.status_code == 200, exported.text
    (tmp_path / "other-engine").mkdir()
    other = EngineProcess(tmp_path / "other-engine")
    other.start()
    try:
        answer = requests.post(
            f"{other.url}/v1/snapshots/import",
            data=exported.content,
            headers=other.auth,
            timeout=300,
        )
        assert answer.status_code == 201, answer.text
        _restores_to(other.client(), answer.json()["id"], chain[-1][1])
    finally:
        other.close()


def test_forks_of_a_restored_sandbox_are_isolated(own_engine: EngineProcess) -> None:
    client = own_engine.client()
    original = Sandbox.create(client=client)
    _run(original, SETUP)
    snapshot_id = original.snapshot().id
    original.kill()
    parent = Sandbox.create(from_snapshot=snapshot_id, client=client)
    children = parent.fork_tree(3)
    everyone = [parent, *children]
    try:
        before = _digests(parent)
        for i, sandbox in enumerate(everyone, start=1):
            _run(sandbox, CHANGE.format(step=i))
        states = [_digests(s) for s in everyone]
        assert len(set(states)) == 4, "a change showed up in another branch"
        assert before not in states
        # Each writes again over the same pages: still every branch keeps its own.
        for i, sandbox in enumerate(everyone, start=1):
            _run(sandbox, CHANGE.format(step=i))
            assert _digests(sandbox) != states[i - 1]
        _restores_to(client, snapshot_id, before)  # and the snapshot they came from did not
    finally:
        for sandbox in everyone:
            sandbox.kill()
