"""The gateway (``sandfork gateway``) in front of real engines on loopback: the SDKs, the
published PandaStack SDK and a kernel channel go through it unchanged; placement, ownership,
a silent engine, and both kinds of key."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandastack
import pytest
import requests
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from conftest import EngineProcess
from gateway_helpers import GatewayProcess, start_engines
from sandfork.protocol import routes
from sandfork.sdk import Client, ConflictError, LimitExceeded, Sandbox, Snapshot

NAMES = ["a", "b", "c"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, template: None) -> Iterator[GatewayProcess]:
    """A gateway that knows engines a, b, c (the module's fleet) and d (one test's own)."""
    gateway = GatewayProcess(tmp_path_factory.mktemp("gateway"), [*NAMES, "d"])
    gateway.start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def fleet(
    gateway: GatewayProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, EngineProcess]]:
    """Engines a, b and c, registered with the gateway."""
    homes = {name: tmp_path_factory.mktemp(f"engine-{name}") for name in NAMES}
    engines = start_engines(gateway, homes)
    yield engines
    for engine in engines.values():
        engine.close()


@pytest.fixture
def client(gateway: GatewayProcess, fleet: dict[str, EngineProcess]) -> Client:
    """An SDK client of the gateway."""
    return Client(gateway.url, gateway.api_key)


def owner(fleet: dict[str, EngineProcess], sandbox_id: str) -> str:
    """The engine that runs the sandbox, asked directly."""
    (name,) = [n for n, e in fleet.items() if sandbox_id in e.sandbox_ids()]
    return name


def test_the_engines_register_with_their_capacity(
    gateway: GatewayProcess, fleet: dict[str, EngineProcess]
) -> None:
    engines = gateway.engines()
    assert set(engines) == set(NAMES)
    for name, engine in fleet.items():
        seen = engines[name]
        assert seen["alive"] and seen["url"] == engine.url and "api_key" not in seen
        assert seen["capacity"]["memory_free_mb"] > 0
        assert seen["capacity"]["backend"] in ("vm", "container")
    health = gateway.get(routes.HEALTH).json()
    assert health["status"] == "ok" and len(health["engines"]) == 3


@pytest.mark.vm
@pytest.mark.any_backend
def test_the_sdk_through_the_gateway(client: Client, fleet: dict[str, EngineProcess]) -> None:
    made: list[Sandbox] = []
    try:
        sandbox = Sandbox.create(client=client)
        made.append(sandbox)
        home = owner(fleet, sandbox.id)
        assert sandbox.status == "running"
        assert sandbox.exec("echo hi", check=True).stdout == "hi\n"
        context = sandbox.create_code_context()
        assert context.run_code("x = 6 * 7\nx").text == "42"
        sandbox.filesystem.write("/tmp/up.bin", b"\0\1" * 300_000)  # a streamed upload
        assert sandbox.filesystem.read("/tmp/up.bin") == b"\0\1" * 300_000
        out: list[str] = []
        code = sandbox.exec_stream("for i in 1 2 3; do echo $i; done; exit 3", on_stdout=out.append)
        assert code == 3 and "".join(out) == "1\n2\n3\n"

        snapshot = sandbox.snapshot("through the gateway")
        assert snapshot.id in [s.id for s in Snapshot.list(client=client)]
        restored = Sandbox.create(from_snapshot=snapshot.id, client=client)
        made.append(restored)
        assert owner(fleet, restored.id) == home  # the snapshot lives on its engine
        assert restored.create_code_context().run_code("x").text == "42"

        child = sandbox.fork()
        made.append(child)
        assert owner(fleet, child.id) == home
        assert child.create_code_context().run_code("x + 1").text == "43"
        children = sandbox.fork_tree(2)
        made += children
        assert {owner(fleet, c.id) for c in children} == {home}

        listed = {s.id for s in Sandbox.list(client=client)}
        assert {s.id for s in made} <= listed
    finally:
        for sandbox in made:
            sandbox.kill()
    assert not {s.id for s in made} & {s.id for s in Sandbox.list(client=client)}


@pytest.mark.vm
@pytest.mark.any_backend
def test_creates_go_where_the_most_memory_is_free(
    client: Client, gateway: GatewayProcess, fleet: dict[str, EngineProcess]
) -> None:
    # The earlier tests' sandboxes are gone once every heartbeat says so: free memory holds
    # still from here (engines that tie may take the first create alike).
    gateway.wait_for(
        "heartbeats counting no sandbox",
        lambda: all(e["capacity"]["sandboxes"] == 0 for e in gateway.engines().values()),
    )
    free = {n: e["capacity"]["memory_free_mb"] for n, e in gateway.engines().items()}
    made = []
    try:
        made.append(Sandbox.create(client=client, memory_mb=512))
        first = owner(fleet, made[0].id)
        assert free[first] == max(free.values()), (first, free)
        # that engine now has less free: the next create goes to another
        made.append(Sandbox.create(client=client, memory_mb=512))
        assert owner(fleet, made[1].id) != first
    finally:
        for sandbox in made:
            sandbox.kill()


def test_a_create_no_engine_has_room_for_is_a_429(client: Client) -> None:
    with pytest.raises(LimitExceeded, match="no engine of this gateway has room"):
        Sandbox.create(client=client, memory_mb=10**9)


def _message(msg_type: str) -> dict[str, Any]:
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": msg_type,
        "username": "test",
        "session": uuid.uuid4().hex,
        "date": "2026-01-01T00:00:00+00:00",
        "version": "5.3",
    }
    return {
        "channel": "shell",
        "header": header,
        "parent_header": {},
        "metadata": {},
        "content": {"code": "print(7 * 6)", "silent": False},
        "buffers": [],
    }


@pytest.mark.vm
@pytest.mark.any_backend
@pytest.mark.asyncio
async def test_kernel_channels_through_the_gateway(client: Client, gateway: GatewayProcess) -> None:
    sandbox = await Sandbox.async_create(client=client)
    try:
        url = gateway.url.replace("http", "ws", 1) + routes.API
        url += routes.context(sandbox.id, "default", "channels")
        ws = await websocket_connect(HTTPRequest(url, headers=gateway.auth))
        request = _message("execute_request")
        await ws.write_message(json.dumps(request))
        streamed = replied = False
        while not (streamed and replied):
            raw = await ws.read_message()
            assert raw is not None, "the channel closed"
            frame = json.loads(raw)
            if frame["parent_header"].get("msg_id") != request["header"]["msg_id"]:
                continue
            kind = frame["header"]["msg_type"]
            streamed = streamed or (kind == "stream" and frame["content"]["text"] == "42\n")
            replied = replied or kind == "execute_reply"
        ws.close()
        with pytest.raises(HTTPClientError) as refused:
            await websocket_connect(HTTPRequest(url, headers={"Authorization": "Bearer no"}))
        assert refused.value.code == 401
    finally:
        await sandbox.async_kill()


@pytest.mark.vm
@pytest.mark.any_backend
def test_the_pandastack_sdk_through_the_gateway(
    gateway: GatewayProcess, fleet: dict[str, EngineProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PANDASTACK_API", gateway.url)
    monkeypatch.setenv("PANDASTACK_API_KEY", gateway.api_key)
    client = pandastack.Client(timeout=300)
    pandastack.set_default_client(client)
    sandbox = pandastack.Sandbox.create(template="code-interpreter")
    try:
        assert sandbox.status == "running"
        assert sandbox.exec("python3 -c 'print(sum(range(10)))'", check=True).stdout == "45\n"
        assert sandbox.create_code_context().run_code("1 + 1").text == "2"
        assert sandbox.id in [s.id for s in client.sandboxes.list()]
    finally:
        sandbox.kill()
        pandastack.set_default_client(None)
    assert sandbox.id not in [s.id for s in client.sandboxes.list()]


def _gateway_routes() -> list[tuple[str, str]]:
    """Every route an engine serves (ids filled in), and the gateway's own."""
    from test_api_errors import _routes

    own = [("GET", routes.API + routes.GATEWAY_ENGINES), ("GET", "/v1/nowhere")]
    return [*_routes(), *own]


