"""The egress channel from inside real guests: a flood of connections costs the host no
process and a bounded number of engine fds; the host's own addresses (made here, on a veth
pair into a network namespace of the test's own, checked local first) are unreachable; port 0
is refused; no host text reaches the guest; a restored guest's old connections are closed.

Traffic goes only to loopback and to the addresses the tests make on this machine.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import EngineProcess
from egress_probes import SECRET, SecretServer, probe, proxied
from netns import veth_namespace
from sandfork.sdk import Sandbox

pytestmark = pytest.mark.portable  # runs on every backend (the suite's container pass too)

vm = pytest.mark.vm


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, template: None) -> Iterator[EngineProcess]:
    """An engine of this module (a test restarts it)."""
    proc = EngineProcess(tmp_path_factory.mktemp("sandfork-egress"))
    proc.start()
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def sandbox(engine: EngineProcess) -> Iterator[Sandbox]:
    sb = Sandbox.create(client=engine.client())
    yield sb
    engine.client().request("DELETE", f"/sandboxes/{sb.id}")  # the engine may have restarted


CAP = 64  # the engine's default egress_max_streams_per_sandbox

# Runs in the guest: opens N connections to the proxy of its environment and holds them,
# writing its state to /tmp/flood.json: once all N are attempted, and again once at most CAP
# are still waiting for an answer (the others got one, or were closed).
FLOOD = r"""
import json, os, resource, selectors, socket, sys
from urllib.parse import urlsplit
n, cap = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (n + 256, n + 256))
proxy = urlsplit(os.environ["HTTP_PROXY"])
held, errors = [], []
for _ in range(n):
    try:
        held.append(socket.create_connection((proxy.hostname, proxy.port), timeout=60))
    except OSError as e:
        errors.append(f"{type(e).__name__}: {e}")
def report(**more):
    with open("/tmp/flood.tmp", "w") as f:
        json.dump({"pid": os.getpid(), "connected": len(held), "errors": errors[:5], **more}, f)
    os.replace("/tmp/flood.tmp", "/tmp/flood.json")
report()
answers, waiting = {}, set(held)
selector = selectors.DefaultSelector()
for s in held:
    selector.register(s, selectors.EVENT_READ)
while len(waiting) > cap:
    for key, _ in selector.select():
        try:
            data = key.fileobj.recv(65536)
        except OSError as e:
            data = f"{type(e).__name__}".encode()
        answers[key.fileobj] = answers.get(key.fileobj, b"") + data
        if not data or b"\r\n\r\n" in answers[key.fileobj]:
            selector.unregister(key.fileobj)
            waiting.discard(key.fileobj)
texts = sorted({a.decode(errors="replace").split("\r\n\r\n")[-1].strip() for a in answers.values()})
heads = sorted({a.split(b"\r\n")[0].decode(errors="replace") for a in answers.values()})
report(settled=True, waiting=len(waiting), answered=len(answers), heads=heads, texts=texts)
import time
while True:
    time.sleep(3600)  # hold every socket until killed
"""


@pytest.fixture
def current(sandbox: Sandbox, engine: EngineProcess) -> Sandbox:
    """The module's sandbox, through the engine as it is now (tests restart it)."""
    return Sandbox.get(sandbox.id, client=engine.client())


def _wait_for_file(sandbox: Sandbox, path: str, done: Any) -> dict[str, Any]:
    """Poll a JSON file in the guest until ``done(content)``; fail with it after a while."""
    deadline = time.monotonic() + 600
    content: dict[str, Any] = {}
    while time.monotonic() < deadline:
        result = sandbox.exec(f"cat {path} 2>/dev/null", timeout_seconds=60)
        if result.stdout.strip():
            content = json.loads(result.stdout)
            if done(content):
                return content
        time.sleep(0.2)
    pytest.fail(f"{path} in the guest never got there: {content}")


