"""The proxy's side of the Jupyter protocol: a client's messages, verified with the
connection file's key without decoding more of them than their header."""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from typing import Any

from jupyter_client.session import DELIM, Session


@dataclass
class Request:
    """A client's message, verified; its JSON parts are relayed as they were signed."""

    channel: str
    idents: list[bytes]
    header: dict[str, Any]
    parts: list[bytes]  # header, parent header, metadata and content: JSON
    buffers: list[bytes]

    def content(self) -> dict[str, Any]:
        """The decoded content (only a few requests need it)."""
        content: dict[str, Any] = json.loads(self.parts[3])
        return content


class RelaySession(Session):
    """A session that checks a client's messages without decoding more than their header."""

    def receive(self, channel: str, frames: list[bytes]) -> Request:
        """The request in ``frames``; raises ``ValueError`` (or ``TypeError``, ``KeyError``)
        unless it is well-formed and signed with the key, once, as ``deserialize`` requires."""
        split = frames.index(DELIM)
        signature, *parts = frames[split + 1 :]
        if len(parts) < 4:
            raise ValueError("malformed message")
        if self.auth is not None:
            if signature in self.digest_history:
                raise ValueError(f"duplicate signature {signature!r}")
            if not hmac.compare_digest(signature, self.sign(parts[:4])):
                raise ValueError(f"invalid signature {signature!r}")
            self._add_digest(signature)
        header: dict[str, Any] = json.loads(parts[0])
        if not isinstance(header["msg_id"], str) or not isinstance(header["msg_type"], str):
            raise TypeError("a header without msg_id or msg_type")
        return Request(channel, frames[:split], header, parts[:4], parts[4:])
