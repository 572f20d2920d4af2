"""Host side of the guest agent protocol (see ``docs/agent-protocol.md``).

One :class:`AgentLink` per sandbox: a Unix-socket connection to the VM's virtio-serial
chardev, with concurrent requests multiplexed by id, streamed events delivered to the
request that asked for them, and unsolicited kernel events fanned out to subscribers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.jsonutil import json_default

log = logging.getLogger(__name__)

KernelListener = Callable[[dict[str, Any]], None]
"""Called with each unsolicited event (``kernel`` and ``context_status``) of the guest."""

# A frame can carry a whole file as base64; asyncio's default 64 KiB line limit is far too small.
_MAX_FRAME = 256 * 1024 * 1024

DEFAULT_AGENT_TIMEOUT = 30.0
"""Seconds a request may wait for its reply when its caller names no deadline."""
KERNEL_START_S = 120.0
"""How long the agent itself may take to start a kernel (docs/agent-protocol.md)."""
KERNEL_STARTING_OPS = frozenset({"ctx.create", "ctx.restart", "ctx.send"})
"""Operations that may start a kernel first: their default deadline adds ``KERNEL_START_S``."""


def default_wait(op: str, base: float = DEFAULT_AGENT_TIMEOUT) -> float:
    """The deadline of a request to ``op`` whose caller names none: ``base`` seconds, plus
    the kernel start time for the operations that may start a kernel."""
    return base + (KERNEL_START_S if op in KERNEL_STARTING_OPS else 0.0)


class AgentError(Exception):
    """The agent answered a request with an error."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(f"{type_}: {message}")
        self.type = type_
        self.message = message


class AgentUnavailable(Exception):
    """The agent cannot be reached (VM gone, or the channel closed mid-request)."""


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

    async def connect(self, timeout: float = 60.0, alive: Callable[[], bool] | None = None) -> None:
        """Connect and wait until the agent answers ``ping``.

        Retries until ``timeout``; ``alive`` (the VM process check) ends the wait early
        when the VM has exited, so a guest that never boots fails fast.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last: Exception | None = None
        while loop.time() < deadline:
            if alive is not None and not alive():
                raise AgentUnavailable("the VM exited before its agent answered")
            try:
                if not self.connected:
                    await self._open()
                # QEMU accepts the connection before the guest is up; pings sent meanwhile
                # wait in the port and are answered (then ignored) once the agent runs.
                await self.request("ping", wait=0.5)
                return
            except (OSError, AgentUnavailable, TimeoutError) as e:
                last = e
                if not self.connected:
                    await self.close()
                    await asyncio.sleep(0.02)
        await self.close()
        raise AgentUnavailable(f"the guest agent did not answer within {timeout:.0f} s ({last})")

    async def _open(self) -> None:
        self._reader, self._writer = await asyncio.open_unix_connection(
            self.socket_path, limit=_MAX_FRAME
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
        """Send one request and return its result, raising :class:`AgentError` on failure.

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
        assert self._reader is not None
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                try:
                    frame = json.loads(line)
                except ValueError:
                    log.debug("dropping unparsable frame from agent")
                    continue
                self._dispatch(frame)
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            log.debug("agent channel read failed: %s", e)
        finally:
            self._fail_all(AgentUnavailable("the connection to the guest agent was lost"))

    def _dispatch(self, frame: dict[str, Any]) -> None:
        req_id = frame.get("id")
        if req_id is None:
            for listener in list(self._listeners):
                try:
                    listener(frame)
                except Exception:
                    log.exception("agent event listener failed")
            return
        pending = self._pending.get(req_id)
        if pending is None:
            return
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
    if reply.get("ok"):
        result = reply.get("result")
        return result if isinstance(result, dict) else {}
    error = reply.get("error") or {}
    raise AgentError(str(error.get("type", "Internal")), str(error.get("message", "agent error")))
