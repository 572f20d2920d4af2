"""The engine's WebSocket kernel channels and the REST interrupt/restart of a code context."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from conftest import EngineProcess
from sandfork.sdk import Sandbox

pytestmark = [pytest.mark.asyncio, pytest.mark.any_backend]


@pytest.fixture(scope="module")
def sandbox(engine: EngineProcess) -> Iterator[Sandbox]:
    with Sandbox.create(client=engine.client()) as sandbox:
        yield sandbox


def _url(engine: EngineProcess, sandbox_id: str, context: str = "default") -> str:
    base = engine.url.replace("http://", "ws://")
    return f"{base}/v1/sandboxes/{sandbox_id}/repl/sessions/{context}/channels"


async def _connect(engine: EngineProcess, sandbox_id: str) -> WebSocketClientConnection:
    request = HTTPRequest(_url(engine, sandbox_id), headers=engine.auth)
    return await websocket_connect(request)


def _message(channel: str, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": msg_type,
        "username": "test",
        "session": uuid.uuid4().hex,
        "date": "2026-01-01T00:00:00+00:00",
        "version": "5.3",
    }
    return {
        "channel": channel,
        "header": header,
        "parent_header": {},
        "metadata": {},
        "content": content,
        "buffers": [],
    }


async def _replies(ws: WebSocketClientConnection, msg_id: str) -> list[dict[str, Any]]:
    """Every frame answering ``msg_id``, until its reply and the kernel's idle status."""
    frames: list[dict[str, Any]] = []
    replied = idle = False
    while not (replied and idle):
        raw = await ws.read_message()
        assert raw is not None, "the channel closed"
        frame = json.loads(raw)
        if frame["parent_header"].get("msg_id") != msg_id:
            continue
        frames.append(frame)
        kind = frame["header"]["msg_type"]
        replied = replied or kind.endswith("_reply")
        idle = idle or (kind == "status" and frame["content"]["execution_state"] == "idle")
    return frames


def _execute(code: str) -> dict[str, Any]:
    return _message("shell", "execute_request", {"code": code, "silent": False})


@pytest.mark.vm
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "nope"}])
async def test_channels_need_the_api_key(
    engine: EngineProcess, sandbox: Sandbox, headers: dict[str, str]
) -> None:
    with pytest.raises(HTTPClientError) as raised:
        await websocket_connect(HTTPRequest(_url(engine, sandbox.id), headers=headers))
    assert raised.value.code == 401
    plain = _url(engine, sandbox.id).replace("ws://", "http://")
    response = requests.get(plain, headers=headers, timeout=30)
    assert response.status_code == 401
    assert "API key" in response.json()["error"]


async def test_channels_of_an_unknown_sandbox_are_refused(engine: EngineProcess) -> None:
    with pytest.raises(HTTPClientError) as raised:
        await _connect(engine, "sbx_0000000000000000")
    assert raised.value.code == 404


@pytest.mark.vm
async def test_kernel_info_comes_from_the_guest_kernel(
    engine: EngineProcess, sandbox: Sandbox
) -> None:
    ws = await _connect(engine, sandbox.id)
    request = _message("shell", "kernel_info_request", {})
    ws.write_message(json.dumps(request))
    frames = await _replies(ws, request["header"]["msg_id"])
    reply = next(f for f in frames if f["header"]["msg_type"] == "kernel_info_reply")
    assert reply["channel"] == "shell"
    assert reply["content"]["status"] == "ok"
    assert reply["content"]["language_info"]["name"] == "python"
    assert reply["content"]["language_info"]["version"].startswith("3.11")
    assert reply["content"]["implementation"] == "ipython"
    ws.close()


@pytest.mark.vm
async def test_execute_streams_results_and_errors_to_every_socket(
    engine: EngineProcess, sandbox: Sandbox
) -> None:
    first, second = await _connect(engine, sandbox.id), await _connect(engine, sandbox.id)
    request = _execute("print('hi'); 6 * 7")
    first.write_message(json.dumps(request))
    for ws in (first, second):
        frames = await _replies(ws, request["header"]["msg_id"])
        kinds = {(f["channel"], f["header"]["msg_type"]): f["content"] for f in frames}
        assert kinds[("iopub", "stream")]["text"] == "hi\n"
        assert kinds[("iopub", "execute_result")]["data"]["text/plain"] == "42"
        assert kinds[("shell", "execute_reply")]["status"] == "ok"
    failing = _execute("1 / 0")
    second.write_message(json.dumps(failing))
    frames = await _replies(second, failing["header"]["msg_id"])
    error = next(f for f in frames if f["header"]["msg_type"] == "error")
    assert error["content"]["ename"] == "ZeroDivisionError"
    first.close()
    second.close()


@pytest.mark.vm
async def test_rest_interrupt_stops_running_code(engine: EngineProcess, sandbox: Sandbox) -> None:
    ws = await _connect(engine, sandbox.id)
    request = _execute("import time\nprint('running')\nfor _ in range(600): time.sleep(0.1)")
    ws.write_message(json.dumps(request))
    while True:  # wait until the cell's code runs
        frame = json.loads(await ws.read_message() or "{}")
        kind, parent = frame["header"]["msg_type"], frame["parent_header"].get("msg_id")
        if kind == "stream" and parent == request["header"]["msg_id"]:
            break
    path = f"/v1/sandboxes/{sandbox.id}/repl/sessions/default/interrupt"
    assert requests.post(engine.url + path, headers=engine.auth, timeout=30).status_code == 204
    frames = await _replies(ws, request["header"]["msg_id"])
    error = next(f for f in frames if f["header"]["msg_type"] == "error")
    assert error["content"]["ename"] == "KeyboardInterrupt"
    ws.close()


@pytest.mark.vm
async def test_rest_restart_gives_a_fresh_kernel(engine: EngineProcess) -> None:
    with Sandbox.create(client=engine.client()) as sandbox:
        context = sandbox.create_code_context()
        context.run_code("marker = 1")
        path = f"/v1/sandboxes/{sandbox.id}/repl/sessions/default/restart"
        assert requests.post(engine.url + path, headers=engine.auth, timeout=600).status_code == 204
        assert context.run_code("marker").error.name == "NameError"  # type: ignore[union-attr]
        unauthorized = requests.post(engine.url + path, timeout=60)
        assert unauthorized.status_code == 401


@pytest.mark.vm
async def test_a_dead_sandbox_is_reported_and_closes_the_channel(engine: EngineProcess) -> None:
    sandbox = Sandbox.create(client=engine.client())
    ws = await _connect(engine, sandbox.id)
    sandbox.kill()
    frames = []
    while (raw := await ws.read_message()) is not None:
        frames.append(json.loads(raw))
    assert frames[-1]["header"]["msg_type"] == "status"
    assert frames[-1]["content"]["execution_state"] == "dead"
