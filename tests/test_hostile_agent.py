# ruff: noqa: F811  (a test takes the fixture imported from test_hostile_input as an argument)
"""Hostile guest agents: guest code runs as root and can write frames on the agent's port.

Whatever comes back, the engine neither fails (a 502 "invalid reply", never a 500) nor keeps
more than its bounds (the ledger row of a forged 40 MB stdout stays small), and the link goes
on after any frame (the next request is answered). A real guest takes the port over from
inside; forged replies to chosen requests come from a relay on the link of a real engine and
VM (``agent_mitm``). Rich outputs of ordinary cells are bounded the same way.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from agent_mitm import AgentInTheMiddle, reply, result
from conftest import EngineProcess
from hostile_cases import BAD_FRAMES, FORGED_REPLIES, MIB
from test_hostile_input import sandbox, send  # noqa: F401  (sandbox: a fixture)

pytestmark = [pytest.mark.vm, pytest.mark.any_backend]

MAX_OUTPUT = MIB  # the engine's default max_output_bytes


@pytest.fixture(scope="module")
def relayed(tmp_path_factory: pytest.TempPathFactory, template: None) -> Iterator[Any]:
    """An engine of the module's own, and a sandbox whose agent link runs through a relay."""
    engine = EngineProcess(tmp_path_factory.mktemp("sandfork-relayed"))
    engine.start()
    sandbox_id = engine.client().request("POST", "/sandboxes", json={})["id"]
    relay = AgentInTheMiddle(engine, sandbox_id)
    relay.start()
    yield engine, sandbox_id, relay
    engine.client().request("DELETE", f"/sandboxes/{sandbox_id}")
    relay.close()
    engine.close()


def _exec(engine: EngineProcess, sandbox_id: str, cmd: str) -> requests.Response:
    return requests.post(
        f"{engine.url}/v1/sandboxes/{sandbox_id}/exec",
        json={"cmd": cmd},
        headers=engine.auth,
        timeout=120,
    )


def _assert_alive(engine: EngineProcess, sandbox_id: str) -> None:
    answer = _exec(engine, sandbox_id, "echo alive")
    assert answer.status_code == 200, answer.text[:500]
    assert answer.json()["stdout"] == "alive\n"
    info = engine.get(f"/v1/sandboxes/{sandbox_id}").json()
    assert info["status"] == "running" and info["error"] is None, info


def _ledger_sizes(engine: EngineProcess, sandbox_id: str) -> list[int]:
    """The size of every ledger row of the sandbox, as the engine's database stores it."""
    with sqlite3.connect(f"file:{engine.home / 'engine.sqlite'}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT length(request) + length(result) FROM ledger WHERE sandbox_id = ?",
            (sandbox_id,),
        ).fetchall()
    return [size for (size,) in rows]


@pytest.mark.parametrize("name", list(FORGED_REPLIES))
def test_a_forged_reply_is_a_clear_502(relayed: Any, name: str) -> None:
    engine, sandbox_id, relay = relayed
    case = FORGED_REPLIES[name]
    relay.forge(case.op, reply(case.reply))
    response = send(engine, case.request, sandbox_id)
    assert response.status_code == case.request.status, response.text[:500]
    message = response.json()["error"]
    assert case.request.message in message, message
    assert "the guest agent" in message and len(message) < 2000, message
    _assert_alive(engine, sandbox_id)


@pytest.mark.parametrize("name", list(BAD_FRAMES))
def test_the_link_survives_a_bad_frame(relayed: Any, name: str) -> None:
    engine, sandbox_id, relay = relayed
    relay.inject(BAD_FRAMES[name])
    _assert_alive(engine, sandbox_id)


def _peak_memory(engine: EngineProcess) -> int:
    """The engine process's peak resident memory so far (VmHWM), in bytes."""
    assert engine.process is not None
    status = Path(f"/proc/{engine.process.pid}/status").read_text()
    return (
        int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])
        * 1024
    )


def test_a_line_past_the_frame_limit_is_skipped_and_the_link_goes_on(relayed: Any) -> None:
    engine, sandbox_id, relay = relayed
    peak = _peak_memory(engine)
    relay.inject(b"[" * (300 * MIB) + b"\n")
    _assert_alive(engine, sandbox_id)
    # Skipped as it came: the engine held at most the link's limit of it (64 MiB), not 300.
    assert _peak_memory(engine) - peak < 100 * MIB, (_peak_memory(engine) - peak) // MIB
    # A reply too long for the link fails its request, and nothing else.
    relay.forge("exec", result({"stdout": "A" * (70 * MIB)}))
    response = _exec(engine, sandbox_id, "true")
    assert response.status_code == 502, response.text[:500]
    assert "longer than the link's limit" in response.json()["error"]
    _assert_alive(engine, sandbox_id)


def test_a_forged_40_mb_output_is_cut_and_the_ledger_stays_small(relayed: Any) -> None:
    engine, sandbox_id, relay = relayed
    forty = "A" * (40 * MIB)
    exec_result = {
        "exit_code": 0,
        "stdout": forty,
        "stderr": "E" * (20 * MIB),  # together within the link's limit of 64 MiB a frame
        "duration_ms": 1,
        "timed_out": False,
        "truncated": False,
    }
    for _ in range(3):  # repeated: each time bounded
        relay.forge("exec", result(exec_result))
        answer = _exec(engine, sandbox_id, "true")
        assert answer.status_code == 200, answer.text[:300]
        data = answer.json()
        assert data["truncated"] is True
        for stream in ("stdout", "stderr"):
            assert len(data[stream]) < MAX_OUTPUT + 100
            assert data[stream].endswith(" bytes omitted]\n"), data[stream][-100:]
    # A forged error message of 40 MB: the same error kind, its message cut.
    relay.forge("exec", reply({"ok": False, "error": {"type": "NotFound", "message": forty}}))
    failed = _exec(engine, sandbox_id, "true")
    assert failed.status_code == 404 and len(failed.text) < 10_000, len(failed.text)
    assert max(_ledger_sizes(engine, sandbox_id)) < 3 * MAX_OUTPUT


