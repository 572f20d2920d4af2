"""Server push for the lineage panel: the engine's change feed (``GET /v1/changes``, a long
poll that answers when snapshots or sandboxes change, and only then), and the Jupyter server
turning it, and its kernels attaching, into ``urn:sandfork:lineage:v1`` events on Jupyter
Server's event bus, received here over its WebSocket as JupyterLab receives them."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
import requests

from conftest import EngineProcess
from jupyter_server_fixtures import (  # noqa: F401 (fixtures, found by name)
    attached,
    call,
    jp_server_config,
    kernels_shut_down_after_the_test,
    notebook,
    start_session,
)
from sandfork.sdk import Sandbox

pytestmark = pytest.mark.any_backend  # above the backend: runs once (on containers where they run)
LINEAGE = "urn:sandfork:lineage:v1"


def _changes(engine: EngineProcess, after: str | None = None, wait: float = 25) -> str:
    params: dict[str, Any] = {"wait": wait} | ({"after": after} if after else {})
    answer = engine.client().request("GET", "/changes", params=params, timeout=wait + 10)
    return str(answer["cursor"])


@pytest.mark.vm
def test_the_change_feed_answers_when_something_changes_and_only_then(
    own_engine: EngineProcess,
) -> None:
    engine = own_engine
    cursor = _changes(engine)
    started = time.monotonic()
    assert _changes(engine, cursor, wait=1) == cursor  # nothing changed: the wait ran out
    assert time.monotonic() - started >= 0.9

    answered: list[tuple[str, float]] = []
    waited_from = time.monotonic()
    waiter = threading.Thread(
        target=lambda: answered.append((_changes(engine, cursor, 50), time.monotonic()))
    )
    waiter.start()
    sandbox = Sandbox.create(client=engine.client())  # somebody else's change
    waiter.join(120)
    assert answered and answered[0][0] != cursor
    # Pushed as it happened (the sandbox is listed as it starts), not when the wait ran out.
    assert answered[0][1] - waited_from < 50
    try:
        cursor = _changes(engine)
        sandbox.renew_lease(300)  # renewals change nothing drawn: the feed stays put
        assert _changes(engine, cursor, wait=1) == cursor
        sandbox.hibernate()  # a status change moves it
        assert _changes(engine, cursor, wait=5) != cursor
        cursor = _changes(engine)
        snapshot_id = sandbox.snapshot("pushed").id  # wakes it and makes a snapshot
        assert _changes(engine, cursor, wait=5) != cursor
        assert snapshot_id
    finally:
        sandbox.kill()


def test_the_change_feed_checks_its_input(engine: EngineProcess) -> None:
    url = f"{engine.url}/v1/changes"
    assert requests.get(url, timeout=10).status_code == 401
    key = {"Authorization": f"Bearer {engine.api_key}"}
    for params, message in [({"wait": "61"}, "wait"), ({"wait": "soon"}, "wait")]:
        answer = requests.get(url, params=params, headers=key, timeout=10)
        assert answer.status_code == 400 and message in answer.json()["error"]
    answer = requests.get(url, params={"after": "x" * 65}, headers=key, timeout=10)
    assert answer.status_code == 400


async def _next_lineage_event(ws: Any, seconds: float) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        left = deadline - asyncio.get_running_loop().time()
        assert left > 0, "no lineage event was pushed"
        event = json.loads(await asyncio.wait_for(ws.read_message(), left))
        if event["schema_id"] == LINEAGE:
            return event  # type: ignore[no-any-return]


@pytest.mark.vm
async def test_the_server_pushes_lineage_events(
    engine: EngineProcess, jp_serverapp: Any, jp_ws_fetch: Any, jp_fetch: Any
) -> None:
    await jp_serverapp.extension_manager.start_all_extensions()  # as the server does once up
    ws = await jp_ws_fetch("api", "events", "subscribe")
    try:
        # A change made elsewhere (another process, through the SDK) reaches the browser.
        sandbox = await asyncio.to_thread(Sandbox.create, client=engine.client())
        try:
            event = await _next_lineage_event(ws, 60)
            assert event["reason"] == "engine"  # the bus sends {schema_id, **data}
        finally:
            await asyncio.to_thread(sandbox.kill)
        # A kernel of this server attaching to its sandbox: the panel can place it now.
        kernel_id = await start_session(jp_fetch, "pushed.ipynb", "sandfork")
        while (await _next_lineage_event(ws, 180))["reason"] != "kernel":
            pass
        assert (await attached(jp_fetch, kernel_id))["sandbox"]["status"] == "running"
    finally:
        ws.close()


@pytest.mark.vm
async def test_a_branch_notebook_is_announced_once_its_session_names_it(
    engine: EngineProcess, jp_serverapp: Any, jp_ws_fetch: Any, jp_fetch: Any
) -> None:
    """The branch's kernel attaches before its session joins it to the notebook: an event
    for the attach alone would leave a panel that reloaded then without the notebook (and
    its Fork button) until something else changed."""
    await jp_serverapp.extension_manager.start_all_extensions()
    kernel_id = await start_session(jp_fetch, "trunk.ipynb", "sandfork")
    await attached(jp_fetch, kernel_id)
    ws = await jp_ws_fetch("api", "events", "subscribe")
    try:
        body = {"kernel_id": kernel_id, "path": "trunk.ipynb", "notebook": notebook("x = 1")}
        status, fork = await call(jp_fetch, "POST", "sandfork/api/forks", body)
        assert status == 201, fork
        [branch] = fork["branches"]
        while (await _next_lineage_event(ws, 180))["reason"] != "session":
            pass
        status, listing = await call(jp_fetch, "GET", "sandfork/api/snapshots")
        nodes = {n["id"]: n for n in listing["sandboxes"]}
        assert nodes[branch["sandbox_id"]]["notebook_path"] == branch["path"]
        assert nodes[branch["sandbox_id"]]["kernel_id"] == branch["kernel_id"]
    finally:
        ws.close()
