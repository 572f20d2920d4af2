"""How the proxy kernel says which sandbox it runs in: through the Jupyter protocol.

Every ``kernel_info_reply`` of the proxy kernel carries a ``"sandfork"`` object (see
:func:`describe`): the sandbox and code context the kernel uses now, whether it owns the
sandbox, and its per-cell checkpoints. A ``kernel_info_request`` on the shell channel goes to
the guest kernel, whose reply gets the object on the way back; one on the control channel is
answered by the proxy itself with the guest's last reply (once it has seen one), so that asking
neither waits for a running cell nor wakes a hibernated sandbox. That is how the Jupyter server
extension, and ``sandfork lab``, find a kernel's sandbox wherever the kernel runs.

The proxy kernel binds its ports once it has attached to its sandbox: while nothing listens on
the control port, it is starting (or gone), and :func:`ask` says so at once; once something
listens, the answer is waited for as long as a hang allows, never for a guessed speed (a loaded
machine may leave the kernel unscheduled for seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
from collections.abc import Callable
from typing import Any

from jupyter_client.asynchronous import AsyncKernelClient

from sandfork.proxy_kernel.link import GuestMessage
from sandfork.proxy_kernel.session import Request
from sandfork.proxy_kernel.sockets import KernelSockets

ASK_TIMEOUT = 60.0  # seconds a kernel serving its ports may take to answer: a hang's bound
KEY = "sandfork"  # the kernel_info_reply's field
REQUEST = "kernel_info_request"
REPLY = "kernel_info_reply"


def describe(
    sandbox_id: str, context: str, owned: bool, checkpoints: dict[str, Any]
) -> dict[str, Any]:
    """The ``"sandfork"`` object: ``sandbox_id``, ``context``, ``owned`` (the kernel kills the
    sandbox at shutdown unless it is persistent) and ``checkpoints`` (``enabled``, ``kept``,
    ``lineage``)."""
    return {
        "sandbox_id": sandbox_id,
        "context": context,
        "owned": owned,
        "checkpoints": checkpoints,
    }


class KernelInfo:
    """The guest kernel's info, as last relayed, and the proxy's additions to it."""

    def __init__(self) -> None:
        self.guest: dict[str, Any] | None = None  # the guest's last kernel_info_reply content

    def relayed(self, message: GuestMessage, sandfork: dict[str, Any]) -> None:
        """Add ``sandfork`` to a guest's ``kernel_info_reply`` on its way to the client (its
        content is re-encoded: a rare message), and remember the guest's info."""
        content = json.loads(message.parts[3])
        content.pop(KEY, None)
        self.guest = content
        message.parts[3] = json.dumps({**content, KEY: sandfork}).encode()

    def answer(
        self, request: Request, sockets: KernelSockets, sandfork: Callable[[], dict[str, Any]]
    ) -> bool:
        """Answer a ``kernel_info_request`` on the control channel with the guest's info and
        ``sandfork()``; False for another request, or before the guest's info was relayed
        (the guest answers then, and its answer is kept)."""
        kind = request.header["msg_type"]
        if request.channel != "control" or kind != REQUEST or self.guest is None:
            return False
        sockets.reply(request, REPLY, {**self.guest, KEY: sandfork()})
        return True


async def serving(client: AsyncKernelClient) -> bool:
    """Whether something listens on the control port of the kernel ``client`` reaches
    (always true for another transport than TCP: nothing to probe)."""
    if client.transport != "tcp" or not client.control_port:
        return True
    try:
        _, writer = await asyncio.open_connection(client.ip, client.control_port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def ask(client: AsyncKernelClient, timeout: float = ASK_TIMEOUT) -> dict[str, Any] | None:
    """The ``"sandfork"`` object of the kernel ``client`` reaches (its control channel
    started), asked on the control channel; None at once if the kernel serves no port (it is
    starting, restarting or gone), else None if it did not answer within ``timeout`` seconds
    (hung) or is not a Sandfork kernel."""
    if not await serving(client):
        return None
    msg = client.session.msg(REQUEST)
    client.control_channel.send(msg)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (left := deadline - loop.time()) > 0:
        try:
            reply: dict[str, Any] = await client.control_channel.get_msg(timeout=left)
        except queue.Empty:
            return None
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return sandbox_of(reply)
    return None


def sandbox_of(reply: dict[str, Any]) -> dict[str, Any] | None:
    """The ``"sandfork"`` object of a ``kernel_info_reply`` (see :func:`describe`), or None
    if the kernel did not send one (it is not a Sandfork kernel)."""
    found = reply.get("content", {}).get(KEY)
    return found if isinstance(found, dict) else None
