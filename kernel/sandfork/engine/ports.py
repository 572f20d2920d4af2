"""A sandbox's ports: the servers listening in it, and a stream to one of them.

The engine reaches a port through the sandbox's own channel (``CONNECT``,
:meth:`~sandfork.engine.egress_tunnel.EgressTunnel.connect`): the guest's agent connects to
the port on the guest's loopback, so a server in the sandbox is reachable from the host
while the guest still reaches nothing on the host, and no host port is opened for it.
The listening ports are the agent's answer (:mod:`sandfork.agent.ports`; guest code can make
it say anything, about its own sandbox only).
"""

from __future__ import annotations

import asyncio

from sandfork.engine import replies
from sandfork.engine.egress_stream import TunnelStream
from sandfork.engine.egress_tunnel import PortUnreachable
from sandfork.engine.errors import ApiError, BadRequest, Conflict
from sandfork.engine.live import agent_failures
from sandfork.engine.sandboxes import SandboxService
from sandfork.protocol import SandboxStatus

_ANSWER_S = 30.0  # for the agent to connect (it tries 10 s on each loopback address)


class PortRefused(ApiError):
    """Nothing answers on the port asked for, or the sandbox cannot be reached (502)."""

    status = 502


def port_number(text: str) -> int:
    """A port of a URL path, 1 to 65535; a 400 otherwise."""
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise BadRequest(f"a port is a number from 1 to 65535, not {text[:16]!r}")
    return int(text)


def _resting(status: SandboxStatus) -> bool:
    return status.is_hibernated or status is SandboxStatus.PAUSED


async def list_ports(sandboxes: SandboxService, sandbox_id: str, wait: float) -> list[int]:
    """The ports a server listens on in the sandbox now (the agent's ``ports``): none while it
    hibernates or is paused. A listing never wakes a sandbox (JupyterLab's side panel lists
    the ports of the current notebook's sandbox at every change it hears of)."""
    if _resting(sandboxes.get(sandbox_id).status):
        return []
    async with sandboxes.activity.operation(sandbox_id):
        try:
            live = sandboxes.live(sandbox_id)
        except Conflict:
            if _resting(sandboxes.get(sandbox_id).status):  # meanwhile
                return []
            raise
        with agent_failures(live.record):
            return replies.ports(await live.instance.agent.request("ports", {}, wait=wait))


async def open_port(sandboxes: SandboxService, sandbox_id: str, port: int) -> TunnelStream:
    """A stream to ``port`` of the sandbox (it is woken if it hibernates); a 502 saying why
    when nothing answers there."""
    async with sandboxes.working(sandbox_id) as live:
        if live.egress is None:
            raise PortRefused(f"sandbox {sandbox_id} has no channel for its ports")
        try:
            return await asyncio.wait_for(live.egress.connect(port), _ANSWER_S)
        except PortUnreachable as e:
            raise PortRefused(f"sandbox {sandbox_id}, port {port}: {e}") from None
        except TimeoutError:
            raise PortRefused(
                f"sandbox {sandbox_id}, port {port}: no answer from its agent in {_ANSWER_S:g} s"
            ) from None