@pytest.mark.parametrize("wrong", [{}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "x"}])
def test_a_wrong_client_key_is_a_401_on_every_route(
    gateway: GatewayProcess, fleet: dict[str, EngineProcess], wrong: dict[str, str]
) -> None:
    session = requests.Session()
    for method, path in _gateway_routes():
        body = b"{}" if method in ("POST", "PUT", "PATCH") else None
        response = session.request(method, gateway.url + path, headers=wrong, data=body)
        assert response.status_code == 401, (method, path, response.text)
        assert response.json()["kind"] == "auth", (method, path)


def test_a_wrong_engine_key_is_refused(gateway: GatewayProcess) -> None:
    beat = {
        "name": "a",
        "url": "http://127.0.0.1:1",
        "api_key": "k",
        "instance": "x",
        "interval": 1,
        "capacity": {},
    }
    url = gateway.url + routes.API + routes.GATEWAY_HEARTBEAT
    for key in ("", "wrong", gateway.api_key, gateway.engine_keys["b"]):  # b's key is not a's
        refused = requests.post(url, json=beat, headers={"Authorization": f"Bearer {key}"})
        assert refused.status_code == 401 and refused.json()["kind"] == "auth"
    unknown = requests.post(
        url, json={**beat, "name": "z"}, headers={"Authorization": "Bearer wrong"}
    )
    assert unknown.status_code == 401 and "not registered" in unknown.json()["error"]
    bad = requests.post(
        url,
        json={**beat, "interval": "soon"},
        headers={"Authorization": "Bearer " + gateway.engine_keys["a"]},
    )
    assert bad.status_code == 400 and bad.json()["kind"] == "bad_request"
    assert gateway.engines()["a"]["url"] != "http://127.0.0.1:1"  # nothing was taken


