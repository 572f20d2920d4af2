"""Host side of the guest agent protocol (see ``docs/agent-protocol.md``).

One :class:`AgentLink` per sandbox: a Unix-socket connection to the VM's virtio-serial
chardev, with concurrent requests multiplexed by id, streamed events delivered to the
request that asked for them, and unsolicited kernel events fanned out to subscribers.

The guest is untrusted (its code runs as root and can write frames on the agent's port), so
the link survives any frame: one that is not JSON, too deep, not an object, with an id of the
wrong type or longer than :data:`MAX_FRAME` is dropped, logged and counted
(:attr:`AgentLink.bad_frames`); a reply whose envelope breaks the protocol fails its request
with :class:`AgentBadReply`. What a reply's result holds is checked by its user
(:mod:`sandfork.engine.replies`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.jsonutil import json_default

from sandfork.agent.protocol import ERROR_TYPES
from sandfork.protocol import CONTEXT_ID

log = logging.getLogger(__name__)

KernelListener = Callable[[dict[str, Any]], None]
"""Called with each unsolicited event (``kernel`` and ``context_status``) of the guest, its
shape checked (:func:`_checked_event`)."""

MAX_FRAME = 64 * 2**20
"""Longest line the link takes from the guest: a 32 MiB file as base64 (``fs.read`` at the
default ``max_file_bytes``) fits. A longer line is skipped as it streams in, never buffered
whole, so one frame costs the engine at most this (and its parsed form)."""
_READ_CHUNK = 2**20
_MAX_ERROR_CHARS = 4096  # of an error message the agent sends
_KERNEL_CHANNELS = frozenset({"iopub", "shell", "stdin", "control"})
_MSG_PARTS = ("header", "parent_header", "metadata", "content")
_CONTEXT = re.compile(CONTEXT_ID)
_LEADING_ID = re.compile(rb'\{"id": ?(\d{1,18})[,}]')  # how the agent starts every frame

DEFAULT_AGENT_TIMEOUT = 30.0
"""Seconds a request may wait for its reply when its caller names no deadline."""
ADOPT_WAIT_S = 120.0
"""How long an engine that restarted waits for the agent of a sandbox it adopts while the
sandbox's process lives: a bound for a hang (a loaded machine, a guest under TCG), after which
the sandbox is reported dead."""
_PING_WAIT_S = (0.5, 8.0)  # the first ping's wait for its answer, and the most it grows to
KERNEL_START_S = 600.0
"""How long the agent itself may take to start a kernel that keeps working (its cap,
``agent/contexts.py``; one stuck for a minute fails sooner; docs/agent-protocol.md)."""
KERNEL_STARTING_OPS = frozenset({"ctx.create", "ctx.restart", "ctx.send"})
"""Operations that may start a kernel first: their default deadline adds ``KERNEL_START_S``."""


def default_wait(op: str, base: float = DEFAULT_AGENT_TIMEOUT) -> float:
    """The deadline of a request to ``op`` whose caller names none: ``base`` seconds, plus
    the kernel start time for the operations that may start a kernel."""
    return base + (KERNEL_START_S if op in KERNEL_STARTING_OPS else 0.0)


class AgentErrorReply(Exception):
    """The agent answered a request with an error (the host's side of the guest's
    ``sandfork.agent.protocol.AgentError``, which the guest package keeps to itself)."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(f"{type_}: {message}")
        self.type = type_
        self.message = message


class AgentUnavailable(Exception):
    """The agent cannot be reached (VM gone, or the channel closed mid-request)."""


class AgentBadReply(Exception):
    """The agent's reply to a request breaks the protocol (its shape, its types, a bound)."""


class AgentTimeout(TimeoutError):
    """The agent did not answer a request within its deadline (it may still, later)."""

    def __init__(self, op: str, wait: float) -> None:
        super().__init__(f"the guest agent did not answer {op!r} within {wait:g} s")
        self.op = op


@dataclass
class _Pending:
    future: asyncio.Future[dict[str, Any]]
    events: asyncio.Queue[dict[str, Any]] | None = None


