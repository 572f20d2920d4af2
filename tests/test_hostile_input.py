"""Hostile input and hostile guests: every bad request gets a 4xx with a clear JSON message
(never a 500, never a hang), and neither the engine nor another sandbox is harmed.

One sandbox serves the table of bad requests; the fork bomb runs in a second one, killed
afterwards; the agent is stopped in a third, in an engine of its own with a short
``agent_timeout``.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from conftest import EngineProcess
from hostile_cases import CASES, MIB, Case
from sandfork.backends.agent_link import AgentErrorReply, AgentTimeout
from sandfork.engine.db import SandboxRecord
from sandfork.engine.errors import ApiError, Unresponsive
from sandfork.engine.live import UNRESPONSIVE, agent_failures
from sandfork.protocol import SandboxStatus

pytestmark = pytest.mark.portable  # runs on every backend (the suite's container pass too)

AGENT_TIMEOUT = 30.0  # the engine's default agent_timeout


@pytest.fixture(scope="module")
def sandbox(engine: EngineProcess) -> Iterator[str]:
    """The module's sandbox, killed at the end."""
    sandbox_id = engine.client().request("POST", "/sandboxes", json={})["id"]
    yield sandbox_id
    engine.client().request("DELETE", f"/sandboxes/{sandbox_id}")


def send(engine: EngineProcess, case: Case, sandbox_id: str) -> requests.Response:
    """Send ``case``, with the API key unless the case is about the key (``{key}`` in its
    headers or path is the engine's key)."""
    headers = {} if case.status == 401 else dict(engine.auth)
    headers.update({k: v.replace("{key}", engine.api_key) for k, v in case.headers.items()})
    body = case.body
    if isinstance(body, dict | list):
        body = json.dumps(body)
    elif isinstance(body, tuple):
        body = iter(body)  # no length known: sent chunked
    path = case.path.replace("{sbx}", sandbox_id).replace("{key}", engine.api_key)
    return requests.request(case.method, engine.url + path, data=body, headers=headers, timeout=120)


@pytest.mark.vm
@pytest.mark.parametrize("name", list(CASES))
def test_bad_request_gets_a_clear_4xx(engine: EngineProcess, sandbox: str, name: str) -> None:
    case = CASES[name]
    response = send(engine, case, sandbox)
    assert response.status_code == case.status, response.text[:500]
    assert response.headers["Content-Type"].startswith("application/json")
    message = response.json()["error"]
    assert isinstance(message, str) and message
    assert case.message in message, message


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 100
    assert len(
        {(c.method, c.path, str(c.body), tuple(c.headers.items())) for c in CASES.values()}
    ) == len(CASES)


def test_a_200_mb_metadata_body_is_refused(engine: EngineProcess) -> None:
    body = b'{"metadata": {"k": "' + b"x" * (200 * MIB) + b'"}}'
    response = requests.post(
        f"{engine.url}/v1/sandboxes", data=body, headers=engine.auth, timeout=600
    )
    assert response.status_code == 413, response.text[:300]
    assert "limit" in response.json()["error"]
    listed = engine.get("/v1/sandboxes")
    assert len(listed.content) < MIB


@pytest.mark.parametrize(("key", "status", "message"), [(True, 413, "limit"), (False, 401, "key")])
def test_a_body_declared_too_large_to_read_is_refused_before_it_is_sent(
    engine: EngineProcess, key: bool, status: int, message: str
) -> None:
    """Refused at once, and the client told the connection closes (it is not drained)."""
    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("POST", "/v1/sandboxes")
        conn.putheader("Authorization", engine.auth["Authorization"] if key else "Bearer no")
        conn.putheader("Content-Length", str(2**40))
        conn.endheaders()
        response = conn.getresponse()
        assert response.status == status and response.getheader("Connection") == "close"
        assert message in json.loads(response.read())["error"]
    finally:
        conn.close()


@pytest.mark.vm
def test_big_files_and_devices_leave_the_vm_running(engine: EngineProcess, sandbox: str) -> None:
    client = engine.client()
    client.request("POST", f"/sandboxes/{sandbox}/exec", json={"cmd": "truncate -s 400M /root/big"})
    base = f"{engine.url}/v1/sandboxes/{sandbox}/fs"
    for _ in range(2):
        big = requests.get(base, params={"path": "/root/big"}, headers=engine.auth, timeout=60)
        assert big.status_code == 413 and "in ranges" in big.json()["error"], big.text
        zero = requests.get(base, params={"path": "/dev/zero"}, headers=engine.auth, timeout=60)
        assert zero.status_code == 400 and "not a regular file" in zero.json()["error"]
    ranged = {"path": "/root/big", "offset": str(300 * MIB), "length": "4096"}
    part = requests.get(base, params=ranged, headers=engine.auth, timeout=60)
    assert part.status_code == 200 and part.content == b"\0" * 4096
    zeros = requests.get(
        base, params={"path": "/dev/zero", "length": "1000"}, headers=engine.auth, timeout=60
    )
    assert zeros.content == b"\0" * 1000
    _assert_answers(engine, sandbox)


