"""A sandbox cannot reach the host: restricted user network plus the engine's egress proxy.

Only loopback traffic, and traffic to addresses a test makes on a veth pair into a network
namespace of its own (checked to be local with ``ip route get`` first), is ever sent: the
proxy's refusals happen before any connection, and the one destination that is reached (the
secret server, from a sandbox with host access) listens on the host's 127.0.0.1, which is what
the guest's 10.0.2.2 is.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest

from conftest import EngineProcess
from netns import veth_namespace
from origin import OriginServer
from sandfork.backends.vm.accel import Accelerator
from sandfork.backends.vm.qemu import MACHINE_REVISION, Network, VmLayout, VmSpec, command_line
from sandfork.engine.egress import EgressProxy
from sandfork.engine.egress_policy import exempting, refusal
from sandfork.sdk import Client, Sandbox, SandforkError

SECRET = "the-host-secret-4471"
vm = pytest.mark.vm


class SecretServer(OriginServer):
    """An HTTP server of the host's (loopback unless told) answering :data:`SECRET`."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        super().__init__(lambda path: SECRET.encode(), address)


@pytest.fixture(scope="module")
def secret_server() -> Iterator[SecretServer]:
    server = SecretServer()
    yield server
    server.close()


# -- the policy and the proxy, in this process ---------------------------------------------

REFUSED = [
    "127.0.0.1",
    "127.8.9.10",
    "0.0.0.0",
    "10.0.2.2",
    "10.1.2.3",
    "172.16.0.1",
    "172.31.255.254",
    "192.168.1.1",
    "100.64.0.1",
    "169.254.169.254",
    "224.0.0.251",
    "255.255.255.255",
    "::1",
    "::",
    "::ffff:127.0.0.1",
    "::ffff:192.168.0.1",
    "::127.0.0.1",
    "64:ff9b::a00:1",
    "fd12:3456::1",
    "fe80::1",
    "fe80::1%1",
    "ff02::1",
]
# Special-purpose ranges the policy once let through, each with what the refusal calls it.
SPECIAL = {
    "192.0.2.1": "documentation address (TEST-NET-1)",
    "198.51.100.7": "documentation address (TEST-NET-2)",
    "203.0.113.9": "documentation address (TEST-NET-3)",
    "198.18.0.1": "benchmarking address",
    "192.0.0.8": "IETF protocol assignment address",
    "2001:db8::1": "documentation address",
    "3fff::1": "documentation address",
    "2001:2::1": "benchmarking address",
    "100::1": "discard-only address",
    "2001:10::1": "ORCHID address",
    "fec0::1": "site-local address",
    "ff0e::1": "multicast address",
    "224.0.0.251": "multicast address",
    # 6to4 and Teredo embed IPv4: judged by it (Teredo's client is the low 32 bits, inverted).
    "2002:7f00:1::1": "embeds the 6to4 IPv4 address 127.0.0.1, and 127.0.0.1 is a loopback",
    "2002:c0a8:101::1": "embeds the 6to4 IPv4 address 192.168.1.1",
    "2001:0:7f00:1::1": "embeds the Teredo server 127.0.0.1",
    "2001:0:808:808:0:0:3f57:fefe": "embeds the Teredo client 192.168.1.1",
    "2001:0:808:808:0:0:f7f7:f7f7": "a Teredo address",  # both public: Teredo is not global
}
ALLOWED = [
    "93.184.216.34",
    "8.8.8.8",
    "172.32.0.1",
    "2606:4700:4700::1111",
    "::ffff:8.8.4.4",
    "2002:808:808::1",  # 6to4 of a public address
    "192.88.99.7",  # globally reachable for the rules (the host-address test uses it)
]


@pytest.mark.parametrize("address", REFUSED)
def test_policy_refuses_host_and_private_addresses(address: str) -> None:
    reason = refusal(address)
    assert reason is not None and reason.endswith("address"), reason


@pytest.mark.parametrize("address", sorted(SPECIAL))
def test_policy_refuses_every_special_purpose_range(address: str) -> None:
    reason = refusal(address)
    assert reason is not None and SPECIAL[address] in reason, reason


def test_policy_refuses_this_hosts_own_addresses() -> None:
    """Every address of every interface of this machine, whatever its range."""
    import psutil

    mine = {
        entry.address.split("%")[0]
        for entries in psutil.net_if_addrs().values()
        for entry in entries
        if entry.family in (socket.AF_INET, socket.AF_INET6)
    }
    assert len(mine) > 2, mine  # more than loopback
    for address in mine:
        assert refusal(address) is not None, address


