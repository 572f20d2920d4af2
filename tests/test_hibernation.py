"""Hibernate and wake: a sandbox's VM stopped and its memory freed, its state kept under its id.

Real VMs: the capture is taken like a snapshot's, the VM goes, and the next request to the
sandbox (or ``wake``) resumes it from the capture; an engine killed while a sandbox sleeps
wakes it all the same, and nothing of a killed sleeper is left. (An engine killed between
the capture and the stop: ``test_crash_safety``'s ``hibernate.captured``.) A hibernation
waits for the work running in its sandbox, or refuses past its wait; requests that come
meanwhile wait behind it and wake the sandbox.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from conftest import EngineProcess
from engine_invariants import check_engine
from sandfork.sdk import Sandbox
from test_channels import _execute, _replies, _url

pytestmark = [pytest.mark.vm, pytest.mark.portable]


def _sleeping_vm(engine: EngineProcess, sandbox: Sandbox) -> None:
    """The sandbox is listed as hibernated and no QEMU process runs it."""
    assert Sandbox.get(sandbox.id, engine.client()).status == "hibernated"
    assert engine.sandbox_gone(sandbox.id)
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
        snapshot_id = sandbox.snapshot("after sleep").id
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


# -- hibernation and the work running in the sandbox -------------------------------------------

CELL = """\
import os, time
print('started', flush=True)
open('/root/started-{n}', 'w').close()
while not os.path.exists('/root/go-{n}'):
    time.sleep(0.05)
open('/root/done-{n}', 'w').write('done')
'finished'
"""


@pytest.fixture
def hibernating(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, template: None
) -> Iterator[tuple[EngineProcess, str]]:
    """An engine of the test's own, whose hibernations wait ``request.param`` seconds for the
    work running in their sandbox (3600: as long as the test may need; 0: refuse at once),
    and a sandbox of it."""
    engine = EngineProcess(
        tmp_path_factory.mktemp("sandfork-hibernate"),
        f"--EngineConfig.hibernate_wait={request.param}",
    )
    engine.start()
    sandbox_id = _create(engine)
    yield engine, sandbox_id
    _api(engine, "DELETE", f"/sandboxes/{sandbox_id}")
    engine.close()


def _api(engine: EngineProcess, method: str, path: str, **kwargs: Any) -> requests.Response:
    return requests.request(
        method, f"{engine.url}/v1{path}", headers=engine.auth, timeout=900, **kwargs
    )


def _create(engine: EngineProcess) -> str:
    created = _api(engine, "POST", "/sandboxes", json={})
    assert created.status_code == 201, created.text
    sandbox_id: str = created.json()["id"]
    return sandbox_id


def _wait_for_file(engine: EngineProcess, sandbox_id: str, path: str) -> None:
    """Poll the sandbox's file ``path`` through the API until it exists."""
    while (
        _api(engine, "GET", f"/sandboxes/{sandbox_id}/fs/stat", params={"path": path}).status_code
        == 404
    ):
        time.sleep(0.05)


def _wait_for_log(engine: EngineProcess, text: str, count: int, unless: Any) -> bool:
    """Wait until the engine's log has ``text`` ``count`` times; False if ``unless()`` came
    true first."""
    log = engine.home / "engine.log"
    while log.read_text(errors="replace").count(text) < count:
        if unless():
            return False
        time.sleep(0.05)
    return True


async def _running_cell(
    engine: EngineProcess, sandbox_id: str, n: int
) -> asyncio.Task[requests.Response]:
    """A ``run_code`` of :data:`CELL` ``n``, once the cell runs (its file is there)."""
    run_path = f"/sandboxes/{sandbox_id}/repl/sessions/default/run"
    cell = asyncio.create_task(
        asyncio.to_thread(_api, engine, "POST", run_path, json={"code": CELL.format(n=n)})
    )
    await asyncio.to_thread(_wait_for_file, engine, sandbox_id, f"/root/started-{n}")
    return cell


