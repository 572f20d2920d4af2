"""Leases (issue 9): a sandbox started for a kernel goes when its kernel is gone, however the
kernel ended, and ``sandfork lab`` stopped with Ctrl-C leaves nothing running. Real engine,
real kernels, real VMs; the grace period is made short through the kernel's lease."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from jupyter_client.manager import KernelManager

from conftest import EngineProcess
from kernel_client import kernel_sandbox
from sandfork.engine.leases import Leases
from sandfork.proxy_kernel.state import state_file
from sandfork.sdk import Client, NotFoundError, Sandbox
from sandfork.sdk.errors import BadRequestError

pytestmark = pytest.mark.portable  # runs on every backend (the suite's container pass too)

LEASE = 5.0  # the shortest lease the engine grants: renewed every 1.7 s
# A kernel's lease while a test checks that it is kept: renewed every 6 s, so that a kernel
# process the loaded machine leaves unscheduled for seconds still renews in time.
LONG_LEASE = 18.0
HANG = 300.0  # how long a wait below may take before it counts as hung (not a speed bound)


def _wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` until it is true (returned) or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s: {what}"
        time.sleep(0.1)
    return value


def _status(client: Client, sandbox_id: str) -> str:
    """The sandbox's status, or ``gone`` once the engine has forgotten it."""
    try:
        return Sandbox.get(sandbox_id, client).status
    except NotFoundError:
        return "gone"


def _lease_ran_out(engine: EngineProcess, sandbox_id: str) -> bool:
    """True once the engine's watch loop killed the sandbox for its lease (its log says)."""
    log = (engine.home / "engine.log").read_text(errors="replace")
    return f"sandbox {sandbox_id}: its lease ran out" in log


