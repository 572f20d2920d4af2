"""Finding the engine: the environment, or the local engine (started on demand).

These run synchronously (the async client calls :func:`resolve` in a thread).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sandfork.paths import runtime_dir
from sandfork.protocol import EngineUnreachable


@dataclass(frozen=True)
class Connection:
    """Where the engine is and the key it wants."""

    url: str
    api_key: str


def from_environment() -> Connection | None:
    """``SANDFORK_API``/``SANDFORK_API_KEY``, else ``PANDASTACK_API``/``PANDASTACK_API_KEY``."""
    for prefix in ("SANDFORK", "PANDASTACK"):
        url, key = os.environ.get(f"{prefix}_API"), os.environ.get(f"{prefix}_API_KEY")
        if url and key:
            return Connection(url.rstrip("/"), key)
    return None


def local_engine(runtime: Path | None = None) -> Connection | None:
    """The local engine published in the runtime directory, if it is running."""
    runtime = runtime or runtime_dir()
    try:
        info = json.loads((runtime / "engine.json").read_text())
        key = (runtime / "api_key").read_text().strip()
    except (OSError, ValueError):
        return None
    if not _pid_alive(int(info.get("pid", 0))):
        return None
    return Connection(str(info["url"]), key)


def start_local_engine(timeout: float = 30.0) -> Connection:
    """Start ``sandfork serve`` in the background and wait until it answers."""
    runtime = runtime_dir()
    runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path = runtime / "engine.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sandfork", "serve", "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise EngineUnreachable("the local engine failed to start: " + " | ".join(tail))
        conn = local_engine(runtime)
        if conn is not None and is_healthy(conn):
            return conn
        time.sleep(0.1)
    raise EngineUnreachable(
        f"the local engine did not start within {timeout:.0f} s; see {log_path}"
    )


def is_healthy(conn: Connection) -> bool:
    """True when the engine answers its health endpoint with this key."""
    request = urllib.request.Request(
        f"{conn.url}/v1/health", headers={"Authorization": f"Bearer {conn.api_key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return int(response.status) == 200
    except (OSError, ValueError):  # URLError and HTTPError are OSErrors
        return False


def resolve(auto_start: bool = True) -> Connection:
    """The engine to talk to: the environment first, then the local engine."""
    conn = from_environment() or local_engine()
    if conn is not None:
        return conn
    if not auto_start:
        raise EngineUnreachable("no engine configured and no local engine running (sandfork serve)")
    return start_local_engine()


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
