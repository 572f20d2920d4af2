"""The gateway's keys: the one clients send, and each engine's."""

from __future__ import annotations

import hmac

from tornado import httputil

CREDENTIALS = ("authorization", "x-api-key")
"""Request headers that carry a key (never relayed: the engine gets its own key)."""


def presented_key(request: httputil.HTTPServerRequest) -> str:
    """The key a request carries (``Authorization: Bearer`` or ``X-API-Key``), or ``""``."""
    header = request.headers.get("Authorization", "")
    token = header[7:] if header.lower().startswith("bearer ") else ""
    return token or request.headers.get("X-API-Key", "")


def key_matches(given: str, expected: str) -> bool:
    """True when ``given`` is ``expected`` (compared in constant time)."""
    return bool(given) and hmac.compare_digest(given.encode(), expected.encode())
