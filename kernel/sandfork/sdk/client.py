"""The SDK's client: the synchronous facade of the one engine client
(:mod:`sandfork.client`), whose asynchronous client (``client.aio``) the SDK's ``async_``
methods use."""

from __future__ import annotations

from sandfork.client import EngineClient, SyncEngineClient
from sandfork.protocol import error_for

__all__ = ["Client", "default_client", "error_for"]


class Client(SyncEngineClient):
    """A session with one engine; ``Client()`` finds the engine like
    :func:`sandfork.client.resolve` does (the environment, else the local engine, started on
    demand); ``Client.wrapping(engine_client)`` wraps an asynchronous client without finding
    anything yet. ``request`` returns decoded JSON, ``raw`` the whole response; failures raise
    the SDK's errors."""


_default: Client | None = None


def default_client() -> Client:
    """The client used when none is given: the configured or local engine, found when first
    used (a local one started then if none runs)."""
    global _default
    if _default is None:
        _default = Client.wrapping(EngineClient())
    return _default
