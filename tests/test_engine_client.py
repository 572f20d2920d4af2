"""The engine client on its own, against a stand-in engine in this process: the async client,
its sync facade (plain, inside a running event loop, from threads), streaming, the
WebSocket, error kinds, and the configurable naming the engine."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tornado import web, websocket
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from traitlets.config import Config, Configurable

from sandfork.client import EngineClient, EngineConnection, SyncEngineClient, on_caller, run_sync
from sandfork.protocol import (
    AuthError,
    BadRequestError,
    ConflictError,
    EngineUnreachable,
    LimitExceeded,
    NotFoundError,
    SandboxTimeout,
    ServerError,
    SnapshotInfo,
    error_for,
)
from sandfork.sdk import Client, Snapshot

KEY = "test-key"


class Echo(web.RequestHandler):
    """Answers with what it got, or (``?status=N``) with that error."""

    def prepare(self) -> None:
        if self.request.headers.get("Authorization") != f"Bearer {KEY}":
            self.set_status(401)
            self.finish({"error": "bad API key"})
            return
        status = int(self.get_argument("status", "200"))
        if status >= 400:
            self.set_status(status)
            self.finish({"error": f"failed with {status}"})

    def _echo(self) -> None:
        if self.get_argument("empty", ""):
            self.set_status(204)
            return
        query = {k: self.get_argument(k) for k in self.request.arguments}
        body = self.request.body.decode()
        self.finish({"method": self.request.method, "query": query, "body": body})

    get = post = put = patch = delete = _echo


class Stream(web.RequestHandler):
    async def get(self) -> None:
        for i in range(3):
            self.write(f"data: {i}\n")
            await self.flush()
        self.write("data: last")


class Drop(web.RequestHandler):
    """Closes the connection without an answer, as an engine killed mid-request does."""

    def post(self) -> None:
        self.request.connection.stream.close()  # type: ignore[union-attr]


class Socket(websocket.WebSocketHandler):
    def prepare(self) -> None:
        if self.request.headers.get("Authorization") != f"Bearer {KEY}":
            raise web.HTTPError(404)

    def on_message(self, message: str | bytes) -> None:
        self.write_message(f"echo {message!s}")


@pytest.fixture(scope="module")
def stand_in() -> Iterator[str]:
    """A stand-in engine on its own loop thread; its URL."""
    sockets = bind_sockets(0, "127.0.0.1")
    port = sockets[0].getsockname()[1]
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        app = web.Application(
            [(r"/v1/echo", Echo), (r"/v1/stream", Stream), (r"/v1/ws", Socket), (r"/v1/drop", Drop)]
        )
        server = HTTPServer(app)
        server.add_sockets(sockets)
        loop.call_soon(ready.set)
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_sync_requests_send_json_params_and_bytes(stand_in: str) -> None:
    client = SyncEngineClient(stand_in, KEY)
    got = client.request("POST", "/echo", params={"path": "/a b"}, json={"x": 1})
    assert got == {"method": "POST", "query": {"path": "/a b"}, "body": '{"x": 1}'}
    assert client.request("PUT", "/echo", data=b"raw")["body"] == "raw"
    assert client.request("POST", "/echo")["body"] == ""  # a POST without a body
    assert client.request("DELETE", "/echo", params={"empty": "1"}) is None  # 204
    assert client.raw("GET", "/echo").json()["method"] == "GET"


def test_a_file_is_uploaded_as_it_is(stand_in: str, tmp_path: Path) -> None:
    path = tmp_path / "up.bin"
    path.write_bytes(b"x" * 3_000_000)
    with path.open("rb") as f:
        got = SyncEngineClient(stand_in, KEY).request("POST", "/echo", data=f)
    assert got["body"] == "x" * 3_000_000


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, BadRequestError),
        (401, AuthError),
        (404, NotFoundError),
        (409, ConflictError),
        (413, BadRequestError),
        (429, LimitExceeded),
        (500, ServerError),
        (504, SandboxTimeout),
    ],
)
def test_a_failure_raises_its_kind_with_the_engine_message(
    stand_in: str, status: int, kind: type[Exception]
) -> None:
    with pytest.raises(kind, match=f"failed with {status}") as caught:
        SyncEngineClient(stand_in, KEY).request("GET", "/echo", params={"status": status})
    assert type(caught.value) is kind and caught.value.status == status  # type: ignore[attr-defined]
    assert type(error_for(status, "m")) is kind


def test_a_wrong_key_is_an_auth_error(stand_in: str) -> None:
    with pytest.raises(AuthError, match="bad API key"):
        Client(stand_in, "wrong").request("GET", "/echo")


def test_no_engine_is_unreachable() -> None:
    client = SyncEngineClient("http://127.0.0.1:9", KEY)
    with pytest.raises(EngineUnreachable, match="could not reach") as caught:
        client.request("GET", "/echo")
    assert caught.value.status == 502


def test_a_connection_dropped_mid_request_is_unreachable(stand_in: str) -> None:
    with pytest.raises(EngineUnreachable, match="could not reach"):
        SyncEngineClient(stand_in, KEY).request("POST", "/drop", json={})


def test_the_sync_facade_works_inside_a_running_loop(stand_in: str) -> None:
    client = SyncEngineClient(stand_in, KEY)

    async def in_a_kernel() -> object:
        return client.request("GET", "/echo")["method"]  # blocking call in a loop

    assert asyncio.run(in_a_kernel()) == "GET"


def test_the_sync_facade_works_from_many_threads(stand_in: str) -> None:
    client = SyncEngineClient(stand_in, KEY)
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda i: client.request("POST", "/echo", json=i)["body"], range(40)))
    assert got == [str(i) for i in range(40)]


def test_run_sync_refuses_its_own_loop(stand_in: str) -> None:
    async def nested() -> None:
        run_sync(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="own event loop"):
        run_sync(nested())


def test_a_blocking_call_runs_its_callbacks_on_the_callers_thread(stand_in: str) -> None:
    client = SyncEngineClient(stand_in, KEY)
    seen: list[tuple[str, bool]] = []

    def callback(method: str) -> None:  # calls the blocking client: only the caller may
        seen.append((client.request("GET", "/echo")["method"], threading.current_thread() is me))

    async def call_back_twice() -> str:
        back = on_caller(callback)
        assert back is not None
        back("first")
        back("second")
        return "done"

    me = threading.current_thread()
    assert run_sync(call_back_twice()) == "done"
    assert seen == [("GET", True), ("GET", True)]


def test_a_failing_callback_ends_the_blocking_call_with_its_error(stand_in: str) -> None:
    ran_on: list[str] = []

    def callback() -> None:
        raise ValueError("the caller's own bug")

    async def call_back_then_wait() -> None:
        back = on_caller(callback)
        assert back is not None
        back()
        try:
            await asyncio.Event().wait()  # would never end: the callback's failure cancels it
        except asyncio.CancelledError:
            ran_on.append("cancelled")
            raise

    with pytest.raises(ValueError, match="own bug"):
        run_sync(call_back_then_wait())
    run_sync(asyncio.sleep(0))  # the loop has handled the cancel by its next turn
    assert ran_on == ["cancelled"]


def test_a_stream_arrives_in_lines(stand_in: str) -> None:
    lines = list(SyncEngineClient(stand_in, KEY).lines("GET", "/stream"))
    assert lines == ["data: 0", "data: 1", "data: 2", "data: last"]


def test_a_failed_stream_raises_the_engine_message(stand_in: str, tmp_path: Path) -> None:
    client = SyncEngineClient(stand_in, KEY)
    with pytest.raises(NotFoundError, match="failed with 404"):
        list(client.stream("GET", "/echo", params={"status": 404}))
    with pytest.raises(NotFoundError, match="failed with 404"):
        client.download("/echo?status=404", tmp_path / "out")


def test_the_async_client_and_its_websocket(stand_in: str) -> None:
    async def main() -> tuple[object, object]:
        client = EngineClient(stand_in, KEY)
        got = await client.request("GET", "/echo")
        received: asyncio.Queue[object] = asyncio.Queue()
        ws = await client.websocket("/ws", received.put_nowait)
        await ws.write_message("hi")
        answer = await asyncio.wait_for(received.get(), 10)
        ws.close()
        with pytest.raises(NotFoundError):
            await EngineClient(stand_in, "wrong").websocket("/ws", received.put_nowait)
        return got["method"], answer

    assert asyncio.run(main()) == ("GET", "echo hi")


def test_the_engine_is_configured_in_one_place_and_old_names_still_work() -> None:
    class SomeApp(Configurable):
        pass

    new = Config({"EngineConnection": {"engine_url": "http://e:1", "api_key": "k"}})
    conn = EngineConnection.of(SomeApp(config=new))
    assert (conn.engine_url, conn.api_key) == ("http://e:1", "k")
    old = Config({"SomeApp": {"engine_url": "http://old:2", "api_key": "o"}})
    conn = EngineConnection.of(SomeApp(config=old))
    assert (conn.engine_url, conn.api_key) == ("http://old:2", "o")
    assert EngineConnection.of(SomeApp()).engine_url == ""


def test_the_snapshot_model_round_trips() -> None:
    data = {
        "id": "snap_0123456789abcdef",
        "name": None,
        "created_at": "2026-01-01T00:00:00Z",
        "sandbox_id": "sbx_0123456789abcdef",
        "template": "code-interpreter",
        "parent_id": None,
        "size_bytes": 10,
        "paused_ms": 3,
        "memory_mb": 512,
        "cpu": 1,
        "contexts": ["default"],
        "metadata": {"notebook_path": "a.ipynb"},
        "attachments": ["notebook.ipynb"],
        "storage": "durable",
    }
    assert SnapshotInfo.from_api(data).to_api() == data
    assert json.dumps(SnapshotInfo.from_api(data).to_api())
    sdk = Snapshot.from_api(data, client=None)
    assert (sdk.id, sdk.contexts, sdk.metadata) == (data["id"], ["default"], data["metadata"])
