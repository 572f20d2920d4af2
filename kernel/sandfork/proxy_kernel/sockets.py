"""The kernel's five ZMQ sockets of a connection file, and the messages the proxy sends on
them itself (replies, iopub messages) or passes on from the guest (re-signed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import zmq
from jupyter_client.session import DELIM

from sandfork.proxy_kernel.link import GuestMessage
from sandfork.proxy_kernel.session import RelaySession, Request

_KINDS = {
    "shell": zmq.ROUTER,
    "control": zmq.ROUTER,
    "stdin": zmq.ROUTER,
    "iopub": zmq.PUB,
    "hb": zmq.ROUTER,
}


class KernelSockets:
    """The sockets of ``connection``, bound; ``sent(channel)`` is called after a send on a
    channel clients write to (a send can swallow the wake-up of a message waiting there)."""

    def __init__(self, connection: dict[str, Any], sent: Callable[[str], None]) -> None:
        self.session = RelaySession(
            key=connection["key"].encode(),
            signature_scheme=connection.get("signature_scheme", "hmac-sha256"),
            username="sandfork",
        )
        self._sent = sent
        self._zmq = zmq.Context()
        self.sockets: dict[str, zmq.Socket[bytes]] = {}
        base = f"{connection['transport']}://{connection['ip']}"
        for name, kind in _KINDS.items():
            sock = self._zmq.socket(kind)
            sock.linger = 1000
            if kind == zmq.ROUTER:
                # Clients of one kernel manager share its session id as their identity: a
                # client made as another stops comes back under an identity the router may
                # still hold, and without handover it ignores the newcomer for good.
                sock.router_handover = 1
            sock.bind(f"{base}:{connection[name + '_port']}")
            self.sockets[name] = sock

    def close(self) -> None:
        """Close the sockets."""
        for sock in self.sockets.values():
            sock.close()
        self._zmq.term()

    def restart_requested(self) -> bool:
        """True if a restart's shutdown request waits unread on the control channel (read
        while the channel waits for an interrupt, say); the messages are ours to drop."""
        sock = self.sockets["control"]
        while cast(int, sock.get(zmq.EVENTS)) & zmq.POLLIN:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            try:
                request = self.session.receive("control", frames)
                if request.header["msg_type"] == "shutdown_request":
                    return bool(request.content().get("restart"))
            except (ValueError, TypeError, KeyError):
                continue
        return False

    def relay(self, channel: str, idents: list[bytes], message: GuestMessage) -> None:
        """Send the guest's message on, its JSON as it came, signed with the client's key."""
        signature = self.session.sign(message.parts)
        self._send(channel, [*idents, DELIM, signature, *message.parts, *message.buffers])

    def reply(self, request: Request, msg_type: str, content: dict[str, Any]) -> None:
        """Answer ``request`` on its channel."""
        msg = self.session.msg(msg_type, content, parent=request.header)
        self._send(request.channel, self.session.serialize(msg, request.idents))

    def publish(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
        """Send an iopub message."""
        msg = self.session.msg(msg_type, content, parent=parent)
        self._send("iopub", self.session.serialize(msg, [f"kernel.sandfork.{msg_type}".encode()]))

    def unreachable(self, request: Request, evalue: str) -> None:
        """Answer a request the sandbox cannot get with an error, so no client waits for ever."""
        kind = request.header["msg_type"]
        if not kind.endswith("_request") or request.channel == "stdin":
            return
        error = {"ename": "SandboxUnavailable", "evalue": evalue, "traceback": [evalue]}
        self.publish("status", {"execution_state": "busy"}, request.header)
        if kind == "execute_request":
            self.publish("error", error, request.header)
        self.publish("status", {"execution_state": "idle"}, request.header)
        self.reply(request, kind[: -len("request")] + "reply", {"status": "error", **error})

    def _send(self, channel: str, frames: list[bytes]) -> None:
        self.sockets[channel].send_multipart(frames, copy=False)
        if channel != "iopub":
            asyncio.get_running_loop().call_soon(self._sent, channel)
