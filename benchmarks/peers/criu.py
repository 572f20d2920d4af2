"""CRIU 4 dump/restore of a local Python process holding the same array as the sandbox."""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peers.held import HELD
from sandfork.paths import cache_dir

# The holder leads its own session: CRIU refuses a tree whose session leader is outside its
# PID namespace.
HOLD = (
    "import os; os.setsid()\n"
    "import numpy as np, time\n"
    f"held = {HELD}\n"
    "open({ready!r}, 'w').close()\n"
    "time.sleep(10**6)\n"
)


def _criu() -> list[str] | None:
    setup = Path(__file__).with_name("criu.sh")
    if subprocess.run(["bash", str(setup)], capture_output=True).returncode != 0:
        return None
    root = cache_dir() / "peers" / "criu" / "root"
    libs = f"{root}/usr/lib/x86_64-linux-gnu:{root}/lib/x86_64-linux-gnu"
    loader = root / "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    return [str(loader), "--library-path", libs, str(root / "usr/sbin/criu")]


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def criu_peer(size: int, runs: int) -> dict[str, float]:
    """Median CRIU dump (leave running) and restore times, in seconds; {} if unavailable."""
    criu = _criu()
    if criu is None or os.geteuid() != 0:
        print("peer CRIU: not available (needs root and benchmarks/peers/criu.sh)")
        return {}
    dumps, restores = [], []
    for _ in range(runs):
        dump, restore = _dump_and_restore(criu, size)
        dumps.append(dump)
        restores.append(restore)
    return {
        "CRIU dump (s)": statistics.median(dumps),
        "CRIU restore (s)": statistics.median(restores),
    }


def _dump_and_restore(criu: list[str], size: int) -> tuple[float, float]:
    work = Path(tempfile.mkdtemp(prefix="criu-peer-"))
    ready = work / "ready"
    holder = subprocess.Popen(
        ["unshare", "-p", "-f", sys.executable, "-c", HOLD.format(n=size, ready=str(ready))],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while not ready.exists():
            time.sleep(0.05)
        target = _children(holder.pid)[0]
        images = work / "images"
        images.mkdir()
        start = time.perf_counter()
        subprocess.run(
            [*criu, "dump", "-t", str(target), "-D", str(images), "--leave-running"],
            check=True, capture_output=True,
        )  # fmt: skip
        dump = time.perf_counter() - start
        os.kill(target, signal.SIGKILL)
        holder.wait()
        start = time.perf_counter()
        subprocess.run(
            [*criu, "restore", "-D", str(images), "-d", "--pidfile", str(work / "pid")],
            check=True, capture_output=True,
        )  # fmt: skip
        restore = time.perf_counter() - start
        os.kill(int((work / "pid").read_text()), signal.SIGKILL)
        return dump, restore
    finally:
        if holder.poll() is None:
            holder.kill()
        shutil.rmtree(work, ignore_errors=True)
