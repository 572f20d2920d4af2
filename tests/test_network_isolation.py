"""A sandbox cannot reach the host: restricted user network plus the engine's egress proxy.

Only loopback traffic is ever sent: the proxy's refusals happen before any connection, and the
one destination that is reached (the secret server, from a sandbox with host access) listens on
the host's 127.0.0.1, which is what the guest's 10.0.2.2 is. The policy's own tests are in
test_egress_policy.py, the egress channel's in test_egress_channel.py and test_egress_tunnel.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import EngineProcess
from egress_probes import SECRET, SecretServer, probe, proxied
from sandfork.backends.vm.accel import Accelerator
from sandfork.backends.vm.qemu import MACHINE_REVISION, Network, VmLayout, VmSpec, command_line
from sandfork.engine.egress import EgressProxy
from sandfork.sdk import Client, Sandbox, SandforkError

pytestmark = pytest.mark.portable  # runs on every backend (the suite's container pass too)

vm = pytest.mark.vm


@pytest.fixture(scope="module")
def _serving() -> Iterator[SecretServer]:
    server = SecretServer()
    yield server
    server.close()


@pytest.fixture
def secret_server(_serving: SecretServer) -> SecretServer:
    """The module's secret server, with no requests recorded yet (whatever earlier tests did)."""
    _serving.requests.clear()
    return _serving


@pytest.mark.vm_only  # QEMU's netdev
def test_netdev_is_restricted_unless_host_access() -> None:
    assert Network().netdev() == "user,id=net0,restrict=on"
    assert Network(host_access=True).netdev() == "user,id=net0"


@pytest.mark.vm_only  # QEMU's command line
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
        # The loop holds a connection's task weakly: once the client half-closes, the task, its
        # streams and transports form a cycle the garbage collector may free mid-relay (the
        # client then reads b""). The engine's own channel holds its streams' tasks likewise.
        serving: set[asyncio.Task[None]] = set()

        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.create_task(proxy.serve(reader, writer))
            serving.add(task)
            task.add_done_callback(serving.discard)

        server = await asyncio.start_unix_server(accept, str(path))
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
    assert secret_server.requests == ["/plain?q=1", "/tunnel"]


def test_a_package_source_is_reached_by_name_and_port_only(
    tmp_path: Path, secret_server: SecretServer
) -> None:
    """The host's package sources pass wherever they resolve (here: loopback, as a mirror on
    the host would), but only by that name and on that port."""
    port = secret_server.port
    allowed, other_port, by_address = _through_proxy(
        tmp_path,
        [
            f"GET http://localhost:{port}/index HTTP/1.1\r\nHost: localhost\r\n\r\n".encode(),
            f"GET http://localhost:{port + 1}/x HTTP/1.1\r\nHost: localhost\r\n\r\n".encode(),
            f"GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode(),
        ],
        sources=frozenset({("localhost", port)}),
    )
    assert allowed.startswith(b"HTTP/1.0 200") and allowed.endswith(SECRET.encode())
    for refused in (other_port, by_address):
        assert refused.startswith(b"HTTP/1.1 403 Forbidden"), refused
    assert secret_server.requests == ["/index"]


def test_the_hosts_package_sources_are_read_from_its_own_configuration() -> None:
    from pip._internal.models.index import PyPI

    from sandfork.engine.package_sources import package_sources

    sources = package_sources()
    assert (PyPI.netloc, 443) in sources and (PyPI.file_storage_domain, 443) in sources


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
    direct = probe(
        sandbox,
        [
            ("direct", f"http://10.0.2.2:{port}/direct"),
            ("direct", f"http://10.0.2.2:{engine_port}/v1/health"),
            ("env", f"http://10.0.2.2:{port}/env"),
        ],
    )
    for result in direct:
        out = result["out"]
        # refused at once (a VM), or no route at all (a container has only lo): never timed out
        assert not result["ok"] and ("refused" in out or "unreachable" in out), result
    refused = probe(
        sandbox,
        [
            proxied(f"http://127.0.0.1:{port}/via-proxy"),
            proxied(f"http://10.0.2.2:{port}/via-proxy"),
            proxied(f"127.0.0.1:{engine_port}"),
            proxied("192.168.1.1:443"),
            proxied("http://10.1.2.3/"),
            proxied(f"http://localhost:{port}/"),
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
@pytest.mark.vm_only  # host_access is a VM's unrestricted NIC
def test_host_access_is_opt_in_and_follows_forks(
    sandbox: Sandbox, client: Client, secret_server: SecretServer
) -> None:
    """Snapshots restore in either network mode; forks keep their parent's."""
    port = secret_server.port
    snapshot = sandbox.snapshot("restricted")
    opened = Sandbox.create(from_snapshot=snapshot, host_access=True, client=client)
    try:
        assert _host_access(client, opened.id) is True
        reached = probe(
            opened,
            [("direct", f"http://10.0.2.2:{port}/open"), ("env", f"http://10.0.2.2:{port}/env")],
        )
        assert [r["out"] for r in reached] == [SECRET, SECRET], reached
        child = opened.fork()
        try:
            assert _host_access(client, child.id) is True
            assert probe(child, [("direct", f"http://10.0.2.2:{port}/child")])[0]["out"] == SECRET
        finally:
            child.kill()
        # A snapshot taken with host access restores restricted without the flag.
        closed = Sandbox.create(from_snapshot=opened.snapshot("open"), client=client)
        try:
            assert _host_access(client, closed.id) is False
            blocked = probe(closed, [("direct", f"http://10.0.2.2:{port}/closed")])[0]
            assert not blocked["ok"] and "refused" in blocked["out"]
        finally:
            closed.kill()
    finally:
        opened.kill()
    assert secret_server.requests == ["/open", "/env", "/child"]


@vm
def test_egress_survives_an_engine_restart(sandbox: Sandbox, engine: EngineProcess) -> None:
    engine.stop()
    engine.start()
    adopted = Sandbox.get(sandbox.id, client=engine.client())
    (answer,) = probe(adopted, [proxied("10.0.0.1:443")])
    assert answer["out"].startswith("HTTP/1.1 403 Forbidden"), answer


@pytest.mark.vm_only  # host_access is a VM's unrestricted NIC
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
