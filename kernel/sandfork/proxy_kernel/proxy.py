"""The ZMQ side of the proxy kernel: the five sockets of the connection file, relayed to a
sandbox's code context through a :class:`~sandfork.proxy_kernel.link.SandboxLink`.

Messages are verified with the connection file's key and re-signed with it on the way back;
the guest's messages keep their ids and parents, so replies route to the client that asked.

The relay is synchronous wherever it can be: the sockets are drained by event-loop reader
callbacks and a message goes on to the WebSocket in the same callback (its JSON parts spliced in
as they are), and the guest's frames go out on ZMQ in tornado's read callback. Only requests
the proxy handles itself (magics, interrupt, shutdown) run as tasks, and their channel waits
for them, so that messages keep their order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, cast

import zmq
from jupyter_client.session import DELIM

from sandfork.proxy_kernel import magics
from sandfork.proxy_kernel.checkpoints import CellCheckpoints
from sandfork.proxy_kernel.lease import keep_leased, renew
from sandfork.proxy_kernel.link import GuestMessage, SandboxLink
from sandfork.proxy_kernel.session import RelaySession, Request
from sandfork.proxy_kernel.state import Attachment
from sandfork.sdk import Sandbox, SandforkError

log = logging.getLogger(__name__)

_RECONNECT_FOR = 60.0  # seconds the kernel tries to get its channels back after a drop


class KernelProxy:
    """Relays one Jupyter connection file's sockets to a sandbox's code context.

    While it runs, it renews the lease (``lease_seconds``) of the sandbox it owns.
    """

    def __init__(
        self,
        connection: dict[str, Any],
        attachment: Attachment,
        state: Path,
        lease_seconds: float,
        checkpoints: CellCheckpoints | None = None,
    ) -> None:
        self.attachment = attachment
        self.checkpoints = checkpoints or CellCheckpoints()
        self.state = state
        self.lease_seconds = lease_seconds
        self.session = RelaySession(
            key=connection["key"].encode(),
            signature_scheme=connection.get("signature_scheme", "hmac-sha256"),
            username="sandfork",
        )
        self._zmq = zmq.Context()
        self._sockets: dict[str, zmq.Socket[bytes]] = {}
        kinds = {
            "shell": zmq.ROUTER,
            "control": zmq.ROUTER,
            "stdin": zmq.ROUTER,
            "iopub": zmq.PUB,
            "hb": zmq.ROUTER,
        }
        base = f"{connection['transport']}://{connection['ip']}"
        for name, kind in kinds.items():
            sock = self._zmq.socket(kind)
            sock.linger = 1000
            sock.bind(f"{base}:{connection[name + '_port']}")
            self._sockets[name] = sock
        self._routes: dict[str, list[bytes]] = {}  # request msg_id -> client identities
        self._held: dict[str, asyncio.Task[None]] = {}  # channel -> the request it waits for
        self._link = self._new_link()
        self._stop = asyncio.Event()
        self._closing = False  # a shutdown request is being served (or SIGTERM)
        self._restarting = False  # ... one with restart: the next process takes the sandbox
        self._ending: asyncio.Task[None] | None = None  # the end SIGTERM asked for

    def _new_link(self) -> SandboxLink:
        sandbox = self.attachment.sandbox
        return SandboxLink(
            sandbox.client.aio, sandbox.id, self.attachment.context, self._from_guest
        )

    # -- running -------------------------------------------------------------------------

    async def run(self) -> None:
        """Relay until a shutdown request (or :meth:`stop`)."""
        await self._link.open()
        sandbox = self._leased_sandbox()
        if sandbox is not None:  # the kernel's own lease, in force before it says it attached
            try:
                await asyncio.to_thread(renew, sandbox, self.lease_seconds)
            except SandforkError as e:
                log.warning("could not take the lease of sandbox %s: %s", sandbox.id, e)
        self.attachment.save(self.state)
        loop = asyncio.get_running_loop()
        for channel in ("shell", "control", "stdin", "hb"):
            loop.add_reader(self._sockets[channel].FD, self._drain, channel)
        keep_linked = asyncio.create_task(self._keep_linked())
        leased = asyncio.create_task(keep_leased(self._leased_sandbox, self.lease_seconds))
        try:
            await self._stop.wait()
        finally:
            for channel in ("shell", "control", "stdin", "hb"):
                loop.remove_reader(self._sockets[channel].FD)
            tasks = [keep_linked, leased, *self._held.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._link.close()
            for sock in self._sockets.values():
                sock.close()
            self._zmq.term()

    def stop(self) -> None:
        """End :meth:`run`."""
        self._stop.set()

    def terminate(self) -> None:
        """SIGTERM: end now, killing the kernel's own sandbox first.

        Not when a restart is under way (jupyter_client sends SIGTERM to a kernel slow to
        restart): the sandbox is then the next process's; nor twice.
        """
        if self._ending is None:
            self._ending = asyncio.create_task(self._end())

    async def _end(self) -> None:
        if self._closing and not self._restarting:
            return  # a shutdown request is killing the sandbox and then stops the relay
        if self._restarting or self._restart_requested():
            self.stop()
            return
        self._closing = True
        self._link.close()
        sandbox = self.attachment.sandbox
        if self.attachment.leased:
            try:
                await asyncio.to_thread(sandbox.kill)
            except SandforkError as e:
                log.warning("could not kill sandbox %s: %s", sandbox.id, e)
        if self.attachment.owned:
            self.state.unlink(missing_ok=True)
        self.stop()

    def _restart_requested(self) -> bool:
        """True if a restart's shutdown request waits unread on the control channel (read
        while the channel waits for an interrupt, say); the messages are ours to drop."""
        sock = self._sockets["control"]
        while cast(int, sock.get(zmq.EVENTS)) & zmq.POLLIN:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            try:
                request = self.session.receive("control", frames)
                if request.header["msg_type"] == "shutdown_request":
                    return bool(request.content().get("restart"))
            except (ValueError, TypeError, KeyError):
                continue
        return False

    def _leased_sandbox(self) -> Sandbox | None:
        """The sandbox whose lease the kernel keeps, if it keeps one now."""
        return None if self._closing or not self.attachment.leased else self.attachment.sandbox

    def _drain(self, channel: str) -> None:
        """Handle every message waiting on ``channel`` (ZMQ's descriptor is edge-triggered:
        it wakes us once for any number of messages, and a send on the socket can eat it)."""
        sock = self._sockets[channel]
        while not self._stop.is_set() and cast(int, sock.get(zmq.EVENTS)) & zmq.POLLIN:
            if channel in self._held:  # the wake-up is taken all the same: no busy loop
                return
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            if channel == "hb":  # echoed only while the sandbox's channels are up: its health
                if self._link.connected:
                    sock.send_multipart(frames)
                continue
            try:
                request = self.session.receive(channel, frames)
            except (ValueError, TypeError, KeyError) as e:
                log.warning("dropping a malformed or unsigned %s message: %s", channel, e)
                continue
            work = self._handle(request)
            if work is not None:
                self._hold(channel, work)

    def _handle(self, request: Request) -> Coroutine[Any, Any, None] | None:
        """Forward a client's message, or return the work of one the proxy answers itself."""
        kind = request.header["msg_type"]
        if request.channel == "control" and kind == "interrupt_request":
            return self._interrupt(request)
        if request.channel == "control" and kind == "shutdown_request":
            return self._shutdown(request)
        if kind == "execute_request":
            content = request.content()
            magic = magics.parse(content.get("code", ""))
            if magic is not None:
                return self._run_magic(request, magic)
            metadata = json.loads(request.parts[2])
            self.checkpoints.started(request.header["msg_id"], content.get("code", ""), metadata)
        self._forward(request)
        return None

    def _hold(self, channel: str, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work``; ``channel`` is not read until it is done."""
        task = asyncio.create_task(work)
        self._held[channel] = task

        def release(_: asyncio.Task[None]) -> None:
            del self._held[channel]
            if not task.cancelled() and task.exception() is not None:
                log.error("handling a %s request failed", channel, exc_info=task.exception())
            self._drain(channel)

        task.add_done_callback(release)

    def _forward(self, request: Request) -> None:
        if request.header["msg_type"].endswith("_request"):
            self._routes[request.header["msg_id"]] = request.idents
        try:
            self._link.send(request.channel, request.parts, request.buffers)
        except ConnectionError as e:
            self._reply_unreachable(request, str(e))

    # -- control -------------------------------------------------------------------------

    async def _interrupt(self, request: Request) -> None:
        content: dict[str, Any] = {"status": "ok"}
        try:
            await self._link.interrupt()
        except SandforkError as e:
            content = {"status": "error", "ename": "InterruptFailed", "evalue": str(e)}
            content["traceback"] = []
        self._reply(request, "interrupt_reply", content)

    async def _shutdown(self, request: Request) -> None:
        """``restart``: a fresh guest kernel in the same sandbox, for the next process.

        Otherwise the sandbox is killed, unless it is persistent or not the kernel's own.
        """
        restart = bool(request.content().get("restart"))
        sandbox = self.attachment.sandbox
        self._closing, self._restarting = True, restart
        try:
            if restart:
                await self._link.restart()
                self.attachment.save(self.state)
            else:
                self.state.unlink(missing_ok=True)
                if self.attachment.owned and not sandbox.persistent:
                    self._link.close()
                    await asyncio.to_thread(sandbox.kill)
        except SandforkError as e:
            log.warning("shutdown of sandbox %s: %s", sandbox.id, e)
        self._reply(request, "shutdown_reply", {"status": "ok", "restart": restart})
        self._publish("shutdown_reply", {"status": "ok", "restart": restart}, request.header)
        self.stop()

    # -- magics --------------------------------------------------------------------------

    async def _run_magic(self, request: Request, magic: magics.Magic) -> None:
        """Run a proxy magic, then have the guest run its stand-in in the request's place."""
        outcome: magics.Outcome | magics.MagicError
        try:
            lease = self.lease_seconds  # a restored sandbox is the kernel's own: leased
            sandbox, checkpoints = self.attachment.sandbox, self.checkpoints
            outcome = await asyncio.to_thread(magics.run, magic, sandbox, lease, checkpoints)
        except magics.MagicError as e:
            outcome = e
        if isinstance(outcome, magics.Outcome) and outcome.sandbox is not None:
            await self._repoint(outcome.sandbox)
        content = {**request.content(), "code": magics.stand_in(magic, outcome)}
        request.parts[3] = self.session.pack(content)
        self._forward(request)

    async def _repoint(self, sandbox: Sandbox) -> None:
        """Run on ``sandbox`` from now on; the previous one goes if it was the kernel's own."""
        old = self.attachment
        self.attachment = Attachment(sandbox, old.context, owned=True)
        previous, self._link = self._link, self._new_link()
        previous.close()
        try:
            await self._link.open()
        except SandforkError as e:  # _keep_linked tries again
            log.warning("cannot reach sandbox %s yet: %s", sandbox.id, e)
        self.attachment.save(self.state)
        if old.owned and not old.sandbox.persistent:
            with contextlib.suppress(SandforkError):
                await asyncio.to_thread(old.sandbox.kill)

    # -- from the guest --------------------------------------------------------------------

    def _from_guest(self, message: GuestMessage) -> None:
        msg_type = message.header.get("msg_type", "")
        if message.channel == "iopub":
            self._relay("iopub", [f"kernel.sandfork.{msg_type}".encode()], message)
            return
        parent = message.parent_header.get("msg_id", "")
        idents = self._routes.get(parent)
        if idents is None:
            log.debug("no client for a %s %s", message.channel, msg_type)
            return
        if message.channel in ("shell", "control") and msg_type.endswith("_reply"):
            del self._routes[parent]
        self._relay(message.channel, idents, message)
        if msg_type == "execute_reply":
            metadata = self.checkpoints.finished(parent, message.parts[3])
            if metadata is not None and "shell" not in self._held:
                # The next request waits for the checkpoint: it holds this cell's state.
                self._hold("shell", self._checkpoint(metadata))

    async def _checkpoint(self, metadata: dict[str, str]) -> None:
        sandbox = self.attachment.sandbox
        try:
            await asyncio.to_thread(self.checkpoints.take, sandbox, metadata)
        except SandforkError as e:
            log.warning("the checkpoint of sandbox %s failed: %s", sandbox.id, e)

    def _relay(self, channel: str, idents: list[bytes], message: GuestMessage) -> None:
        """Send the guest's message on, its JSON as it came, signed with the client's key."""
        signature = self.session.sign(message.parts)
        self._send(channel, [*idents, DELIM, signature, *message.parts, *message.buffers])

    def _emit(self, channel: str, msg: dict[str, Any], idents: list[bytes]) -> None:
        self._send(channel, self.session.serialize(msg, idents))

    def _send(self, channel: str, frames: list[bytes]) -> None:
        self._sockets[channel].send_multipart(frames, copy=False)
        if channel != "iopub":  # a send can swallow the wake-up of a message waiting to be read
            asyncio.get_running_loop().call_soon(self._drain, channel)

    def _reply(self, request: Request, msg_type: str, content: dict[str, Any]) -> None:
        msg = self.session.msg(msg_type, content, parent=request.header)
        self._emit(request.channel, msg, request.idents)

    def _publish(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
        msg = self.session.msg(msg_type, content, parent=parent)
        self._emit("iopub", msg, [f"kernel.sandfork.{msg_type}".encode()])

    def _reply_unreachable(self, request: Request, reason: str) -> None:
        """Answer a request the sandbox cannot get, so that no client waits for ever."""
        self._routes.pop(request.header["msg_id"], None)
        kind = request.header["msg_type"]
        if not kind.endswith("_request") or request.channel == "stdin":
            return
        evalue = f"the sandbox {self.attachment.sandbox.id} cannot be reached: {reason}"
        error = {"ename": "SandboxUnavailable", "evalue": evalue, "traceback": [evalue]}
        self._publish("status", {"execution_state": "busy"}, request.header)
        if kind == "execute_request":
            self._publish("error", error, request.header)
        self._publish("status", {"execution_state": "idle"}, request.header)
        self._reply(request, kind[: -len("request")] + "reply", {"status": "error", **error})

    # -- staying connected -----------------------------------------------------------------

    async def _keep_linked(self) -> None:
        """Reopen dropped channels (an engine restart); say so when the sandbox is gone."""
        while True:
            link = self._link
            await link.closed.wait()
            if self._closing:
                return
            if link is not self._link:  # re-pointed by %restore
                continue
            log.warning("lost the channels of sandbox %s; reconnecting", link.sandbox_id)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + _RECONNECT_FOR
            while link is self._link and not link.connected and loop.time() < deadline:
                try:
                    await link.open()
                except SandforkError as e:
                    # 404: deleted; 409: its VM died (an engine answers only once it has
                    # adopted its running sandboxes): either way there is nothing to wait for
                    if e.status in (404, 409):
                        break
                    log.debug("reconnect failed: %s", e)
                    await asyncio.sleep(1.0)
            if link is self._link and not link.connected:
                reason = f"sandbox {link.sandbox_id} is gone; restart the kernel"
                log.error(reason)
                self._publish("stream", {"name": "stderr", "text": reason + "\n"}, {})
                self._publish("status", {"execution_state": "dead"}, {})
                return
