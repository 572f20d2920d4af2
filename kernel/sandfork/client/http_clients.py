"""Tornado HTTP clients of our own, one per event loop and size: not tornado's process-wide
shared client, whose limits (10 connections, 100 MB bodies) and executor-thread resolver
every other user of the loop would share. The engine's clients and the gateway use them."""

from __future__ import annotations

import asyncio
import weakref

from tornado.httpclient import AsyncHTTPClient

from sandfork.client.resolver import NumericFirstResolver

MAX_BODY = 1 << 40  # the far end bounds what it sends; tornado's default is 100 MB
RESOLVER = NumericFirstResolver()  # an engine's numeric address needs no executor thread
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, AsyncHTTPClient]] = (
    weakref.WeakKeyDictionary()
)


def loop_http_client(max_clients: int) -> AsyncHTTPClient:
    """The running loop's client allowing ``max_clients`` concurrent requests."""
    by_size = _clients.setdefault(asyncio.get_running_loop(), {})
    client = by_size.get(max_clients)
    if client is None:
        client = AsyncHTTPClient(
            force_instance=True,
            max_clients=max_clients,
            max_body_size=MAX_BODY,
            resolver=RESOLVER,
        )
        by_size[max_clients] = client
    return client
