"""The egress proxy: the only way out of a sandbox whose network is restricted.

A sandbox's guest relays each connection made to its proxy address (``127.0.0.1:3128`` in the
guest) as one stream of its egress channel (:mod:`sandfork.engine.egress_tunnel`), and this
proxy serves each stream. It speaks HTTP: ``CONNECT host:port`` (HTTPS, what ``pip`` uses) and
plain-HTTP requests with an absolute URI. It resolves the destination itself and connects only
to addresses its policy allows (:mod:`sandfork.engine.egress_policy`), so a guest can fetch
packages from the internet but never reach the host's services or a private network; a
refused destination gets a ``403`` saying why, before any connection is attempted.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from urllib.parse import urlsplit

from sandfork.agent.channel import http_error
from sandfork.byte_streams import Incoming, Outgoing
from sandfork.engine.egress_policy import Policy, refusal

log = logging.getLogger(__name__)

HEAD_LIMIT = 64 * 1024
"""Longest request head the proxy reads."""
_HEAD_TIMEOUT_S = 30.0
_CONNECT_TIMEOUT_S = 15.0
_HOP_BY_HOP = {"proxy-connection", "proxy-authorization", "connection", "keep-alive"}


class ProxyError(Exception):
    """A request the proxy answers with an error status instead of forwarding it."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


async def open_checked(
    host: str, port: int, policy: Policy = refusal
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Resolve ``host`` and connect to the first of its addresses ``policy`` allows.

    Only the checked address is connected to (no second lookup for the connection to race).
    """
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ProxyError(502, "Bad Gateway", f"cannot resolve {host!r}: {e}") from e
    reasons: list[str] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        ip = ipaddress.ip_address(sockaddr[0])
        reason = policy(ip)
        if reason is not None:
            reasons.append(reason)
            continue
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(str(ip), port), _CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as e:
            reasons.append(f"connecting to {ip} failed: {e or 'timeout'}")
    if reasons and all(not r.startswith("connecting") for r in reasons):
        raise ProxyError(
            403,
            "Forbidden",
            f"refused to connect to {host}:{port}: {reasons[0]}. Sandboxes may not reach the "
            "host or private networks (a sandbox created with host_access may reach them "
            "directly, if the engine allows it)",
        )
    raise ProxyError(502, "Bad Gateway", f"cannot connect to {host}:{port}: {'; '.join(reasons)}")


def _split_authority(authority: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` as (host, port); port 0 is refused."""
    try:
        parts = urlsplit(f"//{authority}")
        port = parts.port
    except ValueError as e:
        raise ProxyError(400, "Bad Request", f"bad port in {authority!r}") from e
    if port == 0:
        raise ProxyError(400, "Bad Request", f"port 0 is not a destination ({authority!r})")
    if not parts.hostname:
        raise ProxyError(400, "Bad Request", f"no host in {authority!r}")
    return parts.hostname, default_port if port is None else port


class EgressProxy:
    """An HTTP proxy (``CONNECT`` and absolute-URI requests) serving one connection at a time
    per :meth:`serve` call.

    ``policy`` decides which resolved addresses may be connected to (:func:`refusal`), but
    for the (host name, port) pairs in ``sources``, the host's package sources
    (:mod:`sandfork.engine.package_sources`), which are connected to wherever they resolve.
    """

    def __init__(
        self, policy: Policy = refusal, sources: frozenset[tuple[str, int]] = frozenset()
    ) -> None:
        self.policy = policy
        self.sources = sources

    def _policy(self, host: str, port: int) -> Policy:
        return _anywhere if (host.lower().rstrip("."), port) in self.sources else self.policy

    async def serve(self, reader: Incoming, writer: Outgoing) -> None:
        """Serve one client connection until either side is done, then close it."""
        try:
            await self._handle(reader, writer)
        except ProxyError as e:
            log.info("egress refused: %s", e.message)
            with contextlib.suppress(OSError):
                writer.write(http_error(e.status, e.reason, e.message))
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: Incoming, writer: Outgoing) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError as e:
            raise ProxyError(431, "Request Header Fields Too Large", "request head too big") from e
        request_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        try:
            method, target, version = request_line.split(" ")
        except ValueError as e:
            raise ProxyError(400, "Bad Request", f"bad request line {request_line!r}") from e
        if method.upper() == "CONNECT":
            host, port = _split_authority(target, 443)
            up_reader, up_writer = await open_checked(host, port, self._policy(host, port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            try:
                url = urlsplit(target)
            except ValueError as e:
                raise ProxyError(400, "Bad Request", f"bad URI {target[:200]!r}") from e
            if url.scheme.lower() != "http" or not url.netloc:
                raise ProxyError(
                    400,
                    "Bad Request",
                    "only CONNECT and absolute http:// URIs are proxied "
                    f"(got {method} {target[:200]})",
                )
            host, port = _split_authority(url.netloc, 80)
            up_reader, up_writer = await open_checked(host, port, self._policy(host, port))
            path = url.path or "/"
            if url.query:
                path += "?" + url.query
            # One request per connection: the origin closes after answering.
            headers = [
                line
                for line in header_lines
                if line.split(":", 1)[0].strip().lower() not in _HOP_BY_HOP
            ]
            lines = [f"{method} {path} {version}", *headers, "Connection: close", "", ""]
            up_writer.write("\r\n".join(lines).encode("latin-1"))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()


def _anywhere(_ip: object) -> None:
    """The policy of a package source: whatever address its name resolves to."""
    return None


async def _pipe(reader: Incoming, writer: Outgoing) -> None:
    """Copy until end of stream, then half-close ``writer``."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()
