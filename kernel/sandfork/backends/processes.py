"""Telling a backend's processes apart from recycled pids, and ending them."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot); ``None`` if it is gone or a
    zombie. A pid recorded with its start time cannot be mistaken for a recycled one."""
    fields = _stat(pid)
    return None if fields is None or fields[0] == "Z" else int(fields[19])


def parent_pid(pid: int) -> int | None:
    """The pid of process ``pid``'s parent; ``None`` if it is gone."""
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (which may hold spaces and
    parentheses), from the state on; ``None`` if the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


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


def command_lines() -> Iterator[tuple[int, list[bytes]]]:
    """Every process's pid and command line (processes that end meanwhile are skipped)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                yield int(proc.name), (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue


def sandbox_processes(
    root: Path, folder_of: Callable[[list[bytes]], bytes | None]
) -> dict[str, int]:
    """The processes whose command line names a sandbox folder in ``root`` (``folder_of``
    reads it from the command line, or says ``None``): {folder name: pid}. What a backend's
    sweep goes by when an engine was killed before it recorded a process it started."""
    marker = f"{root}/".encode()
    found = {}
    for pid, args in command_lines():
        folder = folder_of(args)
        if folder is not None and folder.startswith(marker):
            found[Path(folder.decode()).name] = pid
    return found
