"""The one client of the engine: asynchronous (:class:`EngineClient`), with a synchronous
facade (:class:`SyncEngineClient`), and the configurable that names the engine
(:class:`EngineConnection`). The SDK, the proxy kernel and the server extension use it."""

from sandfork.client.config import EngineConnection
from sandfork.client.connection import Connection, resolve
from sandfork.client.engine_client import EngineClient, Response
from sandfork.client.sync import SyncEngineClient, blocking, on_caller, run_sync

__all__ = [
    "Connection",
    "EngineClient",
    "EngineConnection",
    "Response",
    "SyncEngineClient",
    "blocking",
    "on_caller",
    "resolve",
    "run_sync",
]