def _renewals(engine: EngineProcess, sandbox_id: str, since: int = 0) -> int:
    """Lease renewals of the sandbox the engine answered, in its log after byte ``since``."""
    with (engine.home / "engine.log").open("rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    return text.count(f"200 POST /v1/sandboxes/{sandbox_id}/lease ")


def _log_size(engine: EngineProcess) -> int:
    return (engine.home / "engine.log").stat().st_size


def _ended_by_its_lease(engine: EngineProcess, client: Client, sandbox_id: str) -> None:
    """Wait until the watch loop has killed the sandbox for its lease, and check it is gone."""
    _wait_for(lambda: _lease_ran_out(engine, sandbox_id), HANG, "the lease ran out")
    _wait_for(lambda: _status(client, sandbox_id) == "gone", HANG, "the sandbox is gone")
    assert _no_qemu(engine, sandbox_id)


def _no_qemu(engine: EngineProcess, sandbox_id: str) -> bool:
    try:
        engine.sandbox_pid(sandbox_id)
    except LookupError:
        return True
    return False


@contextlib.contextmanager
def _kernel(engine: EngineProcess, lease: float, *args: str) -> Iterator[tuple[KernelManager, str]]:
    """A Sandfork kernel on ``engine`` with a lease of ``lease`` seconds, and the id of the
    sandbox it attached to; shut down (if still running) on exit."""
    env = {**os.environ, "SANDFORK_API": engine.url, "SANDFORK_API_KEY": engine.api_key}
    env["SANDFORK_LEASE_SECONDS"] = str(lease)
    km = KernelManager(kernel_name="sandfork")
    km.start_kernel(env=env, extra_arguments=list(args))
    try:
        yield km, str(kernel_sandbox(km, HANG)["sandbox_id"])
    finally:
        km.shutdown_kernel(now=True)


def _pid(km: KernelManager) -> int:
    process = km.provisioner.process  # type: ignore[union-attr]
    return int(process.pid)


def _kernel_exited(km: KernelManager) -> bool:
    return km.provisioner.process.poll() is not None  # type: ignore[union-attr]


def test_lease_deadlines_do_not_count_time_the_engine_was_stalled() -> None:
    now = [100.0]
    leases = Leases(tick=1.0, clock=lambda: now[0])
    leases.hold("a", 5)
    leases.hold("b", 10)
    assert leases.expired() == []
    now[0] += 4  # late ticks: no renewal could be read meanwhile
    assert leases.expired() == [] and leases.remaining("a") == pytest.approx(3)
    now[0] += 1
    leases.hold("b", 10)  # renewed
    now[0] += 1
    assert leases.expired() == []
    now[0] += 1
    for _ in range(3):  # ticks on time: the lease of a runs out
        now[0] += 1
        gone = leases.expired()
        if gone:
            break
    assert gone == ["a"] and leases.remaining("a") is None
    leases.drop("b")
    assert leases.remaining("b") is None


def test_a_renewed_lease_runs_a_full_period_from_its_renewal() -> None:
    """The rule, on the engine's own leases module with a clock the test moves one watch
    tick at a time."""
    now = [0.0]
    leases = Leases(tick=1.0, clock=lambda: now[0])
    leases.hold("a", LEASE)
    for _ in range(10):  # renewed a tick before it would run out, ten times over
        for _ in range(int(LEASE) - 1):
            now[0] += 1.0
            assert leases.expired() == []
        leases.hold("a", LEASE)
    assert leases.remaining("a") == pytest.approx(LEASE)
    for _ in range(int(LEASE) - 1):
        now[0] += 1.0
        assert leases.expired() == []
    now[0] += 1.0
    assert leases.expired() == ["a"] and len(leases) == 0


@pytest.mark.vm
def test_an_sdk_lease_that_is_not_renewed_ends_the_sandbox(engine: EngineProcess) -> None:
    client = engine.client()
    for bad in ({"lease_seconds": 1}, {"lease_seconds": 5000}, {"lease_seconds": "5"}):
        with pytest.raises(BadRequestError, match="lease_seconds"):
            client.request("POST", "/sandboxes", json=bad)
    with pytest.raises(BadRequestError, match="persistent"):
        client.request("POST", "/sandboxes", json={"persistent": True, "lease_seconds": 60})
    sandbox = Sandbox.create(lease_seconds=LEASE, client=client)
    try:
        assert sandbox.lease_seconds == LEASE
        renewed = time.monotonic()  # before the renewal: its period starts later than this
        sandbox.renew_lease()  # the same period again
        _ended_by_its_lease(engine, client, sandbox.id)
        assert time.monotonic() - renewed >= LEASE  # not before its time
        with pytest.raises(NotFoundError):
            sandbox.renew_lease()
    finally:
        with contextlib.suppress(NotFoundError):
            sandbox.kill()
    plain = Sandbox.create(client=client)  # no lease asked, none given
    try:
        assert plain.lease_seconds is None
        with pytest.raises(BadRequestError, match="no lease"):
            plain.renew_lease()
    finally:
        plain.kill()


@pytest.mark.vm
def test_a_ttl_that_runs_out_hibernates_a_sandbox_that_asked_for_it(
    engine: EngineProcess,
) -> None:
    """PandaStack's lifecycle with ``on_expiry: hibernate``: the sandbox's state is kept when
    its time to live runs out, and its next call wakes it."""
    client = engine.client()
    sandbox = Sandbox.create(client=client)
    try:
        context = sandbox.create_code_context()
        context.run_code("kept = 6 * 7")
        path = f"/sandboxes/{sandbox.id}/lifecycle"
        with pytest.raises(BadRequestError, match="on_expiry must be one of kill, hibernate"):
            client.request("PATCH", path, json={"on_expiry": "explode"})
        answer = client.request(
            "PATCH", path, json={"ttl_seconds": LEASE, "on_expiry": "hibernate"}
        )
        assert answer["on_expiry"] == "hibernate" and answer["ttl_seconds"] == LEASE
        deadline = time.monotonic() + 600  # a bound for a hang: the watch loop hibernates it
        while sandbox.refresh().status != "hibernated":
            assert time.monotonic() < deadline, sandbox.status
            time.sleep(0.2)
        assert context.run_code("kept").text == "42"  # woken, its memory as it was
        assert sandbox.refresh().status == "running"
        assert client.request("GET", path)["expires_in"] is None  # the lease ended with it
    finally:
        sandbox.kill()


@pytest.mark.vm
def test_a_sigkilled_kernel_loses_its_sandbox_a_persistent_one_keeps_it(
    engine: EngineProcess,
) -> None:
    client = engine.client()
    with (
        _kernel(engine, LEASE) as (km, sandbox_id),
        _kernel(engine, LEASE, "--persistent") as (kept_km, kept_id),
    ):
        assert Sandbox.get(sandbox_id, client).lease_seconds == LEASE
        assert Sandbox.get(kept_id, client).lease_seconds is None
        os.kill(_pid(kept_km), signal.SIGKILL)
        os.kill(_pid(km), signal.SIGKILL)
        _ended_by_its_lease(engine, client, sandbox_id)  # the lease, not the kernel, did it
        assert _status(client, kept_id) == "running"  # as long as a lease would have lasted
    Sandbox.get(kept_id, client).kill()


@pytest.mark.vm
def test_a_sigtermed_kernel_kills_its_sandbox_itself(engine: EngineProcess) -> None:
    client = engine.client()
    with _kernel(engine, 600) as (km, sandbox_id):  # the lease cannot be what ends it
        os.kill(_pid(km), signal.SIGTERM)
        _wait_for(lambda: _kernel_exited(km), HANG, "the kernel exited")
        assert _status(client, sandbox_id) == "gone"
        assert _no_qemu(engine, sandbox_id)
        assert not state_file(km.connection_file).exists()


@pytest.mark.vm
def test_a_sigterm_during_a_restart_leaves_the_sandbox_to_the_next_kernel(
    engine: EngineProcess,
) -> None:
    """jupyter_client sends SIGTERM to a kernel slow to restart: the sandbox must stay for
    the process started next on the connection file, which then holds the lease."""
    client = engine.client()
    with _kernel(engine, LONG_LEASE) as (km, sandbox_id):  # the next process's time to renew
        old = _pid(km)
        # Restart requested, then SIGTERM 0.5 s later (SIGKILL at 1 s): the guest kernel's
        # restart and the interrupt before it take longer than that.
        km.shutdown_wait_time = 1.0
        km.restart_kernel()  # a new process on the same connection file
        assert _pid(km) != old
        assert _status(client, sandbox_id) == "running"
        assert kernel_sandbox(km, HANG)["sandbox_id"] == sandbox_id
        since = _log_size(engine)  # the old process is gone: renewals from here are the new one's
        _wait_for(lambda: _renewals(engine, sandbox_id, since), HANG, "the new process renews")
        assert _status(client, sandbox_id) == "running"
        os.kill(_pid(km), signal.SIGKILL)
        client.request("POST", f"/sandboxes/{sandbox_id}/lease", json={"lease_seconds": LEASE})
        _ended_by_its_lease(engine, client, sandbox_id)


@pytest.mark.vm
def test_an_engine_restart_keeps_the_lease_of_a_running_kernel(own_engine: EngineProcess) -> None:
    with _kernel(own_engine, LONG_LEASE) as (km, sandbox_id):
        own_engine.stop()
        own_engine.args = ("--port", own_engine.url.rsplit(":", 1)[1])  # the kernel's URL
        since = _log_size(own_engine)
        own_engine.start()
        client = own_engine.client()
        assert Sandbox.get(sandbox_id, client).lease_seconds == LONG_LEASE  # stored, not lost
        # The kernel keeps renewing with the new engine, and the sandbox runs on.
        renewed_twice = lambda: _renewals(own_engine, sandbox_id, since) >= 2  # noqa: E731
        _wait_for(renewed_twice, HANG, "two renewals after the restart")
        assert _status(client, sandbox_id) == "running"
        os.kill(_pid(km), signal.SIGKILL)  # and the lease still ends it once it stops
        client.request("POST", f"/sandboxes/{sandbox_id}/lease", json={"lease_seconds": LEASE})
        _ended_by_its_lease(own_engine, client, sandbox_id)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kernel_pids(connection_file: str) -> list[int]:
    """Processes serving ``connection_file`` (the proxy kernel)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if connection_file.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
    return pids


@pytest.mark.vm
@pytest.mark.parametrize("signals", [[signal.SIGINT], [signal.SIGINT, signal.SIGTERM]])
def test_ctrl_c_on_sandfork_lab_leaves_nothing_running(
    engine: EngineProcess, tmp_path: Path, signals: list[int]
) -> None:
    """One stop request: JupyterLab shuts its kernels down. A second one at once (another
    signal: two SIGINTs would merge into one): JupyterLab is killed, and `sandfork lab` ends
    the kernels it left (each kills its own sandbox)."""
    port = _free_port()
    env = {**os.environ, "SANDFORK_API": engine.url, "SANDFORK_API_KEY": engine.api_key}
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    env["SANDFORK_LEASE_SECONDS"] = "600"  # only a clean shutdown can end the sandbox in time
    options = [
        f"--port={port}",
        "--IdentityProvider.token=secret",
        f"--ServerApp.root_dir={tmp_path}",
    ]
    log = tmp_path / "lab.log"
    lab = subprocess.Popen(
        [sys.executable, "-m", "sandfork", "lab", *options],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": "token secret"}
    client = engine.client()
    sandbox_id = ""
    try:

        def session() -> Any:
            assert lab.poll() is None, log.read_text()
            body = {"path": "a.ipynb", "type": "notebook", "kernel": {"name": "sandfork"}}
            with contextlib.suppress(requests.ConnectionError):
                return requests.post(f"{url}/api/sessions", json=body, headers=auth, timeout=60)
            return None

        created = _wait_for(session, HANG, "JupyterLab answered")
        assert created.status_code == 201, created.text
        kernel_id = created.json()["kernel"]["id"]

        def attached() -> Any:
            r = requests.get(f"{url}/sandfork/api/kernels/{kernel_id}", headers=auth, timeout=60)
            return r.json()["sandbox"]["id"] if r.status_code == 200 else None

        sandbox_id = _wait_for(attached, HANG, "the notebook's kernel attached")
        connection_file = str(tmp_path / "runtime" / f"kernel-{kernel_id}.json")
        assert _kernel_pids(connection_file), "no kernel process"
        for sig in signals:
            lab.send_signal(sig)
        lab.wait(90)
        if len(signals) == 2:
            assert "ended kernel" in log.read_text()
        assert _kernel_pids(connection_file) == [], log.read_text()
        assert _status(client, sandbox_id) == "gone", log.read_text()
        assert _no_qemu(engine, sandbox_id)
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait(30)
        if sandbox_id:
            with contextlib.suppress(NotFoundError):
                Sandbox.get(sandbox_id, client).kill()
