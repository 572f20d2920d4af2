"""Request dispatch: every request runs as its own task and gets exactly one final reply."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from . import __version__, files, ports, system
from .contexts import ContextRegistry
from .egress import EgressRelay
from .exec import DEFAULT_MAX_OUTPUT, run_command
from .protocol import (
    AgentError,
    Frame,
    b64decode,
    decode,
    encode,
    error_from_os,
    optional,
    reply_error,
    reply_ok,
    required,
    stream_event,
)
from .transport import LineReceiver, PipePair, Receiver, Transport, UnixListener, VirtioPort

log = logging.getLogger(__name__)

_CTX_CHANNELS = frozenset({"shell", "control", "stdin"})


@dataclass(frozen=True)
class Request:
    """One host request: its id and its whole frame (the arguments)."""

    id: int
    args: Frame


Handler = Callable[[Request], Awaitable[Frame]]


def _env_entry_ok(key: object, value: object) -> bool:
    return (
        isinstance(key, str)
        and isinstance(value, str)
        and bool(key)
        and "=" not in key
        and "\x00" not in key + value
    )


class Agent:
    """Parses host frames, runs the operations and sends replies and events back."""

    def __init__(self, make_transport: Callable[[Receiver], Transport]) -> None:
        self.transport = make_transport(LineReceiver(self.on_line))
        self.contexts = ContextRegistry(self.emit)
        self._tasks: set[asyncio.Task[None]] = set()
        self._ops: dict[str, Handler] = {
            "ping": self._ping,
            "exec": self._exec,
            "fs.read": self._fs_read,
            "fs.write": self._fs_write,
            "fs.list": self._fs_list,
            "fs.stat": self._fs_stat,
            "fs.delete": self._fs_delete,
            "ctx.create": self._ctx_create,
            "ctx.list": self._ctx_list,
            "ctx.send": self._ctx_send,
            "ctx.interrupt": self._ctx_interrupt,
            "ctx.restart": self._ctx_restart,
            "ctx.shutdown": self._ctx_shutdown,
            "sys.set_time": self._sys_set_time,
            "sys.reseed": self._sys_reseed,
            "ports": self._ports,
        }

    def emit(self, frame: Frame) -> None:
        """Send a frame to the host (dropped while no host is connected)."""
        self.transport.send(encode(frame))

    def on_line(self, line: bytes) -> None:
        """Handle one input line: start a task for a request, ignore anything malformed."""
        frame = decode(line)
        request_id = frame.get("id") if frame is not None else None
        if frame is None or not isinstance(request_id, int) or isinstance(request_id, bool):
            log.warning("ignoring malformed frame: %.200r", line)
            return
        task = asyncio.create_task(self._handle(Request(request_id, frame)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel running requests (killing their processes) and stop all kernels."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.contexts.close()

    async def _handle(self, req: Request) -> None:
        op = req.args.get("op")
        handler = self._ops.get(op) if isinstance(op, str) else None
        try:
            if handler is None:
                raise AgentError("BadRequest", f"unknown op {op!r}")
            result = await handler(req)
        except AgentError as exc:
            self.emit(reply_error(req.id, exc))
        except OSError as exc:
            self.emit(reply_error(req.id, error_from_os(exc)))
        except Exception as exc:
            log.exception("request %d (%s) failed", req.id, op)
            self.emit(reply_error(req.id, AgentError("Internal", f"{type(exc).__name__}: {exc}")))
        else:
            self.emit(reply_ok(req.id, result))

    async def _ping(self, req: Request) -> Frame:
        return {
            "version": __version__,
            "boot_id": system.boot_id(),
            "uptime_s": system.uptime_s(),
            "pid": os.getpid(),
        }

    async def _ports(self, req: Request) -> Frame:
        return {"ports": ports.servers(self.contexts.kernel_ports())}

    async def _exec(self, req: Request) -> Frame:
        args = req.args
        cmd = required(args, "cmd", str)
        timeout = optional(args, "timeout", float, None)
        if timeout is not None and timeout <= 0:
            raise AgentError("BadRequest", "'timeout' must be positive")
        if "\x00" in cmd:
            raise AgentError("BadRequest", "'cmd' must not contain NUL characters")
        env = optional(args, "env", dict, {})
        if not all(_env_entry_ok(k, v) for k, v in env.items()):
            raise AgentError(
                "BadRequest", "'env' must map names (non-empty, no '=' or NUL) to strings (no NUL)"
            )
        cwd = files.resolve(optional(args, "cwd", str, system.work_dir()))
        max_output = optional(args, "max_output", int, DEFAULT_MAX_OUTPUT)
        if max_output < 0:
            raise AgentError("BadRequest", "'max_output' must not be negative")

        def on_output(name: str, text: str) -> None:
            self.emit(stream_event(req.id, name, text))

        return await run_command(
            cmd,
            env=system.child_env(env),
            cwd=cwd,
            timeout=timeout,
            max_output=max_output,
            on_output=on_output if optional(args, "stream", bool, False) else None,
        )

    async def _fs_read(self, req: Request) -> Frame:
        path = required(req.args, "path", str)
        offset = optional(req.args, "offset", int, 0)
        length = optional(req.args, "length", int, None)
        max_bytes = optional(req.args, "max_bytes", int, files.DEFAULT_MAX_READ)
        if offset < 0 or (length is not None and length < 0) or max_bytes < 0:
            raise AgentError("BadRequest", "'offset', 'length' and 'max_bytes' must be >= 0")
        return await asyncio.to_thread(files.read_file, path, offset, length, max_bytes)

    async def _fs_write(self, req: Request) -> Frame:
        path = required(req.args, "path", str)
        data = required(req.args, "data", str)
        mode = optional(req.args, "mode", int, None)
        if mode is not None and not 0 <= mode <= 0o7777:
            raise AgentError("BadRequest", "'mode' must be between 0 and 0o7777")
        return await asyncio.to_thread(files.write_file, path, data, mode)

    async def _fs_list(self, req: Request) -> Frame:
        return await asyncio.to_thread(files.list_dir, required(req.args, "path", str))

    async def _fs_stat(self, req: Request) -> Frame:
        return await asyncio.to_thread(files.stat_path, required(req.args, "path", str))

    async def _fs_delete(self, req: Request) -> Frame:
        path = required(req.args, "path", str)
        recursive = optional(req.args, "recursive", bool, False)
        return await asyncio.to_thread(files.delete, path, recursive)

    async def _ctx_create(self, req: Request) -> Frame:
        return await self.contexts.create(optional(req.args, "isolated", bool, False))

    async def _ctx_list(self, req: Request) -> Frame:
        return {"contexts": self.contexts.describe_all()}

    async def _ctx_send(self, req: Request) -> Frame:
        context = required(req.args, "context", str)
        channel = required(req.args, "channel", str)
        if channel not in _CTX_CHANNELS:
            raise AgentError("BadRequest", f"'channel' must be one of {sorted(_CTX_CHANNELS)}")
        msg = required(req.args, "msg", dict)
        if not isinstance(msg.get("header"), dict) or "msg_id" not in msg["header"]:
            raise AgentError("BadRequest", "'msg' needs a header with a msg_id")
        for part in ("parent_header", "metadata", "content"):
            if not isinstance(msg.get(part, {}), dict):
                raise AgentError("BadRequest", f"'msg.{part}' must be an object")
        buffers = msg.get("buffers") or []
        if not isinstance(buffers, list) or not all(isinstance(b, str) for b in buffers):
            raise AgentError("BadRequest", "'msg.buffers' must be a list of base64 strings")
        await self.contexts.send(context, channel, msg)
        return {}

    async def _ctx_interrupt(self, req: Request) -> Frame:
        await self.contexts.interrupt(required(req.args, "context", str))
        return {}

    async def _ctx_restart(self, req: Request) -> Frame:
        await self.contexts.restart(required(req.args, "context", str))
        return {}

    async def _ctx_shutdown(self, req: Request) -> Frame:
        await self.contexts.shutdown(required(req.args, "context", str))
        return {}

    async def _sys_set_time(self, req: Request) -> Frame:
        epoch_ns = required(req.args, "epoch_ns", int)
        if not 0 <= epoch_ns < 2**63:
            raise AgentError("BadRequest", "'epoch_ns' is out of range")
        system.set_time(epoch_ns)
        return {}

    async def _sys_reseed(self, req: Request) -> Frame:
        entropy = b64decode(required(req.args, "entropy", str), "entropy")
        await asyncio.to_thread(system.reseed, entropy)
        return {}


def link(
    port: str, listen_unix: str | None, pipes: tuple[int, int] | None = None
) -> Callable[[Receiver], Transport]:
    """How to open one channel to the host: a container's ``pipes`` (read, write), the
    virtio ``port``, or a Unix socket to listen on (host tests)."""

    def make_transport(receiver: Receiver) -> Transport:
        if pipes is not None:
            return PipePair(pipes, receiver)
        if listen_unix is not None:
            return UnixListener(listen_unix, receiver)
        return VirtioPort(port, receiver)

    return make_transport


async def serve(
    agent_link: Callable[[Receiver], Transport],
    egress_link: Callable[[Receiver], Transport] | None,
    egress_address: tuple[str, int],
) -> None:
    """Run the agent (and the egress relay, given its channel) until SIGTERM or SIGINT, then
    kill its kernels and commands."""
    system.protect_from_oom()
    loop = asyncio.get_running_loop()
    agent = Agent(agent_link)
    agent.transport.start()
    relay = EgressRelay(egress_link, egress_address) if egress_link is not None else None
    if relay is not None:
        try:
            await relay.start()
        except OSError as e:  # the agent serves on without it
            log.error("cannot listen on %s:%d for the egress proxy: %s", *egress_address, e)
            relay.transport.close()
            relay = None
    agent.contexts.start_default()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("sandfork agent %s ready (pid %d)", __version__, os.getpid())
    try:
        await stop.wait()
    finally:
        if relay is not None:
            await relay.close()
        agent.transport.close()
        await agent.close()
