"""``sandfork lab`` (what scripts/start.sh runs): JupyterLab on loopback, wired to the engine,
with the server extension answering."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from conftest import EngineProcess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_lab_serves_the_extension_on_loopback(engine: EngineProcess, tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "SANDFORK_API": engine.url, "SANDFORK_API_KEY": engine.api_key}
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    log = (tmp_path / "lab.log").open("wb")
    options = [
        f"--port={port}",
        "--IdentityProvider.token=secret",
        f"--ServerApp.root_dir={tmp_path}",
    ]
    lab = subprocess.Popen(
        [sys.executable, "-m", "sandfork", "lab", *options],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert lab.poll() is None, (tmp_path / "lab.log").read_text()
            try:
                response = requests.get(f"{url}/sandfork/api/snapshots", timeout=5)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "JupyterLab did not start"
                time.sleep(0.2)
        assert response.status_code == 403  # no token, no answer
        auth = {"Authorization": "token secret"}
        response = requests.get(f"{url}/sandfork/api/snapshots", headers=auth, timeout=30)
        assert response.status_code == 200, response.text
        assert set(response.json()) == {"snapshots", "sandboxes"}
        assert requests.get(f"{url}/lab", headers=auth, timeout=30).status_code == 200
        address = socket.gethostbyname(socket.gethostname())
        if address != "127.0.0.1":
            with socket.socket() as s:
                assert s.connect_ex((address, port)) != 0, "JupyterLab listens beyond loopback"
    finally:
        lab.terminate()
        lab.wait(30)


def test_the_install_enables_both_extensions() -> None:
    """What `pip install` promises: Jupyter lists both extensions enabled and valid."""
    env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb"}
    jupyter = [sys.executable, "-m", "jupyter"]
    server = subprocess.run(
        [*jupyter, "server", "extension", "list"], env=env, capture_output=True, text=True
    )
    listing = _plain(server.stdout + server.stderr)
    assert "sandfork.jupyter enabled" in listing and "sandfork.jupyter OK" in listing, listing
    lab = subprocess.run(
        [*jupyter, "labextension", "list"], env=env, capture_output=True, text=True
    )
    listing = _plain(lab.stdout + lab.stderr)
    assert re.search(r"@sandfork/jupyterlab v\S+ enabled OK", listing), listing


def _plain(text: str) -> str:
    """Jupyter's listing without colour codes, spaces collapsed."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", text).split())
