"""Test helpers for the guest agent: run it on the host and speak its protocol.

The agent is started the way the guest starts it: its package copied as ``sandfork_agent``
and run with ``python -m sandfork_agent``, here with ``--listen-unix`` instead of the
virtio port.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AGENT_SRC = Path(__file__).resolve().parents[1] / "kernel" / "sandfork" / "agent"

Frame = dict[str, Any]


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (zombies count as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_dead(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` is gone; True if it went away in time."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class AgentProcess:
    """The agent as a subprocess listening on a Unix socket in ``workdir``."""

    def __init__(
        self,
        workdir: Path,
        port: str | None = None,
        extra_path: tuple[str, ...] = (),
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.workdir = workdir
        self.extra_path = extra_path
        self.extra_args = extra_args
        self.socket_path = str(workdir / "agent.sock")
        self.port = port
        self.log_path = workdir / "agent.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.kernel_pids: set[int] = set()
        self.leaked_kernels: list[int] = []

    def start(self, timeout: float = 60.0) -> None:
        """Copy the package as ``sandfork_agent``, start it and wait for its socket.

        With ``port`` the agent serves that device (as in the guest) and there is no socket.
        """
        pkg_root = self.workdir / "pkg"
        shutil.rmtree(pkg_root, ignore_errors=True)
        shutil.copytree(
            AGENT_SRC, pkg_root / "sandfork_agent", ignore=shutil.ignore_patterns("__pycache__")
        )
        with self.log_path.open("ab") as log:
            where = ["--port", self.port] if self.port else ["--listen-unix", self.socket_path]
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sandfork_agent", *where, *self.extra_args],
                env={
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join([str(pkg_root), *self.extra_path]),
                },
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while not self.port and not os.path.exists(self.socket_path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent did not start:\n{self.log()}")
            time.sleep(0.01)

    @property
    def pid(self) -> int:
        """Process id of the agent."""
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        """The agent's log so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the agent and wait; kill it if it does not comply.

        Known kernels still alive afterwards are killed and listed in ``leaked_kernels``.
        """
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # The agent reaps its kernels before exiting, so they must be gone right now (an
        # orphaned kernel would only notice the agent's death a second later).
        for pid in self.kernel_pids:
            if pid_alive(pid):
                self.leaked_kernels.append(pid)
                os.kill(pid, signal.SIGKILL)
        return self.process.returncode


class AgentRequestError(Exception):
    """The agent answered with ``ok: false``."""

    def __init__(self, error: Frame) -> None:
        super().__init__(f"{error.get('type')}: {error.get('message')}")
        self.type = error.get("type")
        self.message = error.get("message")


@dataclass
class Reply:
    """A final reply together with the events that preceded it, with arrival times."""

    frame: Frame
    received_at: float
    events: list[tuple[float, Frame]] = field(default_factory=list)

    @property
    def result(self) -> Frame:
        """The result, raising AgentRequestError for a failure reply."""
        if not self.frame.get("ok"):
            raise AgentRequestError(self.frame.get("error") or {})
        result = self.frame["result"]
        assert isinstance(result, dict)
        return result

    @property
    def error_type(self) -> str | None:
        """The error type of a failure reply (None on success)."""
        return None if self.frame.get("ok") else (self.frame.get("error") or {}).get("type")

    def streamed(self, name: str) -> str:
        """Concatenated ``stdout``/``stderr`` event data."""
        return "".join(f["data"] for _, f in self.events if f.get("event") == name)


@dataclass
class Execution:
    """What a code cell produced: its iopub messages and its shell reply."""

    iopub: list[Frame]
    reply: Frame

    def of_type(self, msg_type: str) -> list[Frame]:
        """Iopub messages of one type."""
        return [m for m in self.iopub if m["header"]["msg_type"] == msg_type]

    @property
    def stdout(self) -> str:
        """Text the cell printed to stdout."""
        streams = self.of_type("stream")
        return "".join(m["content"]["text"] for m in streams if m["content"]["name"] == "stdout")

    @property
    def text(self) -> str | None:
        """text/plain of the cell's execute_result, if any."""
        results = self.of_type("execute_result")
        return results[0]["content"]["data"]["text/plain"] if results else None

    @property
    def error_name(self) -> str | None:
        """ename of the cell's error message, if any."""
        errors = self.of_type("error")
        return errors[0]["content"]["ename"] if errors else None


def jupyter_msg(msg_type: str, content: Frame, session: str, parent: Frame | None = None) -> Frame:
    """A Jupyter message dict as a host client would build it (unsigned, ISO date)."""
    return {
        "header": {
            "msg_id": uuid.uuid4().hex,
            "msg_type": msg_type,
            "username": "test",
            "session": session,
            "date": "2024-01-01T00:00:00.000000Z",
            "version": "5.3",
        },
        "parent_header": parent or {},
        "metadata": {},
        "content": content,
        "buffers": [],
    }


