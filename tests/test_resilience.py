"""Failures stay contained: a guest out of memory, a VM that dies, an engine that restarts."""

from __future__ import annotations

import os
import signal
import time

import pytest
import requests

from conftest import EngineProcess
from sandfork.sdk import ConflictError, Sandbox

pytestmark = pytest.mark.vm


def test_guest_out_of_memory_is_contained(engine: EngineProcess) -> None:
    client = engine.client()
    small = Sandbox.create(memory_mb=512, client=client)
    other = Sandbox.create(client=client)
    try:
        ctx = small.create_code_context()
        ctx.run_code("x = 1")
        hog = ctx.run_code("blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))")
        assert hog.error is not None
        assert hog.error.name in ("KernelDied", "MemoryError"), hog.error
        # the sandbox itself carries on: its agent answers and a kernel comes back
        assert small.exec("echo ok").stdout == "ok\n"
        assert small.create_code_context().run_code("1 + 1").text == "2"
        # the other sandbox and the engine never noticed
        assert other.create_code_context().run_code("'fine'").text == "'fine'"
        assert engine.get("/v1/health").status_code == 200
    finally:
        small.kill()
        other.kill()


def test_vm_that_dies_is_reported_dead(engine: EngineProcess) -> None:
    client = engine.client()
    sb = Sandbox.create(client=client)
    try:
        sb.exec("true")
        os.kill(engine.sandbox_pid(sb.id), signal.SIGKILL)
        deadline = time.monotonic() + 120  # the watch loop looks every second; a hang past this
        while sb.refresh().status != "dead" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sb.status == "dead"
        assert not (engine.ram_dir / f"{sb.id}.qmp").exists()  # released before it is dead
        with pytest.raises(ConflictError, match="not running"):
            sb.exec("true")
        info = client.request("GET", f"/sandboxes/{sb.id}")
        assert "signal 9" in info["error"]
    finally:
        sb.kill()


def test_sandboxes_survive_an_engine_restart(own_engine: EngineProcess) -> None:
    sb = Sandbox.create(client=own_engine.client())
    sb.create_code_context().run_code("answer = 42")
    doomed = Sandbox.create(client=own_engine.client())
    own_engine.stop(signal.SIGKILL)
    assert len(own_engine.sandbox_pids()) == 2  # the VMs outlive the engine
    os.kill(own_engine.sandbox_pid(doomed.id), signal.SIGKILL)

    own_engine.start()
    client = own_engine.client()
    adopted = Sandbox.get(sb.id, client=client)
    assert adopted.status == "running"
    assert adopted.create_code_context().run_code("answer").text == "42"
    assert adopted.exec("echo back").stdout == "back\n"

    dead = Sandbox.get(doomed.id, client=client)
    assert dead.status == "dead"
    response = requests.get(
        f"{own_engine.url}/v1/sandboxes/{doomed.id}", headers=own_engine.auth, timeout=10
    )
    assert "gone" in response.json()["error"]
    adopted.kill()
    dead.kill()
    assert own_engine.sandbox_pids() == []
