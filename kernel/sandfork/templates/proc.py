"""Run host commands with captured output; failures become ``TemplateError``."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .errors import TemplateError

__all__ = ["TAIL_LINES", "Result", "format_failure", "run", "tool_path"]

#: How many lines of a failed command's output go into the error message.
TAIL_LINES = 40


_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def tool_path() -> str:
    """``$PATH`` with the sbin folders added at its end (an ordinary user's ``PATH`` lacks
    them, and ``mke2fs``, ``e2fsck`` and ``depmod`` live there)."""
    parts = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    return os.pathsep.join([*parts, *(d for d in _SBIN if d not in parts)])


@dataclass(frozen=True)
class Result:
    """The outcome of a finished command."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout followed by stderr (stdout alone when they were merged)."""
        return self.stdout + self.stderr


def format_failure(what: str, args: Sequence[str], returncode: int | None, output: str) -> str:
    """A readable description of a failed command: what, the command line, its output tail."""
    lines = output.rstrip("\n").splitlines()
    tail = lines[-TAIL_LINES:]
    status = "could not be started" if returncode is None else f"exited with status {returncode}"
    msg = f"{what} failed: `{shlex.join(list(args))}` {status}"
    if tail:
        omitted = len(lines) - len(tail)
        header = f"last {len(tail)} lines of output" if omitted else "output"
        msg += f"\n--- {header} ---\n" + "\n".join(tail)
    else:
        msg += " (no output)"
    return msg


def _pump(stream: IO[bytes], sink: list[str], on_line: Callable[[str], None] | None) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        sink.append(line)
        if on_line is not None:
            text = line.strip()
            if text:
                try:
                    on_line(text)
                except Exception:  # a progress display must never break a build
                    pass
    stream.close()


def _feed(stream: IO[bytes], data: bytes) -> None:
    try:
        stream.write(data)
    except BrokenPipeError:
        pass
    finally:
        try:
            stream.close()
        except BrokenPipeError:
            pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the command and anything it left behind (a daemon started by a setup command,
    dpkg under an interrupted debootstrap), so no process keeps using a tree being removed.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run(
    args: Sequence[str | Path],
    *,
    what: str | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    on_line: Callable[[str], None] | None = None,
    merge_stderr: bool = True,
    check: bool = True,
) -> Result:
    """Run ``args`` and wait for it, capturing its output.

    ``on_line`` is called with each non-empty output line as it arrives (for progress).
    With ``check`` (the default) a non-zero exit raises ``TemplateError`` naming ``what``,
    the command line and the last ``TAIL_LINES`` lines of output. The command runs in its
    own process group, which is killed when it exits or when this call is interrupted
    (Ctrl-C): no build step, and nothing a build step started, outlives it.
    """
    argv = [str(a) for a in args]
    label = what or argv[0]
    env = {**(os.environ if env is None else env)}
    if env.get("PATH") in (None, os.environ.get("PATH")):
        env["PATH"] = tool_path()
    program = shutil.which(argv[0], path=env["PATH"]) or argv[0]
    try:
        proc = subprocess.Popen(
            [program, *argv[1:]],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            start_new_session=True,  # its own process group: see _kill_group
        )
    except OSError as e:
        raise TemplateError(format_failure(label, argv, None, str(e))) from e
    out: list[str] = []
    err: list[str] = []
    threads: list[threading.Thread] = []
    try:
        assert proc.stdout is not None
        threads.append(threading.Thread(target=_pump, args=(proc.stdout, out, on_line)))
        if proc.stderr is not None:
            threads.append(threading.Thread(target=_pump, args=(proc.stderr, err, on_line)))
        if input is not None:
            assert proc.stdin is not None
            data = input.encode() if isinstance(input, str) else input
            threads.append(threading.Thread(target=_feed, args=(proc.stdin, data)))
        for t in threads:
            t.daemon = True
            t.start()
        returncode = proc.wait()
    finally:
        _kill_group(proc)
    for t in threads:
        t.join()
    result = Result(argv, returncode, "".join(out), "".join(err))
    if check and returncode != 0:
        raise TemplateError(format_failure(label, argv, returncode, result.output))
    return result