def test_an_address_added_while_running_is_refused_at_once() -> None:
    """An address that passes every range rule, made a host address (and removed) here."""
    assert refusal("192.88.99.7") is None
    with veth_namespace(["192.88.99.7"]) as veth:
        reason = refusal("192.88.99.7")
        assert reason == f"192.88.99.7 is an address of this host (interface {veth.host_end})"
        assert refusal("::ffff:192.88.99.7") is not None
        assert "6to4 IPv4 address 192.88.99.7" in str(refusal("2002:c058:6307::1"))
    assert refusal("192.88.99.7") is None


@pytest.mark.parametrize("address", ALLOWED)
def test_policy_allows_public_addresses(address: str) -> None:
    assert refusal(address) is None


def test_operator_can_exempt_a_private_network() -> None:
    policy = exempting(["10.1.2.0/24", "fd00:1::/64"])
    assert policy(ip_address("10.1.2.3")) is None and policy(ip_address("fd00:1::5")) is None
    for refused in ("10.1.3.1", "127.0.0.1", "fd00:2::1"):
        assert policy(ip_address(refused)) == refusal(refused)
    with pytest.raises(ValueError):
        exempting(["not-a-network"])


def test_netdev_is_restricted_unless_host_access() -> None:
    assert Network().netdev() == "user,id=net0,restrict=on"
    assert Network(host_access=True).netdev() == "user,id=net0"


def test_the_vm_has_an_egress_port_and_no_guestfwd(tmp_path: Path) -> None:
    layout = VmLayout(tmp_path / "sbx-1", tmp_path / "disk.qcow2", tmp_path / "ram")
    spec = VmSpec(tmp_path / "k", tmp_path / "i", "", 256, 1, Accelerator("tcg", "test"))
    line = " ".join(command_line(spec, layout, Network(), tmp_path / "image"))
    assert f"socket,id=egress,path={tmp_path}/ram/sbx-1.egress,server=on,wait=off" in line
    assert "virtserialport,chardev=egress,name=sandfork.egress" in line
    assert "guestfwd" not in line and "socat" not in line
    assert MACHINE_REVISION >= 4  # boot captures of the old devices are not restored


async def _ask(socket_path: Path, request: bytes) -> bytes:
    """Send ``request`` to the proxy and read until it closes."""
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    writer.write(request)
    await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


def _through_proxy(tmp_path: Path, requests: list[bytes], **kwargs: Any) -> list[bytes]:
    """Each request's answer from the proxy, serving connections of a Unix socket here."""

    async def main() -> list[bytes]:
        proxy = EgressProxy(**kwargs)
        path = tmp_path / "proxy.sock"
        server = await asyncio.start_unix_server(proxy.serve, str(path))
        try:
            return [await _ask(path, r) for r in requests]
        finally:
            server.close()

    return asyncio.run(main())


def test_proxy_refuses_before_connecting(tmp_path: Path, secret_server: SecretServer) -> None:
    port = secret_server.port
    answers = _through_proxy(
        tmp_path,
        [
            f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode(),
            f"GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode(),
            f"GET http://localhost:{port}/x HTTP/1.1\r\nHost: localhost\r\n\r\n".encode(),
            f"CONNECT [::ffff:127.0.0.1]:{port} HTTP/1.1\r\n\r\n".encode(),
            b"CONNECT 192.168.1.1:443 HTTP/1.1\r\n\r\n",
            b"GET http://10.1.2.3/ HTTP/1.1\r\nHost: 10.1.2.3\r\n\r\n",
        ],
    )
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n"), answer
        assert b"sandfork egress proxy: refused to connect" in answer
        assert SECRET.encode() not in answer
    assert b"loopback" in answers[0] and b"RFC 1918" in answers[4]
    assert secret_server.requests == []


def test_proxy_rejects_what_it_does_not_proxy(tmp_path: Path) -> None:
    answers = _through_proxy(
        tmp_path,
        [
            b"GET /relative HTTP/1.1\r\nHost: example.com\r\n\r\n",
            b"GET https://example.com/ HTTP/1.1\r\n\r\n",
            b"CONNECT example.com:notaport HTTP/1.1\r\n\r\n",
            b"nonsense\r\n\r\n",
            b"CONNECT 10.1.2.3:0 HTTP/1.1\r\n\r\n",
            b"GET http://10.1.2.3:0/ HTTP/1.1\r\n\r\n",
            b"CONNECT [::1:443 HTTP/1.1\r\n\r\n",
        ],
    )
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"HTTP/1.1 400 Bad Request"] * 7
    assert b"port 0 is not a destination" in answers[4] and b"port 0" in answers[5]


