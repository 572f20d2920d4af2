"""The engine's side of a gateway (:mod:`sandfork.gateway`): it registers and sends heartbeats.

Every ``gateway_heartbeat_interval`` seconds the engine posts its name, its URL, its API key
(the gateway talks to it with that key) and its capacity to the gateway's
:data:`~sandfork.protocol.routes.GATEWAY_HEARTBEAT`, authenticated with its own engine key.
The first heartbeat registers it; a gateway that restarts learns it again from the next one.
A gateway that is down or refuses is logged (once per new reason) and tried again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
from typing import Any

from sandfork.client import EngineClient
from sandfork.engine.config import EngineConfig
from sandfork.engine.limits import host_memory_available
from sandfork.engine.sandboxes import SandboxService
from sandfork.protocol import SandboxStatus, SandforkError, routes

log = logging.getLogger(__name__)

_MIB = 2**20


def capacity(sandboxes: SandboxService) -> dict[str, Any]:
    """What the engine can still take: memory under its cap, sandboxes under its limit, and
    what runs them."""
    alive = [r for r in sandboxes.all() if r.status is not SandboxStatus.DEAD]
    limits = sandboxes.limits
    backends = sandboxes.backends
    default = backends[backends.default]
    return {
        "memory_free_mb": limits.total_memory_mb - sum(r.memory_mb for r in alive),
        "host_memory_available_mb": host_memory_available() // _MIB,
        "sandboxes": len(alive),
        "max_sandboxes": limits.max_sandboxes,
        "backend": default.name,
        "accelerator": default.accelerator,
    }


class GatewayLink:
    """The heartbeats of one engine to its gateway (:meth:`run` until cancelled)."""

    def __init__(
        self, config: EngineConfig, engine_url: str, api_key: str, sandboxes: SandboxService
    ) -> None:
        self._gateway = EngineClient(config.gateway_url, config.gateway_key, timeout=10.0)
        self._interval = float(config.gateway_heartbeat_interval)
        self._identity = {
            "name": config.gateway_engine_name or socket.gethostname(),
            "url": config.gateway_engine_url or engine_url,
            "api_key": api_key,
            "instance": secrets.token_hex(8),  # this run of the engine: a restart is new
            "interval": self._interval,
        }
        self._sandboxes = sandboxes
        self._url = config.gateway_url
        self._registered = False
        self._last_failure: str | None = None

    async def run(self) -> None:
        """Send a heartbeat every interval, for ever."""
        while True:
            await self.beat()
            await asyncio.sleep(self._interval)

    async def beat(self) -> None:
        """One heartbeat; a failure is logged when it differs from the last one."""
        body = {**self._identity, "capacity": capacity(self._sandboxes)}
        try:
            await self._gateway.request("POST", routes.GATEWAY_HEARTBEAT, json=body)
        except SandforkError as e:
            if str(e) != self._last_failure:
                log.warning("gateway %s refused or did not answer: %s", self._url, e)
            self._last_failure = str(e)
            return
        if not self._registered or self._last_failure is not None:
            log.info("registered with the gateway %s as %r", self._url, self._identity["name"])
        self._registered, self._last_failure = True, None