@pytest.mark.vm
@pytest.mark.any_backend
def test_a_silent_engine_s_sandboxes_are_dead_until_it_is_back(
    gateway: GatewayProcess,
    fleet: dict[str, EngineProcess],
    client: Client,
    tmp_path: Path,
) -> None:
    (lost,) = start_engines(gateway, {"d": tmp_path / "engine-d"}).values()
    try:
        on_d = Sandbox.create(client=lost.client())  # the gateway has never seen it
        assert Sandbox.get(on_d.id, client=client).status == "running"  # found on d
        elsewhere = Sandbox.create(client=client)
        lost.stop(signal.SIGKILL)

        def dead() -> bool:
            return client.request("GET", routes.sandbox(on_d.id))["status"] == "dead"

        gateway.wait_for("reported d's sandbox dead", dead)
        record = client.request("GET", routes.sandbox(on_d.id))
        assert "engine 'd'" in record["error"] and "stopped answering" in record["error"]
        listed = {s["id"]: s for s in client.request("GET", routes.SANDBOXES)["items"]}
        assert listed[on_d.id]["status"] == "dead"
        with pytest.raises(ConflictError, match="engine 'd'"):
            Sandbox.get(on_d.id, client=client).exec("true")
        assert listed[elsewhere.id]["status"] == "running"
        assert elsewhere.exec("echo still", check=True).stdout == "still\n"
        elsewhere.kill()

        lost.start()  # it comes back, with its sandbox
        gateway.wait_for("saw d back", lambda: gateway.engines()["d"]["alive"])
        again = Sandbox.get(on_d.id, client=client)
        assert again.status == "running" and again.error is None
        assert again.exec("echo back", check=True).stdout == "back\n"
        again.kill()
    finally:
        lost.close()


def restores_refused_404(engine: EngineProcess) -> int:
    """The creates (restores) the engine answered 404, as its access log lists them."""
    log = (engine.home / "engine.log").read_text(errors="replace")
    return log.count(f"404 POST {routes.API}{routes.SANDBOXES} (")