def test_forged_output_events_are_bounded_too(relayed: Any) -> None:
    engine, sandbox_id, relay = relayed

    def events(req_id: int) -> bytes:
        chunk = {"id": req_id, "event": "stdout", "data": "B" * MIB}
        lines = [json.dumps(chunk).encode() + b"\n"] * 20
        lines.append(json.dumps({"id": req_id, "event": "stdout", "data": 5}).encode() + b"\n")
        return b"".join(lines)

    relay.forge("exec", events)
    response = requests.post(
        f"{engine.url}/v1/sandboxes/{sandbox_id}/exec/stream",
        json={"cmd": "true"},
        headers=engine.auth,
        timeout=120,
    )
    body = response.text
    assert len(body) < 3 * MAX_OUTPUT, len(body)
    assert "bytes omitted]" in body and "event: error" in body and "invalid reply" in body
    _assert_alive(engine, sandbox_id)


HIJACK = r"""
import ctypes, os, select, sys

def ports():  # (pid, fd) of every open virtio port: the agent's
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/vport"):
                yield int(pid), int(fd)

agent, port = next(ports())
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(438, os.pidfd_open(agent), port, 0)  # pidfd_getfd: the agent's port, ours
assert fd >= 0, os.strerror(ctypes.get_errno())
data = memoryview(open(sys.argv[1], "rb").read())
while data:  # the port is non-blocking (the agent's open file)
    select.select([], [fd], [])
    try:
        data = data[os.write(fd, data):]
    except BlockingIOError:
        pass
print("written")
"""


@pytest.mark.vm_only  # takes the VM's serial port over (a container's agent has a socket)
def test_a_guest_that_takes_the_agent_port_over_cannot_break_the_link(
    engine: EngineProcess,
) -> None:
    """Root in the guest writes a too-deep line and garbage on the agent's own port (its file
    descriptor, taken with pidfd_getfd), then its command's real reply follows."""
    client = engine.client()
    sandbox_id = client.request("POST", "/sandboxes", json={})["id"]
    try:
        frames = BAD_FRAMES["nested-arrays"] + BAD_FRAMES["not-json"] + BAD_FRAMES["id-bool"]
        files = f"{engine.url}/v1/sandboxes/{sandbox_id}/fs"
        for path, data in (("/root/hijack.py", HIJACK.encode()), ("/root/frames", frames)):
            put = requests.put(
                files, params={"path": path}, data=data, headers=engine.auth, timeout=60
            )
            assert put.status_code == 200, put.text
        hijacked = _exec(engine, sandbox_id, "python3 /root/hijack.py /root/frames")
        assert hijacked.status_code == 200, hijacked.text[:500]
        assert hijacked.json()["stdout"] == "written\n", hijacked.json()
        _assert_alive(engine, sandbox_id)
    finally:
        client.request("DELETE", f"/sandboxes/{sandbox_id}")


def _run(engine: EngineProcess, sandbox_id: str, code: str) -> requests.Response:
    return requests.post(
        f"{engine.url}/v1/sandboxes/{sandbox_id}/repl/sessions/default/run",
        json={"code": code, "timeout_seconds": 600},
        headers=engine.auth,
        timeout=900,
    )


@pytest.mark.parametrize(
    "code",
    [
        "from IPython.display import display\n"
        "display({'image/png': 'A' * 40_000_000}, raw=True)\n"
        "display({'text/plain': 'after'}, raw=True)",
        "from IPython.display import HTML, display\n"
        "for i in range(3000):\n"
        "    display(HTML('<b>' + 'x' * 1200 + '</b>'))",
        "raise ValueError('v' * 5_000_000)",
        "import sys\nfor _ in range(20):\n    sys.stdout.write('o' * 1_000_000)",
    ],
    ids=["display-40mb", "display-html-3000", "error-5mb", "print-20mb"],
)
def test_rich_outputs_are_counted_against_the_output_budget(
    engine: EngineProcess, sandbox: str, code: str
) -> None:
    response = _run(engine, sandbox, code)
    assert response.status_code == 200, response.text[:500]
    assert len(response.content) < 3 * MAX_OUTPUT, len(response.content)
    data = response.json()
    markers = [r for r in data["results"] if "bytes omitted]" in r["data"]]
    error = data["error"] or {"value": "", "traceback": []}
    if code.startswith("raise"):
        assert "bytes omitted]" in error["value"], error["value"][-200:]
    elif "stdout" in code:
        assert data["stdout"].endswith(" bytes omitted]\n")
    else:
        assert len(markers) == 1 and markers[0]["type"] == "text/plain", data["results"][-3:]
        assert sum(len(r["data"]) for r in data["results"]) <= MAX_OUTPUT
    if "after" in code:  # what fits after the one that did not is kept
        assert data["results"][0]["data"] == "after", data["results"]
    assert max(_ledger_sizes(engine, sandbox)) < 3 * MAX_OUTPUT
    small = _run(
        engine, sandbox, "from IPython.display import display as d; d({'a/b': 'c'}, raw=True)"
    )
    assert small.json()["results"] == [{"type": "a/b", "data": "c", "is_main_result": False}]
