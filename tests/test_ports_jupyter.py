"""A sandbox's servers through Jupyter Server (``{base_url}sandfork/sandboxes/{id}/ports/…``):
with Jupyter's token or after logging in with Chromium, never without; Jupyter's own
credentials never reach the sandbox; a WebSocket goes through too; JupyterLab's side panel
links the servers of the current notebook's sandbox.

Traffic goes only to loopback: Chromium and the clients here talk to Jupyter, Jupyter to the
engine, the engine to each sandbox through its own channel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from playwright.sync_api import Page, expect, sync_playwright
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from conftest import EngineProcess
from jupyterlab_fixtures import (  # noqa: F401 (fixtures, found by name)
    CHROMIUM_ARGS,
    SLOW_MS,
    Lab,
    chromium,
    run_cell,
    start_lab,
    wait_for_notebook,
)
from sandfork.sdk import Sandbox
from test_ports import APP_PORT, SITE_PORT, serving

pytestmark = [pytest.mark.vm, pytest.mark.any_backend]


@pytest.fixture(scope="module")
def lab(engine: EngineProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with start_lab(engine, tmp_path_factory.mktemp("lab-ports"), {}, []) as running:
        yield running


@pytest.fixture(scope="module")
def served(engine: EngineProcess) -> Iterator[Sandbox]:
    with serving(engine) as box:
        yield box


def _url(lab: Lab, sandbox: Sandbox, port: int, path: str = "") -> str:
    return f"{lab.url}/sandfork/sandboxes/{sandbox.id}/ports/{port}/{path}"


def test_with_the_token_only_and_without_jupyters_credentials(lab: Lab, served: Sandbox) -> None:
    token = {"Authorization": f"token {lab.token}"}
    page = requests.get(_url(lab, served, SITE_PORT, "index.html"), headers=token, timeout=120)
    assert page.status_code == 200 and page.text == "<h1>hello from the sandbox</h1>"
    anonymous = requests.get(
        _url(lab, served, SITE_PORT, "index.html"), allow_redirects=False, timeout=120
    )
    assert anonymous.status_code in (302, 403), anonymous.status_code
    assert "hello from the sandbox" not in anonymous.text
    cookies = {"_xsrf": "jupyters", f"username-127-0-0-1-{lab.url.rsplit(':', 1)[1]}": "x"}
    seen = requests.get(
        _url(lab, served, APP_PORT, f"seen?a=1&token={lab.token}"),
        headers=token,
        cookies={**cookies, "mine": "kept"},
        timeout=120,
    ).json()
    assert seen["uri"] == "/seen?a=1"
    headers = {name.lower(): value for name, value in seen["headers"].items()}
    assert lab.token not in str(seen) and "authorization" not in headers
    assert headers["cookie"] == "mine=kept"
    assert headers["x-forwarded-prefix"] == f"/sandfork/sandboxes/{served.id}/ports/{APP_PORT}"


def test_a_websocket_through_jupyter(lab: Lab, served: Sandbox) -> None:
    url = _url(lab, served, APP_PORT, "ws").replace("http", "ws", 1)

    async def talk(headers: dict[str, str]) -> str | bytes | None:
        socket = await websocket_connect(HTTPRequest(url, headers=headers))
        await socket.write_message("via jupyter")
        answer = await socket.read_message()
        socket.close()
        return answer

    assert asyncio.run(talk({"Authorization": f"token {lab.token}"})) == "echo: via jupyter"
    with pytest.raises(HTTPClientError) as refused:
        asyncio.run(talk({}))
    assert refused.value.code in (302, 403)


@pytest.fixture
def page(chromium: Path) -> Iterator[Page]:  # noqa: F811 (the fixture)
    """A Chromium page, not logged in to Jupyter."""
    expect.set_options(timeout=SLOW_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(SLOW_MS)
            yield page
        finally:
            browser.close()


def test_chromium_logs_in_and_opens_the_sandboxes_page(
    page: Page, lab: Lab, served: Sandbox
) -> None:
    page.goto(_url(lab, served, SITE_PORT, "index.html"))
    page.locator("#password_input").fill(lab.token)  # Jupyter's login page first
    page.locator("#login_submit").click()
    expect(page.locator("h1")).to_have_text("hello from the sandbox")
    ws = _url(lab, served, APP_PORT, "ws").replace("http", "ws", 1)
    answer = page.evaluate(
        """url => new Promise((resolve, reject) => {
            const socket = new WebSocket(url);
            socket.onopen = () => socket.send("from chromium");
            socket.onmessage = event => { resolve(event.data); socket.close(); };
            socket.onerror = () => reject(new Error("websocket failed"));
        })""",
        ws,
    )
    assert answer == "echo: from chromium"


SERVE_FROM_A_CELL = """
import pathlib, socket, subprocess, time
pathlib.Path("/tmp/lab-site").mkdir(exist_ok=True)
pathlib.Path("/tmp/lab-site/from-the-notebook.txt").write_text("hi")
server = subprocess.Popen(["python3", "-m", "http.server", "8123", "--directory", "/tmp/lab-site"])
while True:  # until it listens
    try:
        socket.create_connection(("127.0.0.1", 8123)).close()
        break
    except OSError:
        time.sleep(0.1)
"""


def test_the_side_panel_links_the_notebooks_servers(
    own_engine: EngineProcess, tmp_path: Path, page: Page
) -> None:
    with start_lab(own_engine, tmp_path, {}, []) as lab:
        page.goto(f"{lab.url}/lab?token={lab.token}")
        page.locator('.jp-LauncherCard[data-category="Notebook"]', has_text="(Sandfork)").click()
        wait_for_notebook(page, "Untitled.ipynb")
        run_cell(page, SERVE_FROM_A_CELL)
        page.locator('.jp-SideBar .lm-TabBar-tab[data-id="sandfork-snapshots"]').click()
        panel = page.locator("#sandfork-snapshots")
        link = panel.locator(".sandfork-Ports-link", has_text="Port 8123")
        expect(link).to_be_visible()
        with page.expect_popup() as opened:
            link.click()
        site = opened.value
        expect(site.locator("body")).to_contain_text("from-the-notebook.txt")
        assert "/sandfork/sandboxes/sbx_" in site.url and site.url.endswith("/ports/8123/")
