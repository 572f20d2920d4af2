"""Container shims started ahead of need (issue 20: 0.1 s of every create, restore and fork).

The next sandbox's shim already runs when its request comes; it takes its config from stdin,
works in and logs to its sandbox's folder, and a waiting shim never outlives its engine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import EngineProcess
from sandfork.backends.container.shim_pool import ShimPool, shims
from sandfork.backends.container.stdio import ShimConfig
from sandfork.backends.processes import start_time
from sandfork.sdk import Sandbox


def _gone(pid: int, bound: float = 60.0) -> bool:
    """Whether ``pid`` ends (or is a zombie) within ``bound``: a bound for a hang."""
    deadline = time.monotonic() + bound
    while start_time(pid) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_shim_takes_its_config_from_stdin_and_works_in_its_sandboxs_folder(
    tmp_path: Path,
) -> None:
    key = f"test-{uuid.uuid4().hex[:8]}"
    pool = ShimPool(key, tmp_path / "waiting.log")
    folder = tmp_path / "sbx_0123456789abcdef"
    folder.mkdir()
    try:
        # Neither launch nor restore: the shim records why it did not start, in its folder.
        process = pool.start(ShimConfig(dir=str(folder), cgroup="none", sockets={}))
        assert process.wait(timeout=120) == 1
        reason = json.loads((folder / "exit.json").read_text())["reason"]
        assert reason.startswith("the sandbox did not start"), reason
        assert (folder / "shim.log").exists()
        waiting = pool.waiting_pid()
        assert waiting is not None and waiting != process.pid
        assert (waiting, None) in list(shims(key))
    finally:
        pool.close()
    assert waiting is not None and _gone(waiting)


def test_a_waiting_shim_ends_with_its_engine_however_it_ends(tmp_path: Path) -> None:
    key = f"test-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "sbx_0123456789abcdef"
    folder.mkdir()
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from sandfork.backends.container.shim_pool import ShimPool\n"
            "from sandfork.backends.container.stdio import ShimConfig\n"
            f"pool = ShimPool({key!r}, Path({str(tmp_path / 'w.log')!r}))\n"
            f"pool.start(ShimConfig(dir={str(folder)!r}, cgroup='none', sockets={{}}))\n"
            "print(pool.waiting_pid(), flush=True)\n"
            "time.sleep(3600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    waiting = int(owner.stdout.readline())
    assert start_time(waiting) is not None
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert _gone(waiting), "a waiting shim outlived the engine that started it"
    assert waiting not in [pid for pid, _ in shims(key)]


@pytest.mark.container
def test_the_next_sandboxs_shim_runs_before_it_is_asked_for(
    container_engine: EngineProcess,
) -> None:
    client = container_engine.client()
    first = Sandbox.create(client=client)
    try:
        asked = _ticks_now()
        second = Sandbox.create(client=client)
        try:
            record = json.loads(
                (container_engine.home / "sandboxes" / second.id / "shim.json").read_text()
            )
            assert record["shim_start"] <= asked, "the shim was started for the request"
            assert record["shim"] == container_engine.sandbox_pid(second.id)
            assert second.create_code_context().run_code("6 * 7").text == "42"
        finally:
            second.kill()
    finally:
        first.kill()


def _ticks_now() -> int:
    """Clock ticks since boot, the unit of a process's start time."""
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return int(uptime * os.sysconf("SC_CLK_TCK"))


@pytest.mark.container
def test_criu_check_dumps_and_restores_a_sandbox_through_a_waiting_shim() -> None:
    from sandfork.backends.container.backend import unavailable

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"container sandboxes cannot run here: {reason}")
    done = subprocess.run(
        [sys.executable, "-m", "sandfork", "criu", "check"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "works here" in done.stdout
