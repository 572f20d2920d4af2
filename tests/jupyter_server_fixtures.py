"""A real Jupyter Server (pytest-jupyter) with Sandfork's extension and kernels against the
test engine, and the calls the server-extension tests make to it (shared by those tests).
Import the fixtures into a test module by name."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_server.auth import Authorizer
from tornado.httpclient import HTTPClientError, HTTPResponse

from conftest import EngineProcess

Fetch = Callable[..., Awaitable[HTTPResponse]]


class DenyByHeader(Authorizer):
    """Test authorizer: refuses the resources named in the request's ``X-Deny`` header.

    The policy is a stand-in; what is tested is that every handler asks it, for the right
    resources."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource not in handler.request.headers.get("X-Deny", "").split(",")


@pytest.fixture
def jp_server_config(
    engine: EngineProcess, monkeypatch: pytest.MonkeyPatch, jp_data_dir: Path
) -> dict[str, Any]:
    # pytest-jupyter isolates the Jupyter paths: give it the kernelspec `pip install` put here.
    installed = Path(sys.prefix, "share", "jupyter", "kernels", "sandfork")
    shutil.copytree(installed, jp_data_dir / "kernels" / "sandfork")
    # Kernels the server starts find the engine through the environment, like in real use.
    monkeypatch.setenv("SANDFORK_API", engine.url)
    monkeypatch.setenv("SANDFORK_API_KEY", engine.api_key)
    return {
        "ServerApp": {
            "jpserver_extensions": {"sandfork.jupyter": True},
            "authorizer_class": DenyByHeader,
        },
        "EngineConnection": {"engine_url": engine.url, "api_key": engine.api_key},
    }


@pytest.fixture(autouse=True)
def kernels_shut_down_after_the_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Shut the server's kernels down (each kills the sandbox it owns) when the test ends:
    before conftest's leak check, which pytest-jupyter's own cleanup would come after."""
    if "jp_serverapp" not in request.fixturenames:
        yield
        return
    serverapp = request.getfixturevalue("jp_serverapp")
    loop = request.getfixturevalue("jp_asyncio_loop")
    yield
    loop.run_until_complete(serverapp.kernel_manager.shutdown_all())


async def call(
    fetch: Fetch, method: str, path: str, body: Any = None, **kwargs: Any
) -> tuple[int, Any]:
    """(status, decoded JSON body) of a request, errors included."""
    if body is not None:
        kwargs["body"] = body if isinstance(body, str | bytes) else json.dumps(body)
    elif method in ("POST", "PATCH"):
        kwargs["body"] = "{}"
    kwargs.setdefault("request_timeout", 300)
    try:
        response = await fetch(*path.split("/"), method=method, **kwargs)
    except HTTPClientError as e:
        assert e.response is not None
        response = e.response
    data = json.loads(response.body) if response.body else None
    return response.code, data


def notebook(*sources: str) -> dict[str, Any]:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nb.metadata["kernelspec"] = {"name": "sandfork", "display_name": "Python 3 (Sandfork)"}
    return dict(nb)


HANG_S = 300.0  # how long a wait below may take before it counts as hung (not a speed bound)


async def start_session(fetch: Fetch, path: str, kernel_name: str) -> str:
    body = {"path": path, "name": path, "type": "notebook", "kernel": {"name": kernel_name}}
    status, session = await call(fetch, "POST", "api/sessions", body)
    assert status == 201, session
    return str(session["kernel"]["id"])


async def attached(fetch: Fetch, kernel_id: str) -> dict[str, Any]:
    """The kernel's sandbox, once the kernel has attached (409 until then)."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        status, data = await call(fetch, "GET", f"sandfork/api/kernels/{kernel_id}")
        if status == 200:
            return data  # type: ignore[no-any-return]
        assert status == 409, data
        await asyncio.sleep(0.1)
    raise AssertionError(f"kernel {kernel_id} never attached")


async def wait_step(fetch: Fetch, op: str, step: str) -> None:
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        status, data = await call(fetch, "GET", f"sandfork/api/operations/{op}")
        if status == 200 and data["step"].startswith(step):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"operation {op} never reached {step!r}")


async def run(serverapp: Any, kernel_id: str, code: str) -> str:
    """Execute ``code`` on one of the server's kernels; return its stdout (and errors)."""
    client = serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    out: list[str] = []

    def collect(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

    try:
        await client.wait_for_ready(timeout=120)
        await client.execute_interactive(code, output_hook=collect, timeout=120)
    finally:
        client.stop_channels()
    return "".join(out)