def test_proxy_relays_what_its_policy_allows(tmp_path: Path, secret_server: SecretServer) -> None:
    """The relay itself, with a policy that allows loopback (the real one never does)."""
    port = secret_server.port
    tunnelled = "GET /tunnel HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    plain, tunnel = _through_proxy(
        tmp_path,
        [
            f"GET http://127.0.0.1:{port}/plain?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Proxy-Connection: keep-alive\r\n\r\n".encode(),
            f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n{tunnelled}".encode(),
        ],
        policy=lambda ip: None,
    )
    assert plain.startswith(b"HTTP/1.0 200") and plain.endswith(SECRET.encode())
    assert tunnel.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.0 200")
    assert tunnel.endswith(SECRET.encode())
    assert secret_server.requests[-2:] == ["/plain?q=1", "/tunnel"]
    secret_server.requests.clear()


# -- real sandboxes ------------------------------------------------------------------------

# Runs in the guest: each probe is a direct fetch (no proxy) or raw bytes sent to the proxy.
PROBE = r"""
import json, os, socket, sys, time, urllib.parse, urllib.request
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
results = []
for kind, target in json.loads(sys.argv[1]):
    started = time.monotonic()
    try:
        if kind == "direct":
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            out = opener.open(target, timeout=5).read().decode()
        elif kind == "env":  # whatever the environment's proxy settings say
            out = urllib.request.urlopen(target, timeout=5).read().decode()
        else:
            with socket.create_connection((proxy.hostname, proxy.port), timeout=5) as s:
                s.sendall(target.encode())
                s.shutdown(socket.SHUT_WR)
                chunks = []
                while chunk := s.recv(65536):
                    chunks.append(chunk)
            out = b"".join(chunks).decode()
        results.append({"ok": True, "out": out})
    except Exception as e:
        results.append({"ok": False, "out": f"{type(e).__name__}: {e}"})
    results[-1]["seconds"] = time.monotonic() - started
print(json.dumps(results))
"""


def _probe(sandbox: Sandbox, probes: list[tuple[str, str]]) -> list[dict[str, Any]]:
    sandbox.filesystem.write("/tmp/probe.py", PROBE)
    result = sandbox.exec(f"python3 /tmp/probe.py '{json.dumps(probes)}'", timeout_seconds=120)
    assert result.exit_code == 0, result.stderr
    found: list[dict[str, Any]] = json.loads(result.stdout)
    return found


def _proxied(url_or_authority: str) -> tuple[str, str]:
    if url_or_authority.startswith("http://"):
        host = url_or_authority.split("/")[2]
        return ("proxy", f"GET {url_or_authority} HTTP/1.1\r\nHost: {host}\r\n\r\n")
    return ("proxy", f"CONNECT {url_or_authority} HTTP/1.1\r\nHost: {url_or_authority}\r\n\r\n")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, template: None) -> Iterator[EngineProcess]:
    """An engine of this module that accepts ``host_access``."""
    proc = EngineProcess(tmp_path_factory.mktemp("sandfork-net"), "--allow-host-access")
    proc.start()
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def client(engine: EngineProcess) -> Client:
    return engine.client()


@pytest.fixture(scope="module")
def sandbox(client: Client, engine: EngineProcess) -> Iterator[Sandbox]:
    sb = Sandbox.create(client=client)
    yield sb
    engine.client().request("DELETE", f"/sandboxes/{sb.id}")  # the engine may have restarted


def _host_access(client: Client, sandbox_id: str) -> bool:
    flag = client.request("GET", f"/sandboxes/{sandbox_id}")["host_access"]
    assert isinstance(flag, bool)
    return flag


@vm
def test_default_sandbox_cannot_reach_the_host(
    sandbox: Sandbox, client: Client, engine: EngineProcess, secret_server: SecretServer
) -> None:
    assert _host_access(client, sandbox.id) is False
    engine_port = int(engine.url.rsplit(":", 1)[1])
    port = secret_server.port
    direct = _probe(
        sandbox,
        [
            ("direct", f"http://10.0.2.2:{port}/direct"),
            ("direct", f"http://10.0.2.2:{engine_port}/v1/health"),
            ("env", f"http://10.0.2.2:{port}/env"),
        ],
    )
    for result in direct:
        assert not result["ok"] and "refused" in result["out"], result
        assert result["seconds"] < 3, result
    refused = _probe(
        sandbox,
        [
            _proxied(f"http://127.0.0.1:{port}/via-proxy"),
            _proxied(f"http://10.0.2.2:{port}/via-proxy"),
            _proxied(f"127.0.0.1:{engine_port}"),
            _proxied("192.168.1.1:443"),
            _proxied("http://10.1.2.3/"),
            _proxied(f"http://localhost:{port}/"),
        ],
    )
    for result in refused:
        assert result["ok"], result
        assert result["out"].startswith("HTTP/1.1 403 Forbidden"), result
        assert "sandfork egress proxy: refused to connect" in result["out"]
        assert SECRET not in result["out"]
    assert secret_server.requests == []


