"""JupyterLab with the Sandfork extensions on loopback, and headless Chromium driving it
through Playwright (shared by the browser tests): Debian's Chromium, a ``jupyter lab`` process
with a token and settings of its own, and the page steps the tests share."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from conftest import EngineProcess

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
SLOW_MS = 180_000  # kernel start, snapshot, restore and fork under TCG, on a shared machine


@dataclass
class Lab:
    url: str
    token: str
    root: Path

    def api(self, method: str, path: str) -> Any:
        response = requests.request(
            method,
            f"{self.url}/{path}",
            headers={"Authorization": f"token {self.token}"},
            timeout=60,
        )
        response.raise_for_status()
        return response.json()


@pytest.fixture(scope="module")
def chromium() -> Path:
    """Debian's Chromium, installed here if missing (never skipped: the test needs it)."""
    if not CHROMIUM.exists() and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"],
            check=True,
            env=env,
        )
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package")
    return CHROMIUM


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def start_lab(
    engine: EngineProcess, home: Path, settings: dict[str, Any], args: list[str]
) -> Iterator[Lab]:
    """``jupyter lab`` on loopback with a token, its kernels and extension on ``engine``, the
    user's ``settings`` (plugin id -> settings) and the server's ``args``."""
    root = home / "notebooks"
    root.mkdir()
    port = _free_port()
    token = secrets.token_hex(16)
    env = {
        **os.environ,
        "SANDFORK_API": engine.url,
        "SANDFORK_API_KEY": engine.api_key,
        # The user's own Jupyter settings, workspaces and runtime files stay out of it.
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
    }
    # No "Would you like to get notified about official Jupyter news?" in the screenshots.
    (home / "config" / "labconfig").mkdir(parents=True)
    (home / "config" / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    for plugin, values in settings.items():
        path = home / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    log_path = home / "jupyterlab.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                "--ServerApp.allow_root=True",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    lab = Lab(f"http://127.0.0.1:{port}", token, root)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: {log_path.read_text()[-3000:]}")
            try:
                lab.api("GET", "api/status")
                break
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield lab
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        print(f"jupyter lab log (tail):\n{log_path.read_text()[-4000:]}")


@pytest.fixture(name="page")
def lab_page(chromium: Path, lab: Lab) -> Iterator[Page]:
    """A Chromium page on the test module's ``lab``."""
    expect.set_options(timeout=SLOW_MS)
    with sync_playwright() as playwright:
        browser: Browser = playwright.chromium.launch(
            executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(SLOW_MS)
            page.goto(f"{lab.url}/lab?token={lab.token}")
            yield page
        finally:
            browser.close()


def notebook_panel(page: Page) -> Locator:
    """The notebook panel in front."""
    return page.locator(".jp-NotebookPanel:visible")


def toolbar_button(page: Page, name: str) -> Locator:
    """The front notebook's toolbar button of the item ``sandfork-{name}``."""
    return notebook_panel(page).locator(f'[data-jp-item-name="sandfork-{name}"] button')


def run_cell(page: Page, code: str) -> Locator:
    """Types ``code`` into the front notebook's last cell, once it shows empty, and runs it;
    returns that cell."""
    cells = notebook_panel(page).locator(".jp-Notebook .jp-CodeCell")
    # A notebook just opened (a branch, a restore) may not show its last, empty, cell yet:
    # typing into the one before would append to its code.
    expect(cells.last.locator(".cm-content")).to_have_text(re.compile(r"^\s*$"))
    cell = cells.nth(cells.count() - 1)  # fixed now: running it appends a new last cell
    cell.locator(".cm-content").click()
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")
    expect(cell.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[\d+\]"))
    return cell


def tab(page: Page, name: str) -> Locator:
    """The main area's tab of the document ``name``."""
    label = page.locator(".lm-TabBar-tabLabel", has_text=re.compile(f"^{re.escape(name)}$"))
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has=label)


def wait_for_notebook(page: Page, name: str) -> None:
    """Waits until the notebook ``name`` is in front with its kernel idle."""
    expect(tab(page, name)).to_have_class(re.compile(r"\blm-mod-current\b"))
    expect(toolbar_button(page, "snapshot")).to_be_visible()
    expect(notebook_panel(page).locator(".jp-Notebook-ExecutionIndicator")).to_have_attribute(
        "data-status", "idle"
    )