def _helpers(engine: EngineProcess) -> list[str]:
    """Processes other than the engine and its VMs whose command line names the engine's
    state or RAM folder: what the host runs for the engine's sandboxes (a guestfwd's socat
    was one per connection, detached from QEMU by a double fork and its own session)."""
    assert engine.process is not None
    ours = {engine.process.pid, *engine.sandbox_pids()}
    marks = (str(engine.home).encode(), str(engine.ram_dir).encode())
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) not in ours:
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if any(mark in cmdline for mark in marks):
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace")[:200])
    return found


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@vm
def test_a_flood_of_connections_costs_the_host_nothing(
    current: Sandbox, engine: EngineProcess
) -> None:
    """2,000 connections from a guest: no host process, engine fds within the cap, and
    another sandbox is served normally meanwhile."""
    sandbox = current
    other = Sandbox.create(client=engine.client())
    try:
        assert engine.process is not None
        engine_pid = engine.process.pid
        before = _fds(engine_pid)
        sandbox.filesystem.write("/tmp/flood.py", FLOOD)
        sandbox.exec("rm -f /tmp/flood.json; python3 /tmp/flood.py 2000 64 >/tmp/flood.log 2>&1 &")
        state = _wait_for_file(sandbox, "/tmp/flood.json", lambda s: True)
        try:
            # All 2,000 are connected and held: measure now.
            helpers = _helpers(engine)
            assert helpers == [], f"the guest's connections made {len(helpers)} host processes"
            assert _fds(engine_pid) <= before + CAP + 16
            assert other.create_code_context().run_code("6 * 7").text == "42"
            assert state["connected"] == 2000 and state["errors"] == [], state
            state = _wait_for_file(sandbox, "/tmp/flood.json", lambda s: "settled" in s)
            assert _helpers(engine) == [] and _fds(engine_pid) <= before + CAP + 16
            assert state["waiting"] <= CAP and state["answered"] >= 2000 - CAP, state
            assert state["heads"] == ["HTTP/1.1 503 Service Unavailable"], state
            assert state["texts"] == [
                "sandfork egress proxy: too many connections through the proxy "
                f"(at most {CAP} at once per sandbox)"
            ], state
        finally:
            sandbox.exec(f"kill {state['pid']}")
    finally:
        other.kill()


@vm
def test_the_hosts_own_address_is_unreachable(current: Sandbox) -> None:
    """A listener on 0.0.0.0 is not reached through the host's addresses: one that passes
    every range rule and one of TEST-NET-2, both made here (and checked to be local)."""
    with veth_namespace(["192.88.99.7", "198.51.100.7"]):
        server = SecretServer("0.0.0.0")
        try:
            port = server.port
            with socket.create_connection(("192.88.99.7", port), timeout=30):
                pass  # the listener really is there, on this host's address
            answers = probe(
                current,
                [
                    proxied(f"192.88.99.7:{port}"),
                    proxied(f"http://192.88.99.7:{port}/own"),
                    proxied(f"[::ffff:192.88.99.7]:{port}"),
                    proxied(f"198.51.100.7:{port}"),
                ],
            )
            for answer in answers:
                assert answer["out"].startswith("HTTP/1.1 403 Forbidden"), answer
                assert SECRET not in answer["out"]
            assert "192.88.99.7 is an address of this host" in answers[0]["out"]
            assert "documentation address (TEST-NET-2)" in answers[3]["out"]
            assert server.requests == []
        finally:
            server.close()


# Runs in the guest: asks the proxy about a refused destination every 20 ms and writes each
# new kind of answer to the console (the host reads it in console.log while the engine is
# away), until it has seen an answer that is not the 403 and then the 403 again.
CONSOLE_PROBE = r"""
import os, socket, time, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
seen, last = [], None
while True:
    try:
        with socket.create_connection((proxy.hostname, proxy.port), timeout=30) as s:
            s.sendall(b"CONNECT 10.1.2.3:443 HTTP/1.1\r\n\r\n")
            s.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
    except OSError as e:
        answer = f"{type(e).__name__}: {e}".encode()
    kind = answer.split(b"\r\n")[0]
    if not answer:  # cut as the engine stopped (its streams close): not an answer, ask again
        time.sleep(0.02)
        continue
    if kind != last:
        with open("/dev/ttyS0", "wb") as console:
            console.write(b"sandfork-probe: %r\n" % answer)
        seen.append(kind)
        last = kind
    if len(seen) >= 3:
        break
    time.sleep(0.02)
"""


