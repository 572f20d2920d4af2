"""What the engine and the gateway both do to serve: keep their API key, check the key a
request presents, and publish the address they listen on in their runtime folder for local
clients to find."""

from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
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


def load_or_create_key(path: Path, prefix: str) -> str:
    """The key kept at ``path``, generated (``prefix`` + 32 random bytes, mode 0600) on
    first use."""
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = prefix + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


def publish(sockets: list[socket.socket], ip: str, info: Path) -> str:
    """The URL the first of ``sockets`` answers at, written with this process's pid to
    ``info`` (renamed into place: readers never see half of it)."""
    port = sockets[0].getsockname()[1]
    host = f"[{ip}]" if ":" in ip else ip
    url = f"http://{host}:{port}"
    partial = info.with_name(f".{info.name}.{os.getpid()}")
    partial.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    partial.rename(info)
    return url
