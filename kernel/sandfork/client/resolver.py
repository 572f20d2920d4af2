"""Name resolution for the client's connections to the engine, on the caller's event loop.

Tornado resolves every address it connects to (the HTTP client opens a connection per
request) with ``loop.getaddrinfo``, which runs in a thread of asyncio's executor even for an
address that needs no lookup: the proxy kernel, which runs on one loop and no other thread,
would start one. The engine is usually a numeric address (``127.0.0.1``): that is resolved
here, on the loop, without a thread; a host name still goes to tornado's resolver.
"""

from __future__ import annotations

import socket
from typing import Any

from tornado.netutil import DefaultLoopResolver


class NumericFirstResolver(DefaultLoopResolver):
    """A numeric address at once, on the loop; a name as tornado resolves it."""

    async def resolve(
        self, host: str, port: int, family: socket.AddressFamily = socket.AF_UNSPEC
    ) -> list[tuple[int, Any]]:
        """The addresses to connect to for ``host``, ``port``."""
        try:
            found = socket.getaddrinfo(
                host, port, family, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST
            )
        except socket.gaierror:  # a name: it needs a lookup, which may block
            return await super().resolve(host, port, family)
        return [(fam, address) for fam, _, _, _, address in found]
