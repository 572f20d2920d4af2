"""One ipykernel process and the ZMQ sockets that bridge it to the host.

This is the only module that needs ``jupyter_client`` (and its ``zmq``); contexts.py imports
it lazily so that the agent starts, and answers ``ping``, without loading them.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hmac
import json
import logging
import os
import secrets
import signal
import sys
from collections.abc import Callable
from typing import Any, cast

import zmq
import zmq.asyncio
from jupyter_client.connect import write_connection_file
from jupyter_client.session import Session

from . import ports
from .cgroup import Cgroup
from .protocol import AgentError, Frame, b64decode, b64encode
from .system import child_env, reset_oom_score, work_dir
from .workloads import active, kill, stopped

log = logging.getLogger(__name__)

_MPLBACKEND = "module://matplotlib_inline.backend_inline"
# zmq retries connecting to a not-yet-bound ipc socket at this interval (default 100 ms),
# which would otherwise add up to that much to every kernel start.
_RECONNECT_IVL_MS = 20
# ipykernel drops shell requests that arrive while it is still starting, so the readiness
# probe is repeated until one is answered: at this interval for the first seconds (a kernel
# starting at native speed is seen at once), then doubling up to the longest (one starting
# under TCG answers the probes queued meanwhile before the user's first cell: fewer of them).
# Any probe's answer counts: on a loaded host (or under TCG) one answer can take longer than
# the interval, and waiting for the latest probe's own answer would never end.
_PROBE_INTERVAL_S = 0.1
_PROBE_FAST_S = 2.0
_PROBE_INTERVAL_MAX_S = 2.0
_STAT_CPU = slice(11, 15)  # utime, stime, cutime, cstime: fields 14-17 of /proc/PID/stat
_IOPUB_SETTLE_S = 0.2

MessageCallback = Callable[[str, Frame], None]
ExitCallback = Callable[["KernelProcess", str], None]


def describe_exit(returncode: int) -> str:
    """Human-readable reason for a kernel process exit status."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    signum = -returncode
    if signum == signal.SIGKILL:
        return f"killed by signal {signum} (out of memory?)"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "unknown signal"
    return f"killed by signal {signum} ({name})"


