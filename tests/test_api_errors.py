"""Bad input gets a clear 4xx JSON error and leaves the engine healthy."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections import Counter
from typing import Any, cast

import pytest
import requests
from tornado import web
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.routing import PathMatches
from tornado.websocket import websocket_connect

from conftest import EngineProcess
from sandfork.engine.config import EngineConfig
from sandfork.engine.handlers.base import API_KEY_REQUIRED
from sandfork.engine.handlers.not_served import PANDASTACK_ONLY
from sandfork.engine.server import make_app
from sandfork.protocol import ErrorKind, check_snapshot_name


def _call(engine: EngineProcess, method: str, path: str, **kwargs: object) -> requests.Response:
    headers = kwargs.pop("headers", engine.auth)
    return requests.request(method, f"{engine.url}{path}", headers=headers, timeout=60, **kwargs)  # type: ignore[arg-type]


# What each capture group of the engine's route patterns is given; a route with a new kind
# of group fails _routes() until it gets a placeholder here.
_PLACEHOLDERS = {
    "(sbx_[0-9a-f]{16})": "sbx_0123456789abcdef",
    "(snap_[0-9a-f]{16})": "snap_0123456789abcdef",
    "([A-Za-z0-9_-]{1,64})": "default",
    "([^/]+)": "notebook.ipynb",
    "/?(.*)": "/index.html",  # a path below a sandbox's port
    "(builds?(?:/.*)?)": "builds",
    f"({'|'.join(PANDASTACK_ONLY)})": "apps",
    "(/.*)?": "/x",
}
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_WRONG_KEYS = [
    {},
    {"Authorization": "Bearer wrong"},
    {"Authorization": "Basic abc"},
    {"X-API-Key": "nope"},
]


def _routes() -> list[tuple[str, str]]:
    """(method, path) for every method every route of ``make_app`` handles, ids filled in,
    plus a path no route matches (the default handler)."""
    app = make_app(cast(Any, None), EngineConfig(), "unused")
    found = [("GET", "/v1/nowhere"), ("POST", "/v1/nowhere")]
    for rule in app.wildcard_router.rules:
        assert isinstance(rule.matcher, PathMatches)
        path = rule.matcher.regex.pattern.removesuffix("$")
        for group, value in _PLACEHOLDERS.items():
            path = path.replace(group, value)
        assert "(" not in path, f"give the groups of {path} a placeholder in _PLACEHOLDERS"
        handler = rule.target
        assert isinstance(handler, type) and issubclass(handler, web.RequestHandler)
        defined = [
            m
            for m in _METHODS
            if getattr(handler, m.lower()) is not getattr(web.RequestHandler, m.lower())
        ]
        assert defined, f"{handler.__name__} handles no method"
        found += [(method, path) for method in defined]
    return found


def test_the_route_table_is_enumerated() -> None:
    routes = _routes()
    assert ("POST", "/v1/snapshots/import") in routes
    assert ("GET", "/v1/sandboxes/sbx_0123456789abcdef/repl/sessions/default/channels") in routes
    assert ("PUT", "/v1/sandboxes/sbx_0123456789abcdef/fs") in routes
    assert len(routes) > 30


@pytest.mark.parametrize("headers", _WRONG_KEYS, ids=["none", "bearer", "basic", "x-api-key"])
@pytest.mark.parametrize(("method", "path"), _routes())
def test_every_route_and_method_needs_the_api_key(
    engine: EngineProcess, method: str, path: str, headers: dict[str, str]
) -> None:
    response = _call(engine, method, path, headers=headers, json={})
    assert response.status_code == 401, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    assert "API key" in response.json()["error"] and response.json()["kind"] == ErrorKind.AUTH


def test_the_channels_websocket_needs_the_api_key(engine: EngineProcess) -> None:
    url = engine.url.replace("http://", "ws://", 1)
    url += "/v1/sandboxes/sbx_0123456789abcdef/repl/sessions/default/channels"

    async def handshake(headers: dict[str, str]) -> int:
        with pytest.raises(HTTPClientError) as refused:
            await websocket_connect(HTTPRequest(url, headers=headers))
        assert refused.value.response is not None
        answer = json.loads(refused.value.response.body)
        assert "API key" in answer["error"] and answer["kind"] == ErrorKind.AUTH
        return refused.value.code

    for headers in _WRONG_KEYS:
        assert asyncio.run(handshake(headers)) == 401


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", f"/v1/{family}") for family in PANDASTACK_ONLY]
    + [
        ("POST", "/v1/apps/app_1/deploy"),
        ("GET", "/v1/templates/builds"),
        ("POST", "/v1/templates/build"),
        ("GET", "/v1/templates/builds/b1"),
        ("DELETE", "/v1/templates/code-interpreter"),
    ],
)
def test_what_pandastack_has_and_the_engine_does_not_is_a_501(
    engine: EngineProcess, method: str, path: str
) -> None:
    response = _call(engine, method, path)
    assert response.status_code == 501, response.text
    assert response.json()["error"].startswith("not served by Sandfork: ")
    assert response.json()["kind"] == ErrorKind.SERVER_ERROR


def test_a_template_is_read_by_name(engine: EngineProcess) -> None:
    found = _call(engine, "GET", "/v1/templates/code-interpreter").json()
    assert found["name"] == "code-interpreter" and found["built"] is True
    missing = _call(engine, "GET", "/v1/templates/nothing-like-it")
    assert missing.status_code == 404 and "no template" in missing.json()["error"]


def test_the_key_is_accepted_as_bearer_or_header(engine: EngineProcess) -> None:
    assert _call(engine, "GET", "/v1/health").json()["status"] == "ok"
    assert (
        _call(engine, "GET", "/v1/health", headers={"X-API-Key": engine.api_key}).status_code == 200
    )


def test_key_file_is_private(engine: EngineProcess) -> None:
    mode = (engine.home / "run" / "api_key").stat().st_mode & 0o777
    assert mode == 0o600


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"template": 5}', "'template' must be of type str"),
        (b'{"template": "no-such-template"}', "no-such-template"),
        (b'{"memory_mb": 1}', "memory_mb must be between"),
        (b'{"cpu": 99}', "cpu must be between"),
        (b'{"metadata": {"a": 1}}', "metadata must map strings"),
        (b'{"cpu": 1, "cpu": 2}', "the key 'cpu' appears twice"),
        (b'{"metadata": {"a": "1", "b": "2", "a": "3"}}', "the key 'a' appears twice"),
    ],
)
def test_bad_create_requests_are_400(engine: EngineProcess, body: bytes, message: str) -> None:
    response = _call(engine, "POST", "/v1/sandboxes", data=body)
    assert response.status_code == 400, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    assert message in response.json()["error"]
    assert response.json()["kind"] == ErrorKind.BAD_REQUEST


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/sandboxes/sbx_0123456789abcdef"),
        ("DELETE", "/v1/sandboxes/sbx_0123456789abcdef"),
        ("POST", "/v1/sandboxes/sbx_0123456789abcdef/exec"),
        ("POST", "/v1/sandboxes/sbx_0123456789abcdef/repl/sessions/default/run"),
        ("GET", "/v1/sandboxes/not-an-id"),
        ("GET", "/v1/nowhere"),
    ],
)
def test_unknown_things_are_404(engine: EngineProcess, method: str, path: str) -> None:
    response = _call(engine, method, path, json={"cmd": "true", "code": "1"})
    assert response.status_code == 404
    assert response.json()["error"] and response.json()["kind"] == ErrorKind.NOT_FOUND


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("metadata.=x", "names no metadata key"),
        ("metadata.k=1&metadata.k=2", "is given 2 times"),
        ("metadata.k=%00", "must not contain NUL"),
        ("metadata.k=%ff", "is not UTF-8"),
        (f"metadata.{'k' * 129}=v", "longer than 128 characters"),
    ],
)
def test_a_bad_metadata_filter_of_the_snapshot_listing_is_400(
    engine: EngineProcess, query: str, message: str
) -> None:
    response = _call(engine, "GET", f"/v1/snapshots?{query}")
    assert response.status_code == 400, response.text
    assert message in response.json()["error"] and response.json()["kind"] == ErrorKind.BAD_REQUEST


def test_a_metadata_filter_no_snapshot_matches_lists_none(engine: EngineProcess) -> None:
    response = _call(engine, "GET", "/v1/snapshots?metadata.k=v&metadata.%C3%A9=%E2%9C%93")
    assert response.status_code == 200 and response.json() == {"snapshots": []}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("before\u202eledom", "U+202E RIGHT-TO-LEFT OVERRIDE at position 6"),
        ("\u2066x\u2069", "U+2066 LEFT-TO-RIGHT ISOLATE"),
        ("a\u200fb", "U+200F RIGHT-TO-LEFT MARK"),
        ("a\u061cb", "U+061C ARABIC LETTER MARK"),
        ("zero\u200bwidth", "U+200B ZERO WIDTH SPACE"),
        ("\ufeffbom", "U+FEFF ZERO WIDTH NO-BREAK SPACE"),
        ("tag\U000e0041", "U+E0041 TAG LATIN CAPITAL LETTER A"),
        ("line\u2028break", "U+2028 LINE SEPARATOR"),
        ("tab\there", "U+0009"),
        ("   ", "not only spaces"),
        ("\u3000\u00a0", "not only spaces"),
        ("\u200d", "not only spaces"),
    ],
)
def test_a_snapshot_name_is_printable_text_without_bidi_controls(
    engine: EngineProcess, name: str, message: str
) -> None:
    # Checked before the snapshot is looked up: no snapshot (nor VM) is needed.
    response = _call(engine, "PATCH", "/v1/snapshots/snap_0123456789abcdef", json={"name": name})
    assert response.status_code == 400, response.text
    assert "printable" in response.json()["error"] and message in response.json()["error"]


@pytest.mark.parametrize(
    "name", ["before model", "模型之前", "\u05e9\u05dd", "🧑\u200d💻 run", "\ue000 icon", "\u3000x"]
)
def test_names_of_any_script_and_emoji_are_accepted(name: str) -> None:
    assert check_snapshot_name(name) == name


def test_a_wrong_key_is_answered_401_on_every_request_of_a_kept_alive_session(
    engine: EngineProcess,
) -> None:
    """A 401 used to be answered before the body was read: tornado then closed the
    connection unannounced, and a client still sending, or reusing the connection, got a
    reset ("unreachable") instead, about one request in ten."""
    wrong = {"Authorization": "Bearer wrong"}
    requests_made: list[tuple[str, str, Any]] = [
        ("GET", "/v1/sandboxes", None),
        ("POST", "/v1/sandboxes", None),
        ("POST", "/v1/sandboxes", b'{"template": "code-interpreter"}'),
        ("POST", "/v1/sandboxes", b"x" * 300_000),  # still being sent when refused
        ("POST", "/v1/sandboxes", (b'{"a": ', b"1}")),  # chunked
        ("PUT", "/v1/sandboxes/sbx_0123456789abcdef/fs?path=/x", b"\0" * 100_000),
        ("POST", "/v1/snapshots/import", b"\0" * 100_000),
        ("DELETE", "/v1/sandboxes/sbx_0123456789abcdef", None),
        ("GET", "/v1/nowhere", b"body on a GET"),
    ]
    answers: Counter[int | str] = Counter()
    with requests.Session() as session:
        for _ in range(60):
            for method, path, body in requests_made:
                data = iter(body) if isinstance(body, tuple) else body
                try:
                    response = session.request(
                        method, engine.url + path, data=data, headers=wrong, timeout=60
                    )
                except requests.ConnectionError as e:
                    answers[f"{method} {path}: {type(e).__name__}"] += 1
                    continue
                assert response.json()["error"] == API_KEY_REQUIRED, response.text
                answers[response.status_code] += 1
    assert answers == {401: 60 * len(requests_made)}


def test_a_refusal_keeps_the_connection_alive(engine: EngineProcess) -> None:
    """The same socket serves every refused request (no reconnecting behind the test's back,
    as a pooled client would), and then a good one."""
    host, port = engine.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.connect()
        sock = conn.sock
        for i in range(100):
            body = b'{"memory_mb": ' + str(i).encode() + b"}"
            conn.request("POST", "/v1/sandboxes", body=body, headers={"X-API-Key": "wrong"})
            response = conn.getresponse()
            assert response.status == 401 and json.loads(response.read())["error"]
            assert response.getheader("Connection") != "close"
        conn.request("GET", "/v1/nowhere", headers=engine.auth)  # a 404 from prepare, too
        response = conn.getresponse()
        assert response.status == 404 and "no such endpoint" in json.loads(response.read())["error"]
        conn.request("GET", "/v1/health", headers=engine.auth)
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read())["status"] == "ok"
        assert conn.sock is sock
    finally:
        conn.close()


def test_engine_is_healthy_after_bad_input(engine: EngineProcess) -> None:
    _call(engine, "POST", "/v1/sandboxes", data=b"\xff\xfe garbage")
    assert _call(engine, "GET", "/v1/health").status_code == 200


def test_engine_listens_on_loopback_only(engine: EngineProcess) -> None:
    assert engine.url.startswith("http://127.0.0.1:")