def _answered_in_time(
    engine: EngineProcess, url: str, body: dict[str, Any], agent_timeout: float = AGENT_TIMEOUT
) -> str:
    """POST ``body`` and return the 504's message: the call's deadline (its timeout, if any,
    plus the engine's ``agent_timeout``) ended it, the guest never answering. Not before
    that deadline; how long after it is the machine's load, not checked."""
    started = time.monotonic()
    response = requests.post(url, json=body, headers=engine.auth, timeout=600)
    elapsed = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert elapsed >= body.get("timeout_seconds", 0), elapsed
    message: str = response.json()["error"]
    return message


@pytest.fixture
def quick_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """An engine whose agent requests time out after 5 s."""
    proc = EngineProcess(
        tmp_path_factory.mktemp("sandfork-quick"), "--EngineConfig.agent_timeout=5"
    )
    proc.start()
    yield proc
    proc.close()


@pytest.mark.vm
def test_a_fork_bomb_gets_an_answer_within_the_deadline(
    engine: EngineProcess, sandbox: str
) -> None:
    client = engine.client()
    bomb = client.request("POST", "/sandboxes", json={})["id"]
    try:
        client.request(
            "POST",
            f"/sandboxes/{bomb}/exec",
            json={"cmd": "nohup sh -c 'f() { f | f & }; f' >/dev/null 2>&1 &"},
        )
        message = _answered_in_time(
            engine,
            f"{engine.url}/v1/sandboxes/{bomb}/repl/sessions/default/run",
            {"code": "import time; time.sleep(600)", "timeout_seconds": 5},
        )
        assert "timeout" in message or "unresponsive" in message, message
        info = engine.get(f"/v1/sandboxes/{bomb}").json()
        assert info["status"] == "running"
        if "unresponsive" in message:
            assert info["error"].startswith("unresponsive"), info
    finally:
        client.request("DELETE", f"/sandboxes/{bomb}")
    _assert_answers(engine, sandbox)


@pytest.mark.vm
def test_a_stopped_agent_is_reported_unresponsive_within_the_deadline(
    quick_engine: EngineProcess, engine: EngineProcess, sandbox: str
) -> None:
    client = quick_engine.client()
    victim = client.request("POST", "/sandboxes", json={})["id"]
    base = f"{quick_engine.url}/v1/sandboxes/{victim}"
    try:
        # The exec's shell is the agent's child: it stops the agent before the reply.
        stop = {"cmd": "kill -STOP $PPID", "timeout_seconds": 5}
        assert "unresponsive" in _answered_in_time(quick_engine, f"{base}/exec", stop, 5)
        run = {"code": "6 * 7", "timeout_seconds": 5}
        url = f"{base}/repl/sessions/default/run"
        assert "unresponsive" in _answered_in_time(quick_engine, url, run, 5)
        info = quick_engine.get(f"/v1/sandboxes/{victim}").json()
        assert info["status"] == "running" and info["error"].startswith("unresponsive"), info
        stat = quick_engine.get(f"/v1/sandboxes/{victim}/fs/stat", params={"path": "/"})
        assert stat.status_code == 504 and "unresponsive" in stat.json()["error"]
    finally:
        client.request("DELETE", f"/sandboxes/{victim}")
    _assert_answers(engine, sandbox)


@pytest.mark.vm
def test_the_engine_and_the_sandbox_are_unharmed(engine: EngineProcess, sandbox: str) -> None:
    assert engine.get("/v1/health").json()["status"] == "ok"
    assert engine.get(f"/v1/sandboxes/{sandbox}").json()["error"] is None
    _assert_answers(engine, sandbox)


def _assert_answers(engine: EngineProcess, sandbox_id: str) -> None:
    result = engine.client().request(
        "POST", f"/sandboxes/{sandbox_id}/repl/sessions/default/run", json={"code": "6 * 7"}
    )
    assert result["results"][0]["data"] == "42", result


def test_the_unresponsive_mark_goes_when_the_agent_answers_again() -> None:
    record = SandboxRecord(
        id="sbx_0123456789abcdef", template="t", status=SandboxStatus.RUNNING, cpu=1, memory_mb=256
    )
    with pytest.raises(Unresponsive), agent_failures(record):
        raise AgentTimeout("ping", 5)
    assert record.error is not None and record.error.startswith(UNRESPONSIVE)
    with pytest.raises(ApiError), agent_failures(record):
        raise AgentErrorReply("NotFound", "no such file")  # an answer, if a failure
    assert record.error is None
    record.error = "its VM exited"  # any other error stays
    with agent_failures(record):
        pass
    assert record.error == "its VM exited"
