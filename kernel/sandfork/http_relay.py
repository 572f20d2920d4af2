"""Relaying one HTTP request, and a WebSocket it upgrades to, over a byte connection.

The engine's port proxy relays a request to a server in a sandbox over the sandbox's channel;
Jupyter Server's relays it to the engine's port proxy over TCP. Both rebuild the request head
(hop-by-hop headers and the caller's credentials dropped, ``Connection: close`` or the
upgrade), send it with the body, and read the response head while the request is still
tornado's, so that a server that does not answer gets an ordinary error response. Then the
handler takes the client's connection from tornado (``RequestHandler.detach``) and the bytes
are copied as they come: a streamed or large response, or a WebSocket's frames both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from tornado.iostream import IOStream, StreamClosedError

from sandfork.byte_streams import Incoming, Outgoing

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers of one hop (RFC 9110, 7.6.1), never relayed."""
_DROPPED = HOP_BY_HOP | {"content-length"}  # the relay sets its own
_CONNECTION_FIELDS = frozenset({"connection", "keep-alive", "proxy-connection"})  # of a response
_CHUNK = 1 << 16
HEAD_LIMIT = 64 * 1024
"""Longest response head read from the server."""


class RelayFailed(Exception):
    """The server did not answer with an HTTP response; the message says what it did."""


def wants_websocket(headers: Iterable[tuple[str, str]]) -> bool:
    """True when the request asks to upgrade to a WebSocket."""
    fields = {name.lower(): value.lower() for name, value in headers}
    upgrade = "upgrade" in (t.strip() for t in fields.get("connection", "").split(","))
    return upgrade and fields.get("upgrade", "") == "websocket"


def target_after(raw_path: str, query: str, sandbox_id: str) -> str:
    """The request target to send on: what follows ``/{sandbox_id}/ports/{port}`` in the raw
    (still percent-encoded) request path, ``/`` if nothing does, and the query. The handler's
    path arguments are decoded: a ``%0D%0A`` or a space in them would break the request line.
    """
    after = raw_path.split(f"/{sandbox_id}/ports/", 1)[1]
    rest = after[after.index("/") :] if "/" in after else "/"
    return rest + (f"?{query}" if query else "")


def request_head(
    method: str,
    target: str,
    headers: Iterable[tuple[str, str]],
    body_size: int,
    drop: Iterable[str] = (),
    add: Iterable[tuple[str, str]] = (),
) -> bytes:
    """The request head to send upstream: ``headers`` without the hop-by-hop ones and those
    named in ``drop`` (lower case), then ``add``, the body's length and the connection's fate."""
    headers = list(headers)
    dropped = _DROPPED | {name.lower() for name in drop}
    lines = [f"{method} {target} HTTP/1.1"]
    lines += [f"{name}: {value}" for name, value in headers if name.lower() not in dropped]
    lines += [f"{name}: {value}" for name, value in add]
    if body_size or method.upper() not in ("GET", "HEAD", "OPTIONS", "DELETE"):
        lines.append(f"Content-Length: {body_size}")
    if wants_websocket(headers):
        lines += ["Connection: Upgrade", "Upgrade: websocket"]
    else:
        lines.append("Connection: close")  # one request per upstream connection
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def exchange_heads(reader: Incoming, writer: Outgoing, head: bytes, body: bytes) -> bytes:
    """Send the request; the server's response head, as it is to be relayed (``Connection:
    close`` unless it switches protocols). :class:`RelayFailed` when it sends none."""
    writer.write(head + body)
    await writer.drain()
    try:
        response = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        raise RelayFailed(
            "the server closed the connection without an HTTP response"
            + (f" (it sent {len(e.partial)} bytes)" if e.partial else "")
        ) from None
    except asyncio.LimitOverrunError:
        raise RelayFailed(f"the server's response head is over {HEAD_LIMIT} bytes") from None
    status_line, *fields = response[:-4].decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise RelayFailed(f"the server sent no HTTP response (it sent {status_line[:80]!r})")
    if parts[1] == "101":
        return response
    kept = [f for f in fields if f.split(":", 1)[0].strip().lower() not in _CONNECTION_FIELDS]
    return ("\r\n".join([status_line, *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1")


async def relay(client: IOStream, reader: Incoming, writer: Outgoing, response: bytes) -> None:
    """Send ``response`` (a head from :func:`exchange_heads`) and then what the server sends,
    until it closes; after a ``101``, the client's bytes go to the server too."""
    upgraded = response.startswith(b"HTTP/1.1 101") or response.startswith(b"HTTP/1.0 101")
    try:
        await client.write(response)
        if upgraded:
            await asyncio.gather(_downstream(reader, client), _upstream(client, writer))
        else:
            await _downstream(reader, client)
    except StreamClosedError:
        pass
    finally:
        client.close()
        writer.close()


async def _downstream(reader: Incoming, client: IOStream) -> None:
    with contextlib.suppress(OSError, StreamClosedError):
        while data := await reader.read(_CHUNK):
            await client.write(data)
    client.close()


async def _upstream(client: IOStream, writer: Outgoing) -> None:
    with contextlib.suppress(OSError, StreamClosedError):
        while True:
            writer.write(await client.read_bytes(_CHUNK, partial=True))
            await writer.drain()
    writer.close()
