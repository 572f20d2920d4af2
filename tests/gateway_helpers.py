"""A real gateway process for tests (``sandfork gateway``), and engines registered with it."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from conftest import EngineProcess
from netns import Hosts
from sandfork.protocol import routes

HEARTBEAT_S = 0.2  # the test engines' heartbeat interval
MISSED = 50  # heartbeats missed before an engine counts as silent: 10 s, as a loaded machine
# can keep an engine from sending one for seconds (a refused connection counts at once)


class GatewayProcess:
    """``sandfork gateway`` in a subprocess on ``ip`` (loopback unless told), with a key for
    each engine name."""

    def __init__(self, home: Path, engine_names: list[str], ip: str = "127.0.0.1") -> None:
        self.home = home
        self.ip = ip
        self.engine_keys = {name: "sfe_" + secrets.token_hex(16) for name in engine_names}
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.api_key = ""

    def start(self, timeout: float = 60.0) -> None:
        config = self.home / "gateway_config.json"
        config.write_text(
            json.dumps(
                {"GatewayConfig": {"engine_keys": self.engine_keys, "missed_heartbeats": MISSED}}
            )
        )
        info = self.home / "run" / "gateway.json"
        info.unlink(missing_ok=True)
        log = (self.home / "gateway.log").open("ab")
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "sandfork", "gateway", "--port", "0", "--ip", self.ip),
                *("--state-dir", str(self.home), "--config", str(config)),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout  # a bound for a hang, not a speed
        while not info.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start: {self.log()[-3000:]}")
            time.sleep(0.05)
        self.url = json.loads(info.read_text())["url"]
        self.api_key = (self.home / "run" / "api_key").read_text().strip()

    def log(self) -> str:
        return (self.home / "gateway.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)

    def engine_args(self, name: str) -> tuple[str, ...]:
        """What ``sandfork serve`` needs to register as ``name``."""
        return (
            f"--EngineConfig.gateway_url={self.url}",
            f"--EngineConfig.gateway_key={self.engine_keys[name]}",
            f"--EngineConfig.gateway_engine_name={name}",
            f"--EngineConfig.gateway_heartbeat_interval={HEARTBEAT_S}",
        )

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.get(self.url + routes.API + path, headers=self.auth, timeout=60, **kwargs)

    def engines(self) -> dict[str, dict[str, Any]]:
        """The fleet as the gateway sees it, by name."""
        listed = self.get(routes.GATEWAY_ENGINES).json()["engines"]
        return {e["name"]: e for e in listed}

    def wait_for(self, what: str, check: Any, timeout: float = 120.0) -> None:
        """Poll ``check()`` until it is true (the deadline is a bound for a hang)."""
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"gateway: never {what}: {self.log()[-2000:]}"
            time.sleep(0.05)


def start_engines(
    gateway: GatewayProcess,
    homes: dict[str, Path],
    *args: str,
    env: dict[str, str] | None = None,
    on: Hosts | None = None,
) -> dict[str, EngineProcess]:
    """An engine for each name, registered with ``gateway`` (started, and seen alive), with
    ``args`` of ``sandfork serve`` and ``env`` besides; each on the host of its name of
    ``on``, listening on that host's address, if given."""
    for home in homes.values():
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    engines = {}
    for name, home in homes.items():
        where = ("--ip", on.addresses[name]) if on is not None else ()
        engines[name] = EngineProcess(home, *gateway.engine_args(name), *args, *where)
        engines[name].prefix = on.prefix(name) if on is not None else ()
        engines[name].env = dict(env or {})
    for engine in engines.values():
        engine.start()
    gateway.wait_for(
        "saw every engine",
        lambda: all(gateway.engines().get(name, {}).get("alive") for name in engines),
    )
    return engines
