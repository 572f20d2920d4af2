"""The engine SIGKILLed at the worst instants of its operations loses nothing and leaks nothing.

Each case runs an operation on an engine told to kill itself at one named point
(``SANDFORK_CRASH_AT``, see :mod:`sandfork.crashpoints`), so the crash lands exactly inside
the window it tests, however fast the machine: a snapshot (with its VM paused, or its memory
half written, ...), a cell's checkpoint as the proxy kernel takes it, a hibernation, a wake, a
fork, a promotion, a kill. Then a fresh engine starts on the same state and
:func:`engine_invariants.check_engine` checks that every snapshot restores, with its data,
every running sandbox snapshots, and no VM, layer, RAM file or temporary file is unowned;
and what was being worked on still runs with its data.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from conftest import EngineProcess
from engine_invariants import cell_checkpoint, check_engine, make_state, state_digests
from sandfork.crashpoints import CRASH_POINTS
from sandfork.protocol import FORK_PARENT
from sandfork.sdk import Sandbox, SandforkError

pytestmark = pytest.mark.portable  # runs on every backend (the suite's container pass too)

Operation = Callable[[Sandbox, str], object]


def _hibernate_then_wake(sandbox: Sandbox, snapshot_id: str) -> object:
    sandbox.hibernate()
    sandbox.wake()
    return sandbox


OPERATIONS: dict[str, Operation] = {
    "start.spawned": lambda sb, snap: Sandbox.create(from_snapshot=snap, client=sb.client),
    "snapshot.inventoried": cell_checkpoint,
    "snapshot.paused": lambda sb, snap: sb.snapshot("doomed"),
    "snapshot.memory": lambda sb, snap: sb.snapshot("doomed"),
    "snapshot.frozen": lambda sb, snap: sb.snapshot("doomed"),
    "snapshot.written": lambda sb, snap: sb.snapshot("doomed"),
    "hibernate.captured": lambda sb, snap: sb.hibernate(),
    "wake.resumed": _hibernate_then_wake,
    "fork.captured": lambda sb, snap: sb.fork(),
    "promote.killed": lambda sb, snap: sb.fork().promote(),
    "pause.frozen": lambda sb, snap: sb.client.request("POST", f"/sandboxes/{sb.id}/pause"),
    "kill.destroyed": lambda sb, snap: sb.kill(),
}


VM_ONLY = {"snapshot.memory"}


def test_every_crash_point_is_tested() -> None:
    assert set(OPERATIONS) == set(CRASH_POINTS)


@pytest.mark.vm
@pytest.mark.parametrize(
    "point",
    # A VM's memory layer half written: containers write none.
    [pytest.param(p, marks=pytest.mark.vm_only) if p in VM_ONLY else p for p in CRASH_POINTS],
)
def test_engine_killed_inside_an_operation(own_engine: EngineProcess, point: str) -> None:
    original = Sandbox.create(client=own_engine.client())
    digest = make_state(original, seed=len(point))
    first = original.snapshot("before").id
    original.kill()
    # The sandbox worked on is a restored one: its memory is a chain over the snapshot's.
    sandbox = Sandbox.create(from_snapshot=first, client=own_engine.client())

    own_engine.stop()
    own_engine.env["SANDFORK_CRASH_AT"] = point
    own_engine.start()
    sandbox.client = own_engine.client()
    with pytest.raises(SandforkError, match="could not reach the engine"):
        OPERATIONS[point](sandbox, first)
    assert own_engine.process is not None
    assert own_engine.process.wait(30) == -signal.SIGKILL  # it died where we asked

    del own_engine.env["SANDFORK_CRASH_AT"]
    own_engine.start()
    client = own_engine.client()
    check_engine(own_engine, {first: digest})
    # What was being worked on carries on with its data (the sandbox, woken if it was
    # waking; the promoted child, its parent being gone), and its next snapshot restores
    # (checked above). A sandbox killed or not yet started is gone; one frozen for a pause runs.
    running = [s for s in Sandbox.list(client=client) if s.status == "running"]
    expected = {
        "kill.destroyed": [],
        "promote.killed": [s.id for s in running if s.metadata.get(FORK_PARENT) == sandbox.id],
    }.get(point, [sandbox.id])
    assert [s.id for s in running] == expected and (expected or point == "kill.destroyed")
    for survivor in running:
        assert state_digests(survivor) == (digest, digest), survivor.id
    if point == "promote.killed":  # promoting again finishes what the crash cut short
        assert running[0].promote() == []
        assert FORK_PARENT not in Sandbox.get(running[0].id, client=client).metadata
    for item in client.request("GET", "/sandboxes")["items"]:
        client.request("DELETE", f"/sandboxes/{item['id']}")


def test_a_layer_file_nobody_recorded_goes_at_start(own_engine: EngineProcess) -> None:
    own_engine.stop(signal.SIGKILL)
    stray = own_engine.home / "layers" / "0123456789abcdef.qcow2"
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(b"left by an engine killed before it recorded the layer")
    own_engine.start()
    assert not stray.exists()
    assert list((own_engine.home / "layers").glob(".trash-*")) == []  # emptied before serving
