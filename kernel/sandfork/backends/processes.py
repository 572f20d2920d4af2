"""Telling a backend's processes apart from recycled pids, and ending them."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot); ``None`` if it is gone or a
    zombie. A pid recorded with its start time cannot be mistaken for a recycled one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[19])


def kill_process(pid: int) -> None:
    """SIGKILL ``pid`` and wait (briefly) until it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        time.sleep(0.01)