@pytest.mark.asyncio
@pytest.mark.parametrize("hibernating", [3600], indirect=True)
async def test_a_hibernation_waits_for_a_running_cell_and_later_requests_wake_the_sandbox(
    hibernating: tuple[EngineProcess, str],
) -> None:
    engine, sandbox_id = hibernating
    other = _api(engine, "POST", f"/sandboxes/{sandbox_id}/repl/sessions", json={"isolated": True})
    # A kernel channel to a second context, opened before: it is how the test lets the
    # cell finish while the hibernation holds every API request back.
    url = _url(engine, sandbox_id, other.json()["id"])
    ws = await websocket_connect(HTTPRequest(url, headers=engine.auth))
    cell = await _running_cell(engine, sandbox_id, 1)
    hibernation = asyncio.create_task(
        asyncio.to_thread(_api, engine, "POST", f"/sandboxes/{sandbox_id}/hibernate")
    )
    waits = f"sandbox {sandbox_id}: its hibernation waits (1 operation running)"
    pending = await asyncio.to_thread(_wait_for_log, engine, waits, 1, hibernation.done)
    assert pending, f"the hibernation did not wait for the cell: {hibernation.result().text}"
    # Requests meanwhile wait behind the hibernation, then wake the sandbox.
    later = asyncio.create_task(
        asyncio.to_thread(
            _api,
            engine,
            "POST",
            f"/sandboxes/{sandbox_id}/exec",
            json={"cmd": "cat /root/done-1"},
        )
    )
    snapshot = asyncio.create_task(
        asyncio.to_thread(_api, engine, "POST", f"/sandboxes/{sandbox_id}/snapshots", json={})
    )
    held = f"sandbox {sandbox_id}: a request waits for its hibernation to end"
    assert await asyncio.to_thread(_wait_for_log, engine, held, 2, lambda: False)
    go = _execute("open('/root/go-1', 'w').close()")
    await ws.write_message(json.dumps(go))
    await _replies(ws, go["header"]["msg_id"])

    ran = await cell
    assert ran.status_code == 200, ran.text
    assert ran.json()["results"][0]["data"] == "'finished'" and ran.json()["error"] is None
    slept = await hibernation
    assert slept.status_code == 200 and slept.json()["status"] == "hibernated", slept.text
    after = await later
    assert after.status_code == 200 and after.json()["stdout"] == "done", after.text
    snapped = await snapshot
    assert snapped.status_code == 201, snapped.text
    assert _api(engine, "GET", f"/sandboxes/{sandbox_id}").json()["status"] == "running"

    # The ledger has the cell's real result, and a resume replays it.
    events = _api(engine, "GET", f"/sandboxes/{sandbox_id}/ledger").json()["events"]
    calls = [e for e in events if e["type"] == "sandbox.run_code"]
    assert len(calls) == 1 and "failed" not in calls[0]["result"], calls
    assert _api(engine, "POST", f"/sandboxes/{sandbox_id}/checkpoints", json={}).status_code == 201
    resumed = _api(engine, "POST", f"/sandboxes/{sandbox_id}/resume", json={}).json()
    try:
        replayed = [e for e in resumed["replay"] if e["kind"] == "run_code"]
        assert replayed[0]["result"]["results"][0]["data"] == "'finished'", replayed
    finally:
        _api(engine, "DELETE", f"/sandboxes/{resumed['sandbox']['id']}")


@pytest.mark.asyncio
@pytest.mark.parametrize("hibernating", [0], indirect=True)
async def test_a_hibernation_is_refused_while_a_call_or_a_notebook_cell_runs(
    hibernating: tuple[EngineProcess, str],
) -> None:
    engine, sandbox_id = hibernating
    hibernate = f"/sandboxes/{sandbox_id}/hibernate"
    # An API call running: refused, and the call gets its result.
    cell = await _running_cell(engine, sandbox_id, 1)
    refused = _api(engine, "POST", hibernate)
    assert refused.status_code == 409, refused.text
    assert "busy: 1 operation running" in refused.json()["error"]
    _api(engine, "PUT", f"/sandboxes/{sandbox_id}/fs", params={"path": "/root/go-1"}, data=b"")
    assert (await cell).json()["results"][0]["data"] == "'finished'"

    # A notebook's cell through the kernel channels: its kernel says busy.
    ws = await websocket_connect(HTTPRequest(_url(engine, sandbox_id), headers=engine.auth))
    notebook_cell = _execute(CELL.format(n=2))
    await ws.write_message(json.dumps(notebook_cell))
    while True:  # its first output: the kernel is busy with it
        frame = json.loads(await ws.read_message() or "null")
        if frame["header"]["msg_type"] == "stream":
            break
    refused = _api(engine, "POST", hibernate)
    assert refused.status_code == 409, refused.text
    assert "busy: the kernel of code context default is running code" in refused.json()["error"]
    assert _api(engine, "GET", f"/sandboxes/{sandbox_id}").json()["status"] == "running"
    _api(engine, "PUT", f"/sandboxes/{sandbox_id}/fs", params={"path": "/root/go-2"}, data=b"")
    await _replies(ws, notebook_cell["header"]["msg_id"])
    slept = _api(engine, "POST", hibernate)
    assert slept.status_code == 200 and slept.json()["status"] == "hibernated", slept.text
