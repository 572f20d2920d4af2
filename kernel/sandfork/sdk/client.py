"""The HTTP client of the engine's API."""

from __future__ import annotations

from typing import Any

import requests

from sandfork.sdk.connection import Connection, resolve
from sandfork.sdk.errors import (
    AuthError,
    BadRequestError,
    ConflictError,
    LimitExceeded,
    NotFoundError,
    SandboxTimeout,
    SandforkError,
    ServerError,
)

_ERRORS: dict[int, type[SandforkError]] = {
    401: AuthError,
    404: NotFoundError,
    409: ConflictError,
    429: LimitExceeded,
    504: SandboxTimeout,
}


class Client:
    """A session with one engine; ``Client()`` finds the engine like :func:`resolve` does."""

    def __init__(
        self, url: str | None = None, api_key: str | None = None, timeout: float = 600.0
    ) -> None:
        conn = Connection(url.rstrip("/"), api_key) if url and api_key else resolve()
        self.url = conn.url
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {conn.api_key}"

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send a request to ``/v1{path}``; return the decoded JSON (``None`` for 204)."""
        response = self.raw(method, path, **kwargs)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def raw(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """Send a request and return the response, raising the SDK error for a failure."""
        kwargs.setdefault("timeout", self.timeout)
        try:
            response = self.session.request(method, f"{self.url}/v1{path}", **kwargs)
        except requests.RequestException as e:
            raise SandforkError(f"could not reach the engine at {self.url}: {e}") from e
        if response.status_code >= 400:
            try:
                message = str(response.json().get("error"))
            except ValueError:
                message = response.text or f"HTTP {response.status_code}"
            raise error_for(response.status_code, message)
        return response


def error_for(status: int, message: str) -> SandforkError:
    """The SDK error for an engine's failure answer with this HTTP status."""
    kind = _ERRORS.get(status) or (ServerError if status >= 500 else BadRequestError)
    return kind(message)


_default: Client | None = None


def default_client() -> Client:
    """The client used when none is given: the configured or local engine."""
    global _default
    if _default is None:
        _default = Client()
    return _default
