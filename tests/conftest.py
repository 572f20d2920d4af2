"""Shared fixtures: a real engine process with its own state directory, booting real VMs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from sandfork.sdk import Client
from sandfork.templates import ensure_template

pytest_plugins = ["pytest_jupyter.jupyter_server"]  # jp_fetch & co. for the server extension


class EngineProcess:
    """``sandfork serve`` in a subprocess, state under ``home``; restartable."""

    def __init__(self, home: Path, *args: str) -> None:
        self.home = home
        self.args = args
        self.ram_dir = Path(tempfile.mkdtemp(prefix="sandfork-test-", dir="/dev/shm"))
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.api_key = ""

    def start(self, timeout: float = 30.0) -> None:
        info = self.home / "run" / "engine.json"
        info.unlink(missing_ok=True)
        log = (self.home / "engine.log").open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sandfork",
                "serve",
                "--port",
                "0",
                "--state-dir",
                str(self.home),
                *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "SANDFORK_HOME": str(self.home),
                "SANDFORK_RAM_DIR": str(self.ram_dir),
            },
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"engine exited: {(self.home / 'engine.log').read_text()[-3000:]}"
                )
            if info.exists():
                self.url = json.loads(info.read_text())["url"]
                self.api_key = (self.home / "run" / "api_key").read_text().strip()
                return
            time.sleep(0.05)
        raise RuntimeError("engine did not start")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(30)

    def close(self) -> None:
        """Kill every sandbox through the API, stop the engine, and check nothing is left."""
        if self.process is not None and self.process.poll() is None:
            client = self.client()
            for item in client.request("GET", "/sandboxes")["items"]:
                client.request("DELETE", f"/sandboxes/{item['id']}")
            leftovers = [p for p in self.ram_dir.rglob("*") if p.is_file()]
            assert leftovers == [], f"RAM files left behind: {leftovers}"
        self.stop()
        for pid in self.qemu_pids():
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.ram_dir, ignore_errors=True)

    def client(self) -> Client:
        return Client(self.url, self.api_key)

    def get(self, path: str, **kwargs: object) -> requests.Response:
        return requests.get(f"{self.url}{path}", headers=self.auth, timeout=60, **kwargs)  # type: ignore[arg-type]

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def qemu_pid(self, sandbox_id: str) -> int:
        """The QEMU process of one sandbox."""
        for pid in self.qemu_pids():
            if sandbox_id.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        raise LookupError(f"no QEMU process for {sandbox_id}")

    def qemu_pids(self) -> list[int]:
        """QEMU processes of this engine's sandboxes (their command lines name our home)."""
        pids = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    cmdline = (proc / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"qemu-system" in cmdline and str(self.home).encode() in cmdline:
                    pids.append(int(proc.name))
        return pids


@pytest.fixture(scope="session")
def template() -> None:
    """The default template, built once (cached across runs in ~/.cache/sandfork)."""
    ensure_template("code-interpreter", progress=True)


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory, template: None) -> Iterator[EngineProcess]:
    """A running engine; on teardown every sandbox is killed and no QEMU may remain."""
    proc = EngineProcess(tmp_path_factory.mktemp("sandfork-home"))
    proc.start()
    yield proc
    proc.close()


@pytest.fixture
def own_engine(tmp_path_factory: pytest.TempPathFactory, template: None) -> Iterator[EngineProcess]:
    """An engine of one test alone, so restarting or killing it disturbs no other test."""
    proc = EngineProcess(tmp_path_factory.mktemp("sandfork-own"))
    proc.start()
    yield proc
    proc.close()


@pytest.fixture
def client(engine: EngineProcess) -> Client:
    """An SDK client of the session's engine."""
    return engine.client()