@vm
def test_exec_and_code_contexts_get_the_proxy(sandbox: Sandbox) -> None:
    proxy = "http://127.0.0.1:3128"
    env = sandbox.exec("env").stdout.splitlines()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert f"{name}={proxy}" in env
    assert "NO_PROXY=localhost,127.0.0.1,10.0.2.2" in env
    overridden = sandbox.exec("echo $HTTPS_PROXY", env={"HTTPS_PROXY": "http://mine:1"})
    assert overridden.stdout == "http://mine:1\n"
    code = "import os; print(os.environ['HTTPS_PROXY'], os.environ['no_proxy'])"
    out = sandbox.create_code_context().run_code(code)
    assert out.stdout == f"{proxy} localhost,127.0.0.1,10.0.2.2\n"


@vm
def test_host_access_is_opt_in_and_follows_forks(
    sandbox: Sandbox, client: Client, secret_server: SecretServer
) -> None:
    """Snapshots restore in either network mode; forks keep their parent's."""
    port = secret_server.port
    snapshot = sandbox.snapshot("restricted")
    opened = Sandbox.create(from_snapshot=snapshot, host_access=True, client=client)
    try:
        assert _host_access(client, opened.id) is True
        reached = _probe(
            opened,
            [("direct", f"http://10.0.2.2:{port}/open"), ("env", f"http://10.0.2.2:{port}/env")],
        )
        assert [r["out"] for r in reached] == [SECRET, SECRET], reached
        child = opened.fork()
        try:
            assert _host_access(client, child.id) is True
            assert _probe(child, [("direct", f"http://10.0.2.2:{port}/child")])[0]["out"] == SECRET
        finally:
            child.kill()
        # A snapshot taken with host access restores restricted without the flag.
        closed = Sandbox.create(from_snapshot=opened.snapshot("open"), client=client)
        try:
            assert _host_access(client, closed.id) is False
            blocked = _probe(closed, [("direct", f"http://10.0.2.2:{port}/closed")])[0]
            assert not blocked["ok"] and "refused" in blocked["out"]
        finally:
            closed.kill()
    finally:
        opened.kill()
    assert secret_server.requests == ["/open", "/env", "/child"]
    secret_server.requests.clear()


@vm
def test_egress_survives_an_engine_restart(sandbox: Sandbox, engine: EngineProcess) -> None:
    engine.stop()
    engine.start()
    adopted = Sandbox.get(sandbox.id, client=engine.client())
    (answer,) = _probe(adopted, [_proxied("10.0.0.1:443")])
    assert answer["out"].startswith("HTTP/1.1 403 Forbidden"), answer


def test_host_access_needs_the_engine_setting(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    proc = EngineProcess(tmp_path_factory.mktemp("sandfork-strict"))
    proc.start()
    try:
        with pytest.raises(SandforkError) as info:
            proc.client().request("POST", "/sandboxes", json={"host_access": True})
        assert "host_access is disabled" in str(info.value)
        with pytest.raises(SandforkError):
            proc.client().request("POST", "/sandboxes", json={"host_access": "yes"})
    finally:
        proc.close()


# -- the egress channel: bounded host cost, the host's own addresses, no host text ---------

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
    ours = {engine.process.pid, *engine.qemu_pids()}
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
            answers = _probe(
                current,
                [
                    _proxied(f"192.88.99.7:{port}"),
                    _proxied(f"http://192.88.99.7:{port}/own"),
                    _proxied(f"[::ffff:192.88.99.7]:{port}"),
                    _proxied(f"198.51.100.7:{port}"),
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
def test_port_zero_and_no_host_text_reach_the_guest(
    current: Sandbox, engine: EngineProcess
) -> None:
    sandbox = current
    (zero, plain_zero) = _probe(sandbox, [_proxied("10.1.2.3:0"), _proxied("http://10.1.2.3:0/")])
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
    pids = [str(p) for p in (engine.qemu_pid(sandbox.id), *engine.qemu_pids())]
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
        (answer,) = _probe(child, [_proxied("10.1.2.3:443")])  # and a new one works
        assert answer["out"].startswith("HTTP/1.1 403 Forbidden"), answer
    finally:
        child.kill()


def _wait_for_exec(sandbox: Sandbox, command: str) -> None:
    deadline = time.monotonic() + 600
    while sandbox.exec(command, timeout_seconds=60).exit_code != 0:
        assert time.monotonic() < deadline, f"{command!r} never succeeded in the guest"
        time.sleep(0.1)
