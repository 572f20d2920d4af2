"""Hibernate and wake: a sandbox's VM stopped and its memory freed, its state kept under its id.

Real VMs: the capture is taken like a snapshot's, the VM goes, and the next request to the
sandbox (or ``wake``) resumes it from the capture; an engine killed while a sandbox sleeps
wakes it all the same, and nothing of a killed sleeper is left. (An engine killed between
the capture and the stop: ``test_crash_safety``'s ``hibernate.captured``.)
"""

from __future__ import annotations

import signal

import pytest

from conftest import EngineProcess
from engine_invariants import check_engine
from sandfork.sdk import Sandbox

pytestmark = pytest.mark.vm


def _sleeping_vm(engine: EngineProcess, sandbox: Sandbox) -> None:
    """The sandbox is listed as hibernated and no QEMU process runs it."""
    assert Sandbox.get(sandbox.id, engine.client()).status == "hibernated"
    with pytest.raises(LookupError):
        engine.sandbox_pid(sandbox.id)
    assert engine.client().request("GET", "/snapshots")["snapshots"] == []  # not a snapshot


def test_hibernated_sandbox_wakes_on_use_with_its_state(own_engine: EngineProcess) -> None:
    client = own_engine.client()
    sandbox = Sandbox.create(client=client)
    try:
        context = sandbox.create_code_context()
        context.run_code("import numpy as np\nkept = np.arange(1_000_000)")
        sandbox.filesystem.write("/root/kept.txt", "on disk")
        running_pids = set(own_engine.sandbox_pids())
        sandbox.hibernate()
        assert sandbox.status == "hibernated"
        _sleeping_vm(own_engine, sandbox)
        assert len(own_engine.sandbox_pids()) == len(running_pids) - 1  # its VM is gone
        sandbox.hibernate()  # idempotent
        sandbox.renew_lease(600)  # whoever holds a sleeper keeps holding it

        # Any use wakes it: here a cell, through the same context.
        assert context.run_code("int(kept.sum())").text == str(sum(range(1_000_000)))
        assert sandbox.refresh().status == "running"
        assert sandbox.filesystem.read_text("/root/kept.txt") == "on disk"

        # wake() without a request; a snapshot of a sleeper wakes it too.
        sandbox.hibernate()
        sandbox.wake()
        assert sandbox.status == "running"
        sandbox.wake()  # idempotent
        sandbox.hibernate()
        snapshot_id = sandbox.snapshot("after sleep")
        restored = Sandbox.create(from_snapshot=snapshot_id, client=client)
        assert restored.create_code_context().run_code("int(kept[-1])").text == "999999"
        restored.kill()
    finally:
        sandbox.kill()


def test_a_sleeper_survives_an_engine_restart_and_a_kill_leaves_nothing(
    own_engine: EngineProcess,
) -> None:
    sandbox = Sandbox.create(client=own_engine.client())
    sandbox.create_code_context().run_code("slept = 'through a restart'")
    sandbox.hibernate()
    own_engine.stop(signal.SIGKILL)
    own_engine.start()
    sandbox.client = own_engine.client()
    _sleeping_vm(own_engine, sandbox)
    assert sandbox.create_code_context().run_code("slept").text == "'through a restart'"
    sandbox.hibernate()
    sandbox.kill()  # a sleeper killed: its capture goes too
    check_engine(own_engine, {})
    assert not list((own_engine.home / "snapshots").iterdir())
