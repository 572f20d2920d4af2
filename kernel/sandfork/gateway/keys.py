"""The gateway's keys: the one clients send, and each engine's."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

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


def load_or_create_key(path: Path) -> str:
    """The key kept at ``path``, generated (mode 0600) on first use."""
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = "sfg_" + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key
