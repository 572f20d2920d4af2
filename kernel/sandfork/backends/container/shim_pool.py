"""Shims started ahead of need.

A shim is a Python process (:mod:`.shim`); starting one and importing its modules took 0.09-
0.13 s of every create, restore and fork (measured on this project's 2-core machine). So one
shim is kept waiting: started with ``--warm KEY`` (``KEY`` names the engine whose shims these
are), it blocks reading its stdin; :meth:`ShimPool.start` writes the sandbox's config to it,
closes the pipe, and starts the next one. An engine that ends, however it ends, closes the
pipe of the shim still waiting, which then exits: nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from sandfork.backends.container.stdio import ShimConfig
from sandfork.backends.processes import command_lines, start_time

MODULE = "sandfork.backends.container.shim"


class ShimPool:
    """One waiting shim for an engine's next sandbox."""

    def __init__(self, key: str, log: Path) -> None:
        self.key = key
        self.log = log  # what a waiting shim says before it has a sandbox of its own
        self._waiting: subprocess.Popen[bytes] | None = None

    def start(self, config: ShimConfig) -> subprocess.Popen[bytes]:
        """A shim keeping the sandbox ``config`` describes (the waiting one if it is
        alive), with the next one started behind it."""
        line = config.to_json().encode() + b"\n"
        process = self._take()
        try:
            self._send(process, line)
        except OSError:  # it died waiting: a fresh one
            process = self._spawn()
            self._send(process, line)
        if self._waiting is None:
            self._waiting = self._spawn()
        return process

    def close(self) -> None:
        """Let the waiting shim go (it exits when its stdin closes)."""
        process, self._waiting = self._waiting, None
        if process is not None and process.stdin is not None:
            process.stdin.close()
            process.wait()

    def waiting_pid(self) -> int | None:
        """The waiting shim's pid, if there is one."""
        return self._waiting.pid if self._waiting is not None else None

    def _take(self) -> subprocess.Popen[bytes]:
        process, self._waiting = self._waiting, None
        if process is None or process.poll() is not None:
            return self._spawn()
        return process

    @staticmethod
    def _send(process: subprocess.Popen[bytes], line: bytes) -> None:
        assert process.stdin is not None
        try:
            process.stdin.write(line)
            process.stdin.flush()
        finally:
            with contextlib.suppress(OSError):
                process.stdin.close()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self.log.open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", MODULE, "--warm", self.key],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                umask=0o077,
                cwd="/",  # until it has a sandbox folder
            )


def shims(key: str) -> Iterator[tuple[int, Path | None]]:
    """Every shim of the engine named ``key``, with the sandbox folder it keeps (its working
    directory; ``None`` while it waits for one)."""
    wanted = [b"-m", MODULE.encode(), b"--warm", key.encode()]
    for pid, args in command_lines():
        if args[1:5] != wanted or start_time(pid) is None:  # not a shim, or a zombie
            continue
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            continue
        yield pid, (None if cwd == Path("/") else cwd)
