"""Servers started inside a sandbox answer through the engine's port proxy, with the API key
only: plain HTTP (``python -m http.server``), a large upload and a streamed download, and a
WebSocket (a small tornado app); a restored copy's server answers through its own URL.

Traffic goes only to the engine on loopback; the engine reaches the servers through each
sandbox's own channel, never through the network.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Iterator

import pytest
import requests
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from conftest import EngineProcess
from sandfork.sdk import Client, Sandbox

pytestmark = [pytest.mark.vm, pytest.mark.portable]  # every backend (the container pass too)

APP = r"""
import hashlib, sys
import tornado.ioloop, tornado.web, tornado.websocket

class Echo(tornado.websocket.WebSocketHandler):
    def on_message(self, message):
        self.write_message("echo: " + message)

class Seen(tornado.web.RequestHandler):
    def get(self):
        self.write({"uri": self.request.uri, "headers": dict(self.request.headers)})

    def post(self):
        self.write(hashlib.sha256(self.request.body).hexdigest())

class Big(tornado.web.RequestHandler):
    async def get(self):
        for _ in range(64):
            self.write(b"x" * 262144)
            await self.flush()

app = tornado.web.Application([(r"/ws", Echo), (r"/big", Big), (r"/.*", Seen)])
app.listen(int(sys.argv[1]), "127.0.0.1", max_body_size=64 << 20)
tornado.ioloop.IOLoop.current().start()
"""
APP_PORT = 8765
SITE_PORT = 8000


def _listening(sandbox: Sandbox, port: int) -> None:
    """Wait until the sandbox lists ``port`` (its server came up; the engine hears it)."""
    deadline = time.monotonic() + 120  # a bound for a hang, not a speed requirement
    while True:
        listed = sandbox.client.request("GET", f"/sandboxes/{sandbox.id}/ports")["ports"]
        if port in [entry["port"] for entry in listed]:
            return
        assert time.monotonic() < deadline, f"port {port} never listened: {listed}"
        time.sleep(0.2)


def _serve(sandbox: Sandbox) -> None:
    sandbox.filesystem.write("/tmp/site/index.html", "<h1>hello from the sandbox</h1>")
    sandbox.filesystem.write("/tmp/app.py", APP)
    sandbox.exec(
        f"cd /tmp/site && nohup python3 -m http.server {SITE_PORT} >/dev/null 2>&1 & "
        f"nohup python3 /tmp/app.py {APP_PORT} >/tmp/app.log 2>&1 &",
        check=True,
    )
    _listening(sandbox, SITE_PORT)
    _listening(sandbox, APP_PORT)


@contextlib.contextmanager
def serving(engine: EngineProcess) -> Iterator[Sandbox]:
    """A sandbox running the site and the app, killed at the end."""
    box = Sandbox.create(client=engine.client())
    try:
        _serve(box)
        yield box
    finally:
        box.kill()


@pytest.fixture(scope="module")
def served(engine: EngineProcess) -> Iterator[Sandbox]:
    with serving(engine) as box:
        yield box


def _url(engine: EngineProcess, sandbox: Sandbox, port: int, path: str = "") -> str:
    return f"{engine.url}/v1/sandboxes/{sandbox.id}/ports/{port}/{path}"


def test_a_site_answers_with_the_key_and_only_with_it(
    engine: EngineProcess, served: Sandbox
) -> None:
    page = requests.get(_url(engine, served, SITE_PORT, "index.html"), headers=engine.auth)
    assert page.status_code == 200 and page.text == "<h1>hello from the sandbox</h1>"
    listed = engine.get(f"/v1/sandboxes/{served.id}/ports").json()["ports"]
    assert {"port": SITE_PORT, "url": f"/v1/sandboxes/{served.id}/ports/{SITE_PORT}/"} in listed
    assert 3128 not in [entry["port"] for entry in listed]  # the agent's own proxy address
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        refused = requests.get(_url(engine, served, SITE_PORT, "index.html"), headers=headers)
        assert refused.status_code == 401 and "API key" in refused.json()["error"]


def test_the_app_sees_its_path_and_query_but_no_credentials(
    engine: EngineProcess, served: Sandbox
) -> None:
    headers = {**engine.auth, "X-API-Key": engine.api_key, "X-Mine": "kept"}
    seen = requests.get(_url(engine, served, APP_PORT, "a/b?q=1&r=2"), headers=headers).json()
    assert seen["uri"] == "/a/b?q=1&r=2"
    names = {name.lower(): value for name, value in seen["headers"].items()}
    assert "authorization" not in names and "x-api-key" not in names
    assert engine.api_key not in json.dumps(seen)
    assert names["x-mine"] == "kept"
    assert names["x-forwarded-prefix"] == f"/v1/sandboxes/{served.id}/ports/{APP_PORT}"
    # The path goes on as it came: encoded line breaks stay encoded (no header of the caller's)
    odd = "a%20b/%0D%0AX-Injected:%201/%2Fc"
    seen = requests.get(_url(engine, served, APP_PORT, odd), headers=engine.auth).json()
    assert seen["uri"] == "/" + odd and "X-Injected" not in seen["headers"]


def test_a_server_that_does_not_speak_http_is_a_502(engine: EngineProcess, served: Sandbox) -> None:
    code = (
        "import socket, sys\n"
        "server = socket.create_server(('127.0.0.1', int(sys.argv[1])))\n"
        "while True:\n"
        "    conn, _ = server.accept()\n"
        "    conn.recv(65536)\n"
        "    conn.sendall(sys.argv[2].encode())\n"
        "    conn.close()\n"
    )
    served.filesystem.write("/tmp/liar.py", code)
    served.exec(
        "nohup python3 /tmp/liar.py 8801 'SSH-2.0-not-http\r\n\r\n' >/dev/null 2>&1 & "
        "nohup python3 /tmp/liar.py 8802 '' >/dev/null 2>&1 &",
        check=True,
    )
    _listening(served, 8801)
    _listening(served, 8802)
    for port, why in ((8801, "sent no HTTP response"), (8802, "closed the connection")):
        answer = requests.get(_url(engine, served, port), headers=engine.auth)
        assert answer.status_code == 502 and why in answer.json()["error"], answer.text


def test_a_large_upload_and_a_streamed_download(engine: EngineProcess, served: Sandbox) -> None:
    body = bytes(range(256)) * (8 * 4096)  # 8 MiB
    summed = requests.post(_url(engine, served, APP_PORT, "sum"), data=body, headers=engine.auth)
    assert summed.status_code == 200 and summed.text == hashlib.sha256(body).hexdigest()
    with requests.get(_url(engine, served, APP_PORT, "big"), headers=engine.auth, stream=True) as r:
        assert r.status_code == 200
        size = sum(len(chunk) for chunk in r.iter_content(1 << 16))
    assert size == 64 * 262144


def test_a_websocket_through_the_port_proxy(engine: EngineProcess, served: Sandbox) -> None:
    url = _url(engine, served, APP_PORT, "ws").replace("http", "ws", 1)

    async def talk() -> list[str | bytes | None]:
        socket = await websocket_connect(HTTPRequest(url, headers=engine.auth))
        answers = []
        for word in ("one", "two" * 50000):
            await socket.write_message(word)
            answers.append(await socket.read_message())
        socket.close()
        return answers

    assert asyncio.run(talk()) == ["echo: one", "echo: " + "two" * 50000]

    async def without_key() -> None:
        await websocket_connect(HTTPRequest(url))

    with pytest.raises(HTTPClientError) as refused:
        asyncio.run(without_key())
    assert refused.value.code == 401


def test_ports_nobody_listens_on_and_ports_that_are_none(
    engine: EngineProcess, served: Sandbox
) -> None:
    closed = requests.get(_url(engine, served, 9), headers=engine.auth)
    assert closed.status_code == 502
    assert closed.json()["error"] == (
        f"sandbox {served.id}, port 9: nothing listens on port 9 in the sandbox"
    )
    for port in ("0", "65536", "http", "-1"):
        bad = requests.get(
            f"{engine.url}/v1/sandboxes/{served.id}/ports/{port}/", headers=engine.auth
        )
        assert bad.status_code == 400 and "a port is a number" in bad.json()["error"], port
    missing = requests.get(
        f"{engine.url}/v1/sandboxes/sbx_0000000000000000/ports/80/", headers=engine.auth
    )
    assert missing.status_code == 404


def test_a_restored_copy_and_a_fork_serve_through_their_own_urls(
    engine: EngineProcess, client: Client
) -> None:
    box = Sandbox.create(client=client)
    copies: list[Sandbox] = []
    snapshot = ""
    try:
        _serve(box)
        box.filesystem.write("/tmp/site/index.html", "original")
        snapshot = box.snapshot().id
        copies.append(Sandbox.create(from_snapshot=snapshot, client=client))
        copies.append(box.fork())
        for copy, text in zip(copies, ("restored", "forked"), strict=True):
            copy.filesystem.write("/tmp/site/index.html", text)
        for sandbox, text in ((box, "original"), (copies[0], "restored"), (copies[1], "forked")):
            page = requests.get(_url(engine, sandbox, SITE_PORT, "index.html"), headers=engine.auth)
            assert page.status_code == 200 and page.text == text, sandbox.id
    finally:
        for sandbox in [box, *copies]:
            sandbox.kill()
        if snapshot:
            client.request("DELETE", f"/snapshots/{snapshot}")


def test_listing_the_ports_of_a_hibernated_sandbox_does_not_wake_it(client: Client) -> None:
    """JupyterLab's side panel lists the current sandbox's ports at every change it hears of:
    a listing that woke the sandbox would keep it from ever hibernating."""
    box = Sandbox.create(client=client)
    try:
        box.hibernate()
        assert box.ports() == []
        assert box.refresh().status == "hibernated"
    finally:
        box.kill()