@dataclass
class AgentLink:
    """A connection to one sandbox's guest agent."""

    socket_path: str
    _reader: asyncio.StreamReader | None = None
    _writer: asyncio.StreamWriter | None = None
    _pending: dict[int, _Pending] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _listeners: list[KernelListener] = field(default_factory=list)
    _read_task: asyncio.Task[None] | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    max_frame: int = MAX_FRAME
    bad_frames: int = 0
    """Frames from the guest dropped since the link was made (each logged, up to a bound)."""

    async def connect(self, timeout: float = 60.0, alive: Callable[[], bool] | None = None) -> None:
        """Connect and wait until the agent answers ``ping``.

        Retries until ``timeout``; ``alive`` (the VM process check) ends the wait early
        when the VM has exited, so a guest that never boots fails fast.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last: Exception | None = None
        wait, longest = _PING_WAIT_S
        while loop.time() < deadline:
            if alive is not None and not alive():
                raise AgentUnavailable("the VM exited before its agent answered")
            try:
                if not self.connected:
                    await self._open()
                # QEMU accepts the connection before the guest is up; pings sent meanwhile
                # wait in the port and are answered (then ignored) once the agent runs. Each
                # ping waits longer: a guest slower to answer than the first wait must not
                # see every ping given up just before its answer comes.
                await self.request("ping", wait=min(wait, max(deadline - loop.time(), 0.01)))
                return
            except (OSError, AgentUnavailable, AgentBadReply, TimeoutError) as e:
                last = e
                wait = min(wait * 2, longest)
                if not self.connected:
                    await self.close()
                    await asyncio.sleep(0.02)
        await self.close()
        raise AgentUnavailable(f"the guest agent did not answer within {timeout:.0f} s ({last})")

    async def _open(self) -> None:
        self._reader, self._writer = await asyncio.open_unix_connection(
            self.socket_path, limit=_READ_CHUNK
        )
        self._read_task = asyncio.create_task(self._read_loop())

    @property
    def connected(self) -> bool:
        """True while the connection to the agent is open."""
        return self._writer is not None and not self._writer.is_closing()

    def add_listener(self, listener: KernelListener) -> Callable[[], None]:
        """Subscribe to unsolicited events; returns a function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    async def request(
        self, op: str, args: dict[str, Any] | None = None, *, wait: float | None = None
    ) -> dict[str, Any]:
        """Send one request and return its result, raising :class:`AgentErrorReply` on
        failure.

        ``wait`` bounds how long the reply may take (:class:`AgentTimeout` past it); every
        request has one, :func:`default_wait` when the caller names none.
        """
        wait = default_wait(op) if wait is None else wait
        pending = await self._send(op, args or {}, stream=False)
        try:
            reply = await asyncio.wait_for(pending.future, wait)
        except TimeoutError:
            raise AgentTimeout(op, wait) from None
        finally:
            self._forget(pending)
        return _result(reply)

    async def stream(
        self, op: str, args: dict[str, Any], *, wait: float | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Send a streaming request; yield its events, then ``{"event": "result", ...}``.

        ``wait`` (default :func:`default_wait`) bounds the whole request.
        """
        wait = default_wait(op) if wait is None else wait
        pending = await self._send(op, args, stream=True)
        assert pending.events is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        try:
            while True:
                left = max(0.0, deadline - loop.time())
                getter = asyncio.ensure_future(pending.events.get())
                done, _ = await asyncio.wait(
                    {getter, pending.future}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                if getter in done:
                    yield getter.result()
                    continue
                getter.cancel()
                if not done:
                    raise AgentTimeout(op, wait)
                while not pending.events.empty():
                    yield pending.events.get_nowait()
                yield {"event": "result", **_result(pending.future.result())}
                return
        finally:
            self._forget(pending)

    async def _send(self, op: str, args: dict[str, Any], *, stream: bool) -> _Pending:
        if not self.connected:
            raise AgentUnavailable("not connected to the guest agent")
        req_id = next(self._ids)
        pending = _Pending(
            asyncio.get_running_loop().create_future(), asyncio.Queue() if stream else None
        )
        self._pending[req_id] = pending
        line = json.dumps({"id": req_id, "op": op, **args}, default=json_default) + "\n"
        assert self._writer is not None
        async with self._lock:
            self._writer.write(line.encode())
            await self._writer.drain()
        return pending

    def _forget(self, pending: _Pending) -> None:
        for key, value in list(self._pending.items()):
            if value is pending:
                del self._pending[key]

    async def _read_loop(self) -> None:
        """Split the guest's bytes into lines, each at most :attr:`max_frame` long: the bytes
        of a longer one are dropped as they come, so it never takes more memory than that."""
        assert self._reader is not None
        line = bytearray()
        overlong: bytes | None = None  # the head of a line being skipped
        try:
            while chunk := await self._reader.read(_READ_CHUNK):
                start = 0
                while (end := chunk.find(b"\n", start)) >= 0:
                    if overlong is None and len(line) + end - start <= self.max_frame:
                        line += chunk[start:end]
                        self._on_line(line)
                    else:
                        self._overlong(overlong or bytes(line[:64]) or chunk[start : start + 64])
                    line.clear()
                    overlong, start = None, end + 1
                if overlong is None and len(line) + len(chunk) - start > self.max_frame:
                    overlong = bytes(line[:64]) or chunk[start : start + 64]
                    line.clear()
                elif overlong is None:
                    line += chunk[start:]
        except (OSError, asyncio.IncompleteReadError) as e:
            log.debug("agent channel read failed: %s", e)
        finally:
            self._fail_all(AgentUnavailable("the connection to the guest agent was lost"))

    def _on_line(self, line: bytearray) -> None:
        if not line.strip():
            return
        try:
            frame = json.loads(line)
        except (ValueError, RecursionError) as e:  # bad UTF-8 is a ValueError too
            self._drop(f"not JSON ({type(e).__name__})", line)
            return
        try:
            self._dispatch(frame, line)
        except Exception:  # nothing a guest sends may end the link
            log.exception("dispatching a frame of the guest agent at %s failed", self.socket_path)

    def _overlong(self, head: bytes) -> None:
        """A line over :attr:`max_frame` was skipped: the request it answers fails."""
        self._drop(f"longer than {self.max_frame} bytes", head)
        match = _LEADING_ID.match(head)
        pending = self._pending.get(int(match.group(1))) if match else None
        if pending is not None and not pending.future.done():
            message = f"its reply is longer than the link's limit of {self.max_frame} bytes"
            pending.future.set_exception(AgentBadReply(message))

    def _drop(self, why: str, line: bytes | bytearray) -> None:
        self.bad_frames += 1
        n = self.bad_frames
        if n <= 10 or n & (n - 1) == 0:  # the first ten, then every power of two: bounded logs
            log.warning(
                "dropped frame #%d from the guest agent at %s: %s: %.120r",
                n,
                self.socket_path,
                why,
                bytes(line[:120]),
            )

    def _dispatch(self, frame: Any, line: bytearray) -> None:
        req_id = frame.get("id", False) if isinstance(frame, dict) else False
        if req_id is None:
            event = _checked_event(frame)
            if event is None:
                self._drop("not an event of the protocol", line)
                return
            for listener in list(self._listeners):
                try:
                    listener(event)
                except Exception:
                    log.exception("agent event listener failed")
            return
        if not isinstance(req_id, int) or isinstance(req_id, bool):
            self._drop("not an object with an integer or null id", line)
            return
        pending = self._pending.get(req_id)
        if pending is None:
            return  # a late reply, or one to a request never sent: nobody waits for it
        if "event" in frame:
            if pending.events is not None:
                pending.events.put_nowait(frame)
        elif not pending.future.done():
            pending.future.set_result(frame)

    def _fail_all(self, error: Exception) -> None:
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(error)
        self._pending.clear()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    async def close(self) -> None:
        """Close the connection (the guest keeps running)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        task, self._read_task = self._read_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _result(reply: dict[str, Any]) -> dict[str, Any]:
    """The result of a reply, or its error raised; :class:`AgentBadReply` for an envelope
    that is neither (the result's own fields are for its user to check)."""
    ok = reply.get("ok")
    if ok is True:
        result = reply.get("result")
        if not isinstance(result, dict):
            raise AgentBadReply("a successful reply must carry a result object")
        return result
    error = reply.get("error")
    if ok is not False or not isinstance(error, dict):
        raise AgentBadReply("a reply must be ok with a result or not ok with an error")
    kind, message = error.get("type"), error.get("message")
    if kind not in ERROR_TYPES or not isinstance(message, str):
        raise AgentBadReply("an error must have a known type and a message")
    if len(message) > _MAX_ERROR_CHARS:
        message = message[:_MAX_ERROR_CHARS] + "…"
    raise AgentErrorReply(kind, message)


def _checked_event(frame: dict[str, Any]) -> dict[str, Any] | None:
    """An unsolicited event of the protocol's shape (docs/agent-protocol.md), else None."""
    context = frame.get("context")
    if not isinstance(context, str) or not _CONTEXT.fullmatch(context):
        return None
    if frame.get("event") == "kernel":
        msg = frame.get("msg")
        if frame.get("channel") not in _KERNEL_CHANNELS or not isinstance(msg, dict):
            return None
        if not all(isinstance(msg.get(part), dict) for part in _MSG_PARTS):
            return None
        buffers = msg.get("buffers", [])
        if not isinstance(buffers, list) or not all(isinstance(b, str) for b in buffers):
            return None
        return frame
    if frame.get("event") == "context_status":
        status, reason = frame.get("status"), frame.get("reason", "")
        if status not in ("dead", "restarted") or not isinstance(reason, str):
            return None
        return {**frame, "reason": reason[:_MAX_ERROR_CHARS]}
    return None
