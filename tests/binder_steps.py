"""Steps of the Binder simulation in ``test_binder.py`` that are not about Sandfork: what
repo2docker does as root (apt.txt, the copy of the repository), waiting for JupyterLab, a
loopback file server, a free port, and the wall clock of the steps.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import requests


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """The files of ``folder`` over HTTP on loopback, while the block runs."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Clock:
    """Wall-clock laps from the copy of the repository on."""

    def __init__(self) -> None:
        self.t0 = time.time()
        self.laps: list[tuple[str, float]] = []
        self._last = self.t0

    def lap(self, name: str) -> None:
        now = time.time()
        self.laps.append((name, now - self._last))
        # Shown at once, so that the laps so far are there if a later step fails.
        print(f"[binder] {name}: {now - self._last:.1f} s", flush=True)
        self._last = now

    def report(self) -> None:
        width = max(len(name) for name, _ in self.laps)
        for name, seconds in self.laps:
            print(f"  {name:<{width}}  {seconds:6.1f} s")
        print(f"  {'clone to the demo notebook done':<{width}}  {self._last - self.t0:6.1f} s")


def install_apt_packages(apt_txt: Path) -> None:
    """What repo2docker does first, as root: apt.txt's packages (only the missing ones)."""
    packages = [
        line.split("#", 1)[0].strip()
        for line in apt_txt.read_text().splitlines()
        if line.split("#", 1)[0].strip()
    ]
    missing = [
        name
        for name in packages
        if "install ok installed"
        not in subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True
        ).stdout
    ]
    if missing:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
            check=True,
            env=env,
        )


def copy_working_tree(source: Path, target: Path) -> None:
    """The files a clone would have: tracked and new ones (not ignored), as they are now."""
    listed = subprocess.run(
        ["git", "-C", str(source), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in sorted(set(filter(None, listed.split("\0")))):
        path = source / name
        if not path.exists() and not path.is_symlink():  # deleted, not committed yet
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / name, follow_symlinks=False)


def wait_for_lab(lab: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert lab.poll() is None, f"start or JupyterLab exited:\n{log.read_text()[-4000:]}"
        with contextlib.suppress(requests.ConnectionError):
            if requests.get(f"{url}/api/status", timeout=5).status_code in (200, 403):
                return
        assert time.monotonic() < deadline, f"JupyterLab did not answer:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
