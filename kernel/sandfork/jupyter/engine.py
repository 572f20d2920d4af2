"""The engine's HTTP API from inside Jupyter Server, without blocking its event loop."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse

from sandfork.sdk.connection import Connection, resolve


class EngineError(Exception):
    """The engine refused or failed a request: its HTTP status (502: unreachable), its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class EngineClient:
    """An asynchronous client of the engine's ``/v1`` API.

    The engine is the configured one, else found like the SDK finds it (the environment, then
    the local engine, started on first use).
    """

    def __init__(self, url: str = "", api_key: str = "", timeout: float = 600.0) -> None:
        self._configured = Connection(url.rstrip("/"), api_key) if url and api_key else None
        self._connection: Connection | None = None
        self.timeout = timeout
        self._http = AsyncHTTPClient()

    async def connection(self) -> Connection:
        """Where the engine is (resolved once; starting a local engine runs in a thread)."""
        if self._connection is not None:
            return self._connection
        try:
            conn = self._configured if self._configured else await asyncio.to_thread(resolve)
        except Exception as e:
            raise EngineError(502, f"no Sandfork engine to talk to: {e}") from e
        self._connection = conn
        return conn

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send ``method /v1{path}`` with a JSON body; return the decoded answer (None for 204)."""
        response = await self._send(method, path, body)
        return json.loads(response.body) if response.body else None

    async def fetch_bytes(self, path: str) -> bytes:
        """``GET /v1{path}`` as raw bytes (e.g. a snapshot's attachment)."""
        return bytes((await self._send("GET", path, None)).body)

    async def _send(self, method: str, path: str, body: Any) -> HTTPResponse:
        conn = await self.connection()
        request = HTTPRequest(
            f"{conn.url}/v1{path}",
            method=method,
            headers={"Authorization": f"Bearer {conn.api_key}", "Content-Type": "application/json"},
            body=None if body is None and method in ("GET", "DELETE") else json.dumps(body or {}),
            request_timeout=self.timeout,
        )
        try:
            return await self._http.fetch(request)
        except HTTPClientError as e:
            raise EngineError(e.code, _message(e)) from e
        except OSError as e:
            # A local engine may have been restarted elsewhere: look for it again next time.
            self._connection = None
            raise EngineError(502, f"could not reach the Sandfork engine at {conn.url}: {e}") from e


def _message(error: HTTPClientError) -> str:
    body = error.response.body if error.response is not None else b""
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return f"the Sandfork engine answered {error.code}: {error.message}"
