"""The ZMQ side of the proxy kernel: the five sockets of the connection file, relayed to a
sandbox's code context through a :class:`~sandfork.kernel.link.SandboxLink`.

Messages are verified with the connection file's key and re-signed with it on the way back;
the guest's messages keep their ids and parents, so replies route to the client that asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.session import Session
from tornado.httpclient import HTTPClientError

from sandfork.kernel import magics
from sandfork.kernel.link import SandboxLink, decode_buffers
from sandfork.sdk import Sandbox, SandforkError

log = logging.getLogger(__name__)

_RECONNECT_FOR = 60.0  # seconds the kernel tries to get its channels back after a drop


@dataclass
class Attachment:
    """The sandbox the kernel runs in, and whether the kernel created it (and may kill it)."""

    sandbox: Sandbox
    context: str
    owned: bool

    def save(self, path: Path) -> None:
        """Remember the attachment for the process a restart starts next."""
        data = {"sandbox_id": self.sandbox.id, "context": self.context, "owned": self.owned}
        path.write_text(json.dumps(data))


class KernelProxy:
    """Relays one Jupyter connection file's sockets to a sandbox's code context."""

    def __init__(self, connection: dict[str, Any], attachment: Attachment, state: Path) -> None:
        self.attachment = attachment
        self.state = state
        self.session = Session(
            key=connection["key"].encode(),
            signature_scheme=connection.get("signature_scheme", "hmac-sha256"),
            username="sandfork",
        )
        self._zmq = zmq.asyncio.Context()
        self._sockets: dict[str, zmq.asyncio.Socket] = {}
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
        self._link = self._new_link()
        self._stop = asyncio.Event()
        self._closing = False  # a shutdown request is being served

    def _new_link(self) -> SandboxLink:
        sandbox = self.attachment.sandbox
        return SandboxLink(sandbox.client, sandbox.id, self.attachment.context, self._from_guest)

    # -- running -------------------------------------------------------------------------

    async def run(self) -> None:
        """Relay until a shutdown request (or :meth:`stop`)."""
        await self._link.open()
        self.attachment.save(self.state)
        tasks = [
            asyncio.create_task(self._serve_shell()),
            asyncio.create_task(self._serve_control()),
            asyncio.create_task(self._serve_stdin()),
            asyncio.create_task(self._serve_heartbeat()),
            asyncio.create_task(self._keep_linked()),
        ]
        try:
            await self._stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._link.close()
            for sock in self._sockets.values():
                sock.close()
            self._zmq.term()

    def stop(self) -> None:
        """End :meth:`run`."""
        self._stop.set()

    async def _receive(self, channel: str) -> tuple[list[bytes], dict[str, Any]] | None:
        frames = await self._sockets[channel].recv_multipart(copy=True)
        idents, parts = self.session.feed_identities(frames, copy=True)
        try:
            return idents, self.session.deserialize(parts, content=True, copy=True)
        except ValueError as e:
            log.warning("dropping a %s message that does not verify: %s", channel, e)
            return None

    async def _forward(self, channel: str, idents: list[bytes], msg: dict[str, Any]) -> None:
        if msg["header"]["msg_type"].endswith("_request"):
            self._routes[msg["header"]["msg_id"]] = idents
        try:
            await self._link.send(channel, msg, msg.get("buffers", []))
        except ConnectionError as e:
            await self._reply_unreachable(channel, idents, msg, str(e))

    async def _serve_shell(self) -> None:
        while True:
            received = await self._receive("shell")
            if received is None:
                continue
            idents, msg = received
            if msg["header"]["msg_type"] == "execute_request":
                await self._apply_magic(msg)
            await self._forward("shell", idents, msg)

    async def _serve_stdin(self) -> None:
        while True:
            received = await self._receive("stdin")
            if received is not None:
                await self._forward("stdin", *received)

    async def _serve_control(self) -> None:
        while True:
            received = await self._receive("control")
            if received is None:
                continue
            idents, msg = received
            kind = msg["header"]["msg_type"]
            if kind == "interrupt_request":
                await self._interrupt(idents, msg)
            elif kind == "shutdown_request":
                await self._shutdown(idents, msg)
            else:
                await self._forward("control", idents, msg)

    async def _serve_heartbeat(self) -> None:
        """Echo pings only while the sandbox's channels are up: the heartbeat is its health."""
        hb = self._sockets["hb"]
        while True:
            frames = await hb.recv_multipart()
            if self._link.connected:
                await hb.send_multipart(frames)

    # -- control -------------------------------------------------------------------------

    async def _interrupt(self, idents: list[bytes], msg: dict[str, Any]) -> None:
        content: dict[str, Any] = {"status": "ok"}
        try:
            await self._link.interrupt()
        except SandforkError as e:
            content = {"status": "error", "ename": "InterruptFailed", "evalue": str(e)}
            content["traceback"] = []
        self._send("control", "interrupt_reply", content, msg, idents)

    async def _shutdown(self, idents: list[bytes], msg: dict[str, Any]) -> None:
        """``restart``: a fresh guest kernel in the same sandbox, for the next process.

        Otherwise the sandbox is killed, unless it is persistent or not the kernel's own.
        """
        restart = bool(msg["content"].get("restart"))
        sandbox = self.attachment.sandbox
        self._closing = True
        try:
            if restart:
                await self._link.restart()
                self.attachment.save(self.state)
            else:
                self.state.unlink(missing_ok=True)
                if self.attachment.owned and not sandbox.persistent:
                    await self._link.close()
                    await asyncio.to_thread(sandbox.kill)
        except SandforkError as e:
            log.warning("shutdown of sandbox %s: %s", sandbox.id, e)
        self._send("control", "shutdown_reply", {"status": "ok", "restart": restart}, msg, idents)
        self._publish("shutdown_reply", {"status": "ok", "restart": restart}, msg)
        self.stop()

    # -- magics --------------------------------------------------------------------------

    async def _apply_magic(self, msg: dict[str, Any]) -> None:
        parsed = magics.parse(msg["content"].get("code", ""))
        if parsed is None:
            return
        outcome: magics.Outcome | magics.MagicError
        try:
            outcome = await asyncio.to_thread(magics.run, *parsed, self.attachment.sandbox)
        except magics.MagicError as e:
            outcome = e
        if isinstance(outcome, magics.Outcome) and outcome.sandbox is not None:
            await self._repoint(outcome.sandbox)
        msg["content"]["code"] = magics.stand_in(outcome)

    async def _repoint(self, sandbox: Sandbox) -> None:
        """Run on ``sandbox`` from now on; the previous one goes if it was the kernel's own."""
        old = self.attachment
        self.attachment = Attachment(sandbox, old.context, owned=True)
        previous, self._link = self._link, self._new_link()
        await previous.close()
        await self._link.open()
        self.attachment.save(self.state)
        if old.owned and not old.sandbox.persistent:
            with contextlib.suppress(SandforkError):
                await asyncio.to_thread(old.sandbox.kill)

    # -- from the guest --------------------------------------------------------------------

    def _from_guest(self, frame: dict[str, Any]) -> None:
        channel = frame.pop("channel", "iopub")
        buffers = decode_buffers(frame.pop("buffers", None) or [])
        msg_type = frame["header"].get("msg_type", "")
        if channel == "iopub":
            topic = f"kernel.sandfork.{msg_type}".encode()
            self._emit("iopub", frame, [topic], buffers)
            return
        parent = (frame.get("parent_header") or {}).get("msg_id", "")
        idents = self._routes.get(parent)
        if idents is None:
            log.debug("no client for a %s %s", channel, msg_type)
            return
        if channel in ("shell", "control") and msg_type.endswith("_reply"):
            del self._routes[parent]
        self._emit(channel, frame, idents, buffers)

    def _emit(
        self, channel: str, msg: dict[str, Any], idents: list[bytes], buffers: list[bytes]
    ) -> None:
        frames = self.session.serialize(msg, idents)
        self._sockets[channel].send_multipart([*frames, *buffers], copy=True)

    def _send(
        self,
        channel: str,
        msg_type: str,
        content: dict[str, Any],
        parent: dict[str, Any],
        idents: list[bytes],
    ) -> None:
        msg = self.session.msg(msg_type, content, parent=parent["header"])
        self._emit(channel, msg, idents, [])

    def _publish(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
        self._send("iopub", msg_type, content, parent, [f"kernel.sandfork.{msg_type}".encode()])

    async def _reply_unreachable(
        self, channel: str, idents: list[bytes], msg: dict[str, Any], reason: str
    ) -> None:
        """Answer a request the sandbox cannot get, so that no client waits for ever."""
        self._routes.pop(msg["header"]["msg_id"], None)
        kind = msg["header"]["msg_type"]
        if not kind.endswith("_request") or channel == "stdin":
            return
        evalue = f"the sandbox {self.attachment.sandbox.id} cannot be reached: {reason}"
        error = {"ename": "SandboxUnavailable", "evalue": evalue, "traceback": [evalue]}
        self._publish("status", {"execution_state": "busy"}, msg)
        if kind == "execute_request":
            self._publish("error", error, msg)
        self._publish("status", {"execution_state": "idle"}, msg)
        self._send(
            channel, kind[: -len("request")] + "reply", {"status": "error", **error}, msg, idents
        )

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
                except HTTPClientError as e:
                    if e.code == 404:  # the sandbox was deleted: nothing to wait for
                        break
                    await asyncio.sleep(1.0)
                except OSError as e:
                    log.debug("reconnect failed: %s", e)
                    await asyncio.sleep(1.0)
            if link is self._link and not link.connected:
                reason = f"sandbox {link.sandbox_id} is gone; restart the kernel"
                log.error(reason)
                self._publish("stream", {"name": "stderr", "text": reason + "\n"}, _no_parent())
                self._publish("status", {"execution_state": "dead"}, _no_parent())
                return


def _no_parent() -> dict[str, Any]:
    return {"header": {}}
