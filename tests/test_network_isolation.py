"""A sandbox cannot reach the host: restricted user network plus the engine's egress proxy.

Only loopback traffic is ever sent: the proxy's refusals happen before any connection, and the
one destination that is reached (the secret server, from a sandbox with host access) listens on
the host's 127.0.0.1, which is what the guest's 10.0.2.2 is.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest

from conftest import EngineProcess
from sandfork.backends.vm.qemu import Network
from sandfork.engine.egress import EgressProxy, exempting, refusal
from sandfork.sdk import Client, Sandbox, SandforkError

SECRET = "the-host-secret-4471"
vm = pytest.mark.vm


class SecretServer:
    """An HTTP server on the host's loopback that answers every GET with :data:`SECRET`."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append(self.path)
                body = SECRET.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
ALLOWED = ["93.184.216.34", "8.8.8.8", "172.32.0.1", "2606:4700:4700::1111", "::ffff:8.8.4.4"]


@pytest.mark.parametrize("address", REFUSED)
def test_policy_refuses_host_and_private_addresses(address: str) -> None:
    reason = refusal(address)
    assert reason is not None and reason.endswith("address"), reason


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


def test_netdev_is_restricted_unless_host_access(tmp_path: Path) -> None:
    socket = tmp_path / "egress.sock"
    forward = f"guestfwd=tcp:10.0.2.100:3128-cmd:socat STDIO UNIX-CONNECT:{socket}"
    assert Network(socket).netdev() == f"user,id=net0,restrict=on,{forward}"
    assert Network(socket, host_access=True).netdev() == f"user,id=net0,{forward}"
    with pytest.raises(ValueError, match="may not contain"):
        Network(tmp_path / "a,b" / "egress.sock").netdev()


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
    async def main() -> list[bytes]:
        proxy = EgressProxy(tmp_path / "egress.sock", **kwargs)
        await proxy.start()
        try:
            assert (proxy.path.stat().st_mode & 0o777) == 0o600
            return [await _ask(proxy.path, r) for r in requests]
        finally:
            await proxy.close()

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
        ],
    )
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"HTTP/1.1 400 Bad Request"] * 4


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
import json, socket, sys, urllib.request
results = []
for kind, target in json.loads(sys.argv[1]):
    try:
        if kind == "direct":
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            out = opener.open(target, timeout=5).read().decode()
        elif kind == "env":  # whatever the environment's proxy settings say
            out = urllib.request.urlopen(target, timeout=5).read().decode()
        else:
            with socket.create_connection(("10.0.2.100", 3128), timeout=5) as s:
                s.sendall(target.encode())
                s.shutdown(socket.SHUT_WR)
                chunks = []
                while chunk := s.recv(65536):
                    chunks.append(chunk)
            out = b"".join(chunks).decode()
        results.append({"ok": True, "out": out})
    except Exception as e:
        results.append({"ok": False, "out": f"{type(e).__name__}: {e}"})
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
        assert not result["ok"] and "refused" in result["out"], result  # refused, not timed out
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
    proxy = "http://10.0.2.100:3128"
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
