"""The two halves of a byte connection, as the relays use them (asyncio's streams are both;
so is one stream of a sandbox's channel)."""

from __future__ import annotations

from typing import Protocol


class Incoming(Protocol):
    """The reading half of a connection (an ``asyncio.StreamReader`` is one)."""

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes; ``b""`` at the end."""

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        """Bytes up to and including ``separator`` (``asyncio``'s errors when it cannot)."""


class Outgoing(Protocol):
    """The writing half of a connection (an ``asyncio.StreamWriter`` is one)."""

    def write(self, data: bytes) -> None:
        """Queue ``data``."""

    async def drain(self) -> None:
        """Wait until the queue is low enough to write more."""

    def can_write_eof(self) -> bool:
        """True when :meth:`write_eof` is supported."""

    def write_eof(self) -> None:
        """Half-close after the queued data."""

    def close(self) -> None:
        """Close after the queued data."""