class AgentClient:
    """One host connection to the agent, multiplexing requests by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._events: dict[int, list[tuple[float, Frame]]] = {}
        self.unsolicited: list[Frame] = []
        self.dropped: list[bytes] = []  # lines that were not frames
        self._new_unsolicited = asyncio.Event()
        self.session = uuid.uuid4().hex
        self._task = asyncio.create_task(self._read_loop())

    @classmethod
    async def connect(cls, path: str) -> AgentClient:
        """Open a connection to the agent's Unix socket."""
        reader, writer = await asyncio.open_unix_connection(path, limit=1 << 28)
        return cls(reader, writer)

    async def close(self) -> None:
        """Disconnect (the agent keeps running)."""
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _read_loop(self) -> None:
        while line := await self._reader.readline():
            try:
                frame = json.loads(line)
            except ValueError:
                # The tail of a frame the agent was writing when an earlier host went (the
                # protocol's one unparsable line after a reconnect): dropped, as the engine does.
                self.dropped.append(line[:200])
                continue
            now = time.monotonic()
            rid = frame.get("id")
            if rid is None:
                self.unsolicited.append(frame)
                self._new_unsolicited.set()
            elif "event" in frame:
                self._events.setdefault(rid, []).append((now, frame))
            elif rid in self._pending:
                self._pending.pop(rid).set_result(Reply(frame, now, self._events.pop(rid, [])))
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError("agent connection closed"))

    async def write_raw(self, data: bytes) -> None:
        """Send raw bytes (for malformed-input tests)."""
        self._writer.write(data)
        await self._writer.drain()

    async def start(self, op: str, **args: Any) -> asyncio.Future[Reply]:
        """Send a request; return the future of its reply."""
        rid = next(self._ids)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        await self.write_raw(json.dumps({"id": rid, "op": op, **args}).encode() + b"\n")
        return fut

    async def call(self, op: str, *, wait: float = 30.0, **args: Any) -> Reply:
        """Send a request and wait up to ``wait`` seconds for its reply (success or failure)."""
        return await asyncio.wait_for(await self.start(op, **args), wait)

    async def request(self, op: str, *, wait: float = 30.0, **args: Any) -> Frame:
        """Send a request and return its result, raising AgentRequestError on failure."""
        return (await self.call(op, wait=wait, **args)).result

    def streamed_so_far(self) -> list[Frame]:
        """The events of the requests not answered yet, as they arrived."""
        return [frame for events in self._events.values() for _, frame in events]

    async def wait_event(self, match: Callable[[Frame], bool], timeout: float = 30.0) -> Frame:
        """Remove and return the first unsolicited event that matches."""
        async with asyncio.timeout(timeout):
            while True:
                for i, frame in enumerate(self.unsolicited):
                    if match(frame):
                        return self.unsolicited.pop(i)
                self._new_unsolicited.clear()
                await self._new_unsolicited.wait()

    async def send_execute(self, context: str, code: str, *, allow_stdin: bool = False) -> str:
        """Send an execute_request; return its msg_id."""
        msg = jupyter_msg(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": allow_stdin,
                "stop_on_error": True,
            },
            self.session,
        )
        await self.request("ctx.send", context=context, channel="shell", msg=msg)
        return str(msg["header"]["msg_id"])

    async def collect(
        self,
        context: str,
        msg_id: str,
        *,
        on_input: Callable[[Frame], Awaitable[None]] | None = None,
        timeout: float = 30.0,
    ) -> Execution:
        """Gather a request's iopub messages until idle, and its shell reply."""

        def ours(frame: Frame) -> bool:
            return (
                frame.get("event") == "kernel"
                and frame.get("context") == context
                and frame["msg"]["parent_header"].get("msg_id") == msg_id
            )

        iopub: list[Frame] = []
        reply: Frame | None = None
        idle = False
        async with asyncio.timeout(timeout):
            while reply is None or not idle:
                frame = await self.wait_event(ours)
                msg = frame["msg"]
                msg_type = msg["header"]["msg_type"]
                if frame["channel"] == "iopub":
                    iopub.append(msg)
                    idle = idle or (
                        msg_type == "status" and msg["content"]["execution_state"] == "idle"
                    )
                elif frame["channel"] == "shell":
                    reply = msg
                elif frame["channel"] == "stdin" and on_input is not None:
                    await on_input(msg)
        return Execution(iopub, reply)

    async def execute(
        self, context: str, code: str, *, stdin_answer: str | None = None, timeout: float = 30.0
    ) -> Execution:
        """Run a cell and collect its output; answer input() with ``stdin_answer``."""

        async def answer(request: Frame) -> None:
            assert request["header"]["msg_type"] == "input_request"
            reply = jupyter_msg(
                "input_reply", {"value": stdin_answer}, self.session, parent=request["header"]
            )
            await self.request("ctx.send", context=context, channel="stdin", msg=reply)

        msg_id = await self.send_execute(context, code, allow_stdin=stdin_answer is not None)
        return await self.collect(
            context, msg_id, on_input=answer if stdin_answer is not None else None, timeout=timeout
        )
