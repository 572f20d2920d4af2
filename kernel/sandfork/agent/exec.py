"""The ``exec`` operation: run a shell command in its own process group (and, in the guest,
its own cgroup) and capture output."""

from __future__ import annotations

import asyncio
import codecs
import signal
import time
from collections.abc import Callable

from .protocol import Frame
from .system import reset_oom_score
from .workloads import active, kill, stopped

TIMEOUT_EXIT_CODE = 124
DEFAULT_MAX_OUTPUT = 1 << 20
# After the shell exits, how long its pipes may stay open before the reply is sent anyway
# (a background process such as `server &` can hold them for ever).
_DRAIN_GRACE_S = 0.1

OutputCallback = Callable[[str, str], None]


class _Capture:
    """One output stream: keeps up to ``limit`` bytes, counts the rest, optionally streams."""

    def __init__(self, name: str, limit: int, on_output: OutputCallback | None) -> None:
        self.name = name
        self.limit = limit
        self.kept = bytearray()
        self.omitted = 0
        self.detached = False
        self._on_output = on_output
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes) -> None:
        if self.detached:
            return
        room = self.limit - len(self.kept)
        part = data[:room] if room > 0 else b""
        self.kept += part
        self.omitted += len(data) - len(part)
        if part and self._on_output is not None:
            text = self._decoder.decode(part)
            if text:
                self._on_output(self.name, text)

    def finish(self) -> str:
        """Detach from the pipe and return the kept text (with the truncation marker)."""
        self.detached = True
        marker = ""
        if self.omitted:
            marker = f"\n[sandfork: output truncated, {self.omitted} bytes omitted]\n"
        if self._on_output is not None:
            tail = self._decoder.decode(b"", final=True) + marker
            if tail:
                self._on_output(self.name, tail)
        return self.kept.decode("utf-8", "replace") + marker


class _ExecProtocol(asyncio.SubprocessProtocol):
    def __init__(self, captures: dict[int, _Capture]) -> None:
        loop = asyncio.get_running_loop()
        self.captures = captures
        self.exited = loop.create_future()
        self.pipes_closed = {fd: loop.create_future() for fd in captures}

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        assert isinstance(data, bytes)
        self.captures[fd].feed(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if not self.pipes_closed[fd].done():
            self.pipes_closed[fd].set_result(None)

    def process_exited(self) -> None:
        self.exited.set_result(None)


async def run_command(
    cmd: str,
    *,
    env: dict[str, str],
    cwd: str,
    timeout: float | None,
    max_output: int,
    on_output: OutputCallback | None,
) -> Frame:
    """Run ``/bin/sh -c cmd`` and return the ``exec`` result.

    stdin is /dev/null; the command leads a new session in a cgroup of its own, so a timeout
    (or cancellation) kills everything it started. Processes it leaves behind when it exits
    by itself (``server &``) live on. Output is decoded as UTF-8 with replacement characters.
    """
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    stdout = _Capture("stdout", max_output, on_output)
    stderr = _Capture("stderr", max_output, on_output)
    workloads = active()
    with workloads.exec_group() as unit:
        transport, protocol = await loop.subprocess_exec(
            lambda: _ExecProtocol({1: stdout, 2: stderr}),
            *workloads.spawn_argv(unit, ["/bin/sh", "-c", cmd]),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        pid = transport.get_pid()
        reset_oom_score(pid)
        timed_out = False
        try:
            try:
                await asyncio.wait_for(asyncio.shield(protocol.exited), timeout)
            except TimeoutError:
                timed_out = True
                kill(pid, unit)
                await stopped(protocol.exited, unit, pgid=pid)
            if transport.get_returncode() == -signal.SIGKILL:
                # Its shell was killed (the OOM killer, say): what it started goes with it,
                # or a fork bomb whose first process was killed would fork on for ever.
                kill(pid, unit)
                await stopped(protocol.exited, unit, pgid=pid)
        except asyncio.CancelledError:
            kill(pid, unit)
            # Closing a transport whose process is not reaped yet would reap it behind the
            # child watcher's back.
            await stopped(protocol.exited, unit, 1.0)
            transport.close()
            raise
        pipes = list(protocol.pipes_closed.values())
        _, still_open = await asyncio.wait(pipes, timeout=_DRAIN_GRACE_S)
        if still_open:
            # Keep draining (and discarding) until the holders close the pipes, so that they
            # do not get SIGPIPE; close the transport only then.
            asyncio.gather(*still_open).add_done_callback(lambda _: transport.close())
        else:
            transport.close()
    returncode = transport.get_returncode()
    assert returncode is not None
    if timed_out:
        exit_code = TIMEOUT_EXIT_CODE
    elif returncode < 0:
        exit_code = 128 - returncode
    else:
        exit_code = returncode
    return {
        "exit_code": exit_code,
        "stdout": stdout.finish(),
        "stderr": stderr.finish(),
        "duration_ms": round((time.monotonic() - started) * 1000, 3),
        "timed_out": timed_out,
        "truncated": bool(stdout.omitted or stderr.omitted),
    }
