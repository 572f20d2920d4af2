"""Bad input gets a clear 4xx JSON error and leaves the engine healthy."""

from __future__ import annotations

import pytest
import requests
from conftest import EngineProcess


def _call(engine: EngineProcess, method: str, path: str, **kwargs: object) -> requests.Response:
    headers = kwargs.pop("headers", engine.auth)
    return requests.request(method, f"{engine.url}{path}", headers=headers, timeout=60, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}, {"X-API-Key": "nope"}],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/health"),
        ("GET", "/v1/sandboxes"),
        ("POST", "/v1/sandboxes"),
        ("DELETE", "/v1/sandboxes/sbx_0000000000000000"),
        ("POST", "/v1/sandboxes/sbx_0000000000000000/exec"),
        ("GET", "/v1/nowhere"),
    ],
)
def test_every_endpoint_needs_the_api_key(
    engine: EngineProcess, method: str, path: str, headers: dict[str, str]
) -> None:
    response = _call(engine, method, path, headers=headers, json={})
    assert response.status_code == 401
    assert "API key" in response.json()["error"]


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
    ],
)
def test_bad_create_requests_are_400(engine: EngineProcess, body: bytes, message: str) -> None:
    response = _call(engine, "POST", "/v1/sandboxes", data=body)
    assert response.status_code == 400, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    assert message in response.json()["error"]


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
    assert response.json()["error"]


def test_engine_is_healthy_after_bad_input(engine: EngineProcess) -> None:
    _call(engine, "POST", "/v1/sandboxes", data=b"\xff\xfe garbage")
    assert _call(engine, "GET", "/v1/health").status_code == 200


def test_engine_listens_on_loopback_only(engine: EngineProcess) -> None:
    assert engine.url.startswith("http://127.0.0.1:")