@vm
@pytest.mark.vm_only  # reads what the guest writes to the VM's serial console
def test_port_zero_and_no_host_text_reach_the_guest(
    current: Sandbox, engine: EngineProcess
) -> None:
    sandbox = current
    (zero, plain_zero) = probe(sandbox, [proxied("10.1.2.3:0"), proxied("http://10.1.2.3:0/")])
    assert zero["out"].startswith("HTTP/1.1 400 Bad Request"), zero
    assert "port 0 is not a destination" in zero["out"]
    assert plain_zero["out"].startswith("HTTP/1.1 400 Bad Request"), plain_zero
    # While the engine is away the guest's proxy answers itself, with no host text.
    console = engine.home / "sandboxes" / sandbox.id / "console.log"
    sandbox.filesystem.write("/tmp/console_probe.py", CONSOLE_PROBE)
    sandbox.exec("python3 /tmp/console_probe.py >/dev/null 2>&1 &")
    lines = _console_probes(console, 1)
    assert "403 Forbidden" in lines[0], lines
    engine.stop()
    try:
        lines = _console_probes(console, 2)  # the answer while no engine is there
    finally:
        engine.start()
    lines = _console_probes(console, 3)
    assert "503 Service Unavailable" in lines[1] and "not connected" in lines[1], lines
    assert "403 Forbidden" in lines[2], lines
    pids = [str(p) for p in (engine.sandbox_pid(sandbox.id), *engine.sandbox_pids())]
    for line in lines:
        assert "socat" not in line and not any(f"[{pid}]" in line for pid in pids), line


def _console_probes(console: Path, count: int) -> list[str]:
    """The first ``count`` lines the console probe wrote (waiting for them)."""
    deadline = time.monotonic() + 600
    while True:
        text = console.read_text(errors="replace") if console.exists() else ""
        lines = [line for line in text.splitlines() if line.startswith("sandfork-probe: ")]
        if len(lines) >= count:
            return lines
        assert time.monotonic() < deadline, f"the console probe wrote only {lines}"
        time.sleep(0.05)


# Runs in the guest: one connection to the proxy with its request head unfinished, held; it
# writes /tmp/held when it is open and /tmp/closed once the proxy closes it.
HOLD = r"""
import os, socket, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
s = socket.create_connection((proxy.hostname, proxy.port))
s.sendall(b"CONNECT 10.1.2.3:443 HTTP/1.1\r\n")
open("/tmp/held", "w").close()
try:
    while s.recv(65536):
        pass
except OSError:
    pass
open("/tmp/closed", "w").close()
"""


@vm
def test_a_restored_guest_closes_the_old_sessions_connections(
    current: Sandbox, engine: EngineProcess
) -> None:
    sandbox = current
    sandbox.exec("rm -f /tmp/held /tmp/closed")
    sandbox.filesystem.write("/tmp/hold.py", HOLD)
    sandbox.exec("python3 /tmp/hold.py >/dev/null 2>&1 &")
    _wait_for_exec(sandbox, "test -e /tmp/held")
    child = Sandbox.create(from_snapshot=sandbox.snapshot("held"), client=engine.client())
    try:
        _wait_for_exec(child, "test -e /tmp/closed")  # its connection was of the old session
        (answer,) = probe(child, [proxied("10.1.2.3:443")])  # and a new one works
        assert answer["out"].startswith("HTTP/1.1 403 Forbidden"), answer
    finally:
        child.kill()


def _wait_for_exec(sandbox: Sandbox, command: str) -> None:
    deadline = time.monotonic() + 600
    while sandbox.exec(command, timeout_seconds=60).exit_code != 0:
        assert time.monotonic() < deadline, f"{command!r} never succeeded in the guest"
        time.sleep(0.1)