class KernelProcess:
    """An ipykernel process launched with the agent's Python, reachable over ipc sockets.

    Messages from every channel are unpacked (signature checked, left unsigned) and handed to
    ``on_message``; the agent's own readiness probes are filtered out. If the process exits
    without ``kill()`` being called, ``on_exit`` is called with the reason.
    """

    def __init__(
        self,
        name: str,
        runtime_dir: str,
        zmq_context: zmq.asyncio.Context,
        on_message: MessageCallback,
        on_exit: ExitCallback,
    ) -> None:
        self.name = name
        self._prefix = os.path.join(runtime_dir, name)
        self._connection_file = self._prefix + ".json"
        self._zmq = zmq_context
        self._on_message = on_message
        self._on_exit = on_exit
        key = secrets.token_hex(32).encode("ascii")
        self._session = Session(key=key, signature_scheme="hmac-sha256", username="sandfork")
        self._sockets: dict[str, zmq.asyncio.Socket] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._unit: Cgroup | None = None
        self._exited: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._stopping = False
        self._probe_ids: set[str] = set()
        self._probe_answered = asyncio.Event()
        self._iopub_seen = asyncio.Event()
        self.own_ports: frozenset[int] = frozenset()  # its own listeners, once it is ready

    @property
    def alive(self) -> bool:
        """Whether the kernel process is still running."""
        return self._proc is not None and not self._exited.done()

    async def start(self) -> None:
        """Launch the kernel process and connect to its sockets (does not wait for it)."""
        _, info = write_connection_file(
            self._connection_file,
            ip=self._prefix,
            key=self._session.key,
            transport="ipc",
            signature_scheme="hmac-sha256",
            kernel_name="python3",
        )
        env = child_env(
            {
                "MPLBACKEND": _MPLBACKEND,
                # ipykernel exits by itself if the agent dies without killing it.
                "JPY_PARENT_PID": str(os.getpid()),
                # Silences debugpy's frozen-modules warning, otherwise printed on every start.
                "PYDEVD_DISABLE_FILE_VALIDATION": "1",
            }
        )
        workloads = active()
        self._unit = workloads.new_kernel(self.name)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", self._connection_file]
        # History in memory: a SQLite file open across a container restore turns read-only
        # (its inode changed), and a VM's snapshot needs none either.
        argv.append("--HistoryManager.hist_file=:memory:")
        self._proc = await asyncio.create_subprocess_exec(
            *workloads.spawn_argv(self._unit, argv),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            cwd=work_dir(),
            env=env,
            start_new_session=True,
        )
        reset_oom_score(self._proc.pid)
        self._tasks.append(asyncio.create_task(self._watch(self._proc)))
        log.info("kernel %s started (pid %d)", self.name, self._proc.pid)
        ports = {
            "iopub": info["iopub_port"],
            "shell": info["shell_port"],
            "control": info["control_port"],
            "stdin": info["stdin_port"],
        }
        identity = self._session.bsession
        for channel, port in ports.items():
            kind = zmq.SUB if channel == "iopub" else zmq.DEALER
            sock = self._zmq.socket(kind)
            sock.linger = 0
            sock.setsockopt(zmq.RECONNECT_IVL, _RECONNECT_IVL_MS)
            if kind == zmq.SUB:
                sock.setsockopt(zmq.SUBSCRIBE, b"")
            else:
                # The kernel routes stdin requests to the identity that sent the shell request.
                sock.setsockopt(zmq.IDENTITY, identity)
            sock.connect(f"ipc://{self._prefix}-{port}")
            self._sockets[channel] = sock
            self._tasks.append(asyncio.create_task(self._read(channel, sock)))

    async def wait_ready(self, stall: float, cap: float) -> None:
        """Wait until the kernel answers on shell and publishes on iopub.

        A kernel that is still working (its CPU time grows: a loaded host or an emulated
        guest makes imports slow) is waited for up to ``cap`` seconds; one that has used no
        CPU for ``stall`` seconds is stuck and fails at once.
        """
        loop = asyncio.get_running_loop()
        started = progressed = loop.time()
        pid = self._proc.pid if self._proc is not None else None
        ticks = _cpu_ticks(pid)
        interval = _PROBE_INTERVAL_S
        answered = asyncio.ensure_future(self._probe_answered.wait())
        waiters: list[asyncio.Future[Any]] = [answered, self._exited]
        try:
            while True:
                if self._exited.done():
                    raise AgentError("KernelDied", f"kernel {self._exited.result()} while starting")
                probe = self._session.msg("kernel_info_request")
                self._probe_ids.add(probe["header"]["msg_id"])
                await self._sockets["shell"].send_multipart(self._session.serialize(probe))
                await asyncio.wait(waiters, timeout=interval)
                if answered.done():
                    # The probes' own status messages normally reach iopub around the reply.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._iopub_seen.wait(), _IOPUB_SETTLE_S)
                    if self._iopub_seen.is_set():
                        self.own_ports = ports.listened_by(pid) if pid is not None else frozenset()
                        return
                now, seen = loop.time(), _cpu_ticks(pid)
                if seen != ticks:
                    ticks, progressed = seen, now
                if now - progressed >= stall:
                    raise AgentError(
                        "Timeout", f"kernel used no CPU for {stall:g} s while starting: it is stuck"
                    )
                if now - started >= cap:
                    raise AgentError("Timeout", f"kernel did not become ready within {cap:g} s")
                if now - started >= _PROBE_FAST_S:
                    interval = min(interval * 2, _PROBE_INTERVAL_MAX_S)
        finally:
            answered.cancel()

    async def send(self, channel: str, msg: Frame) -> None:
        """Sign the host's message (header and msg_id unchanged) and send it on ``channel``."""
        sock = self._sockets.get(channel)
        if sock is None or not self.alive:
            raise AgentError("KernelDied", "the kernel is not running")
        buffers = [b64decode(b, "msg.buffers") for b in msg.get("buffers") or []]
        frames = self._session.serialize(
            {
                "header": msg["header"],
                "parent_header": msg.get("parent_header") or {},
                "metadata": msg.get("metadata") or {},
                "content": msg.get("content") or {},
            }
        )
        await sock.send_multipart([*frames, *buffers])

    def interrupt(self) -> None:
        """SIGINT the kernel's process group (interrupts the running cell and its children)."""
        if self.alive and self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGINT)

    async def kill(self) -> None:
        """Kill the kernel with everything it started and release its sockets and files."""
        self._stopping = True
        await self._release()
        if self._proc is not None:
            await asyncio.shield(self._exited)
        self._close()

    async def _release(self) -> None:
        """Kill what the kernel left (its process group, its cgroup); remove the cgroup."""
        unit, self._unit = self._unit, None
        if self._proc is not None:
            kill(self._proc.pid, unit)
            await stopped(self._exited, unit)
        active().release(unit)

    def _close(self) -> None:
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        for sock in self._sockets.values():
            sock.close(linger=0)
        self._sockets.clear()
        for path in [self._connection_file, *glob.glob(glob.escape(self._prefix) + "-*")]:
            with contextlib.suppress(OSError):
                os.unlink(path)

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        returncode = await proc.wait()
        reason = describe_exit(returncode)
        self._exited.set_result(reason)
        if self._stopping:
            return
        log.warning("kernel %s %s", self.name, reason)
        # Whatever the kernel started goes with it.
        await self._release()
        self._close()
        self._on_exit(self, reason)

    async def _read(self, channel: str, sock: zmq.asyncio.Socket) -> None:
        while True:
            frames = await sock.recv_multipart()
            try:
                self._dispatch(channel, frames)
            except Exception:
                # One odd message must not silence the channel.
                log.exception("kernel %s: cannot forward a %s message", self.name, channel)

    def _dispatch(self, channel: str, frames: list[bytes]) -> None:
        msg = self._unpack(frames)
        if msg is None:
            return
        if channel == "iopub":
            self._iopub_seen.set()
            if msg["header"].get("msg_type") == "iopub_welcome":
                return
        parent_id = msg["parent_header"].get("msg_id")
        if parent_id in self._probe_ids:
            if channel == "shell":
                self._probe_answered.set()
            return
        self._on_message(channel, msg)

    def _unpack(self, frames: list[bytes]) -> Frame | None:
        """Check a wire message's signature and decode it to the protocol's unsigned form."""
        try:
            _, raw = self._session.feed_identities(frames)
        except ValueError:
            log.warning("kernel %s sent a message without delimiter", self.name)
            return None
        parts = cast(list[bytes], raw)
        if len(parts) < 5 or not hmac.compare_digest(parts[0], self._session.sign(parts[1:5])):
            log.warning("kernel %s sent a malformed or badly signed message", self.name)
            return None
        try:
            header, parent, metadata, content = (json.loads(p) for p in parts[1:5])
        except ValueError:
            log.warning("kernel %s sent undecodable JSON", self.name)
            return None
        msg: dict[str, Any] = {
            "header": header,
            "parent_header": parent,
            "metadata": metadata,
            "content": content,
            "buffers": [b64encode(b) for b in parts[5:]],
        }
        return msg


def _cpu_ticks(pid: int | None) -> int | None:
    """The CPU time a process and its reaped children have used, in clock ticks."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return sum(int(v) for v in fields[_STAT_CPU])