@pytest.mark.vm
@pytest.mark.any_backend
def test_a_restore_only_a_full_or_silent_engine_could_run(
    gateway: GatewayProcess,
    fleet: dict[str, EngineProcess],
    client: Client,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    home = tmp_path_factory.mktemp("engine-d")  # short: a container's capture binds a socket
    (holder,) = start_engines(gateway, {"d": home}, "--EngineConfig.max_sandboxes=1").values()
    try:
        box = Sandbox.create(client=holder.client())  # d is full (one sandbox at most)
        snapshot_id = box.snapshot("only on d").id  # no snapshot store: only d can restore it
        gateway.wait_for("saw d full", lambda: gateway.engines()["d"]["capacity"]["sandboxes"])

        def refused_by_the_others(before: int) -> int:
            gateway.wait_for(
                "saw a 404 logged", lambda: sum(map(restores_refused_404, fleet.values())) > before
            )
            return sum(map(restores_refused_404, fleet.values())) - before

        # The first engine with room lacks it (404): no other without it is asked; d is,
        # and its own 429 is the answer.
        before = sum(map(restores_refused_404, fleet.values()))
        with pytest.raises(LimitExceeded, match="max_sandboxes"):
            Sandbox.create(from_snapshot=snapshot_id, client=client)
        assert refused_by_the_others(before) == 1

        # d is silent: the one engine asked lacks it, and the answer names d.
        holder.stop(signal.SIGKILL)
        gateway.wait_for("saw d silent", lambda: not gateway.engines()["d"]["alive"])
        before = sum(map(restores_refused_404, fleet.values()))
        with pytest.raises(ConflictError, match=f"snapshot {snapshot_id} is on engine 'd'"):
            Sandbox.create(from_snapshot=snapshot_id, client=client)
        assert refused_by_the_others(before) == 1

        holder.start()  # back, to kill its sandbox
        gateway.wait_for("saw d back", lambda: gateway.engines()["d"]["alive"])
        Sandbox.get(box.id, client=client).kill()
    finally:
        holder.close()


@pytest.mark.vm
@pytest.mark.any_backend
@pytest.mark.asyncio
async def test_the_port_proxy_through_the_gateway(client: Client, gateway: GatewayProcess) -> None:
    from test_ports import APP, APP_PORT, _listening

    sandbox = await Sandbox.async_create(client=client)
    try:
        await sandbox.filesystem.async_write("/tmp/app.py", APP)
        await sandbox.async_exec(f"nohup python3 /tmp/app.py {APP_PORT} >/tmp/app.log 2>&1 &")
        await asyncio.to_thread(_listening, sandbox, APP_PORT)
        base = gateway.url + routes.API + routes.port(sandbox.id, APP_PORT, "/")

        def http_calls() -> None:
            seen = requests.get(base + "seen?q=1", headers=gateway.auth, timeout=60).json()
            assert seen["uri"] == "/seen?q=1" and "Authorization" not in seen["headers"]
            upload = os.urandom(5 << 20)
            digest = requests.post(base + "up", data=upload, headers=gateway.auth, timeout=60)
            assert digest.text == hashlib.sha256(upload).hexdigest()
            with requests.get(base + "big", headers=gateway.auth, stream=True, timeout=60) as r:
                assert sum(len(c) for c in r.iter_content(1 << 16)) == 64 * 262144

        await asyncio.to_thread(http_calls)
        url = (base + "ws").replace("http", "ws", 1)
        socket = await websocket_connect(HTTPRequest(url, headers=gateway.auth))
        await socket.write_message("one")
        assert await socket.read_message() == "echo: one"
        socket.close()
    finally:
        await sandbox.async_kill()


@pytest.mark.vm
@pytest.mark.any_backend
def test_the_change_feed_moves_when_any_engine_s_does(
    client: Client, gateway: GatewayProcess, fleet: dict[str, EngineProcess]
) -> None:
    cursor = gateway.get(routes.CHANGES).json()["cursor"]
    same = gateway.get(routes.CHANGES, params={"after": cursor, "wait": 0}).json()["cursor"]
    assert same == cursor
    sandbox = Sandbox.create(client=client)
    try:
        moved = gateway.get(routes.CHANGES, params={"after": cursor, "wait": 30}).json()
        assert moved["cursor"] != cursor
    finally:
        sandbox.kill()
    bad = gateway.get(routes.CHANGES, params={"after": "nonsense!"})
    assert bad.status_code == 400 and bad.json()["kind"] == "bad_request"
