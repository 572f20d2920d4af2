"""The egress proxy: the only way out of a sandbox whose network is restricted.

A sandbox's QEMU user network runs with ``restrict=on`` (the guest reaches nothing, not the
host, not its loopback, not the internet) plus one ``guestfwd``: connections to
``10.0.2.100:3128`` in the guest are handed to ``socat``, which connects to this proxy's Unix
socket in the engine's private runtime directory. The proxy speaks HTTP: ``CONNECT host:port``
(HTTPS, what ``pip`` uses) and plain-HTTP requests with an absolute URI. It resolves the
destination itself and connects only to addresses :func:`refusal` allows, so a guest can fetch
packages from the internet but never reach the host's services or a private network; a
refused destination gets a ``403`` saying why, before any connection is attempted.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Policy = Callable[[IPAddress], str | None]

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network
# Destinations a sandbox may not reach through the proxy, most specific first.
_REFUSED: list[tuple[_V4 | _V6, str]] = [
    (_V4("0.0.0.0/8"), "an unspecified ('this network') address"),
    (_V4("127.0.0.0/8"), "a loopback address"),
    (_V4("10.0.0.0/8"), "a private (RFC 1918) address"),
    (_V4("172.16.0.0/12"), "a private (RFC 1918) address"),
    (_V4("192.168.0.0/16"), "a private (RFC 1918) address"),
    (_V4("100.64.0.0/10"), "a carrier-grade NAT (RFC 6598) address"),
    (_V4("169.254.0.0/16"), "a link-local address"),
    (_V4("192.0.0.0/24"), "an IETF protocol assignment address"),
    (_V4("198.18.0.0/15"), "a benchmarking address"),
    (_V4("224.0.0.0/4"), "a multicast address"),
    (_V4("240.0.0.0/4"), "a reserved or broadcast address"),
    (_V6("::/128"), "the unspecified address"),
    (_V6("::1/128"), "a loopback address"),
    (_V6("fc00::/7"), "a unique local (ULA) address"),
    (_V6("fe80::/10"), "a link-local address"),
    (_V6("fec0::/10"), "a site-local address"),
    (_V6("ff00::/8"), "a multicast address"),
]

_V4_COMPATIBLE = _V6("::/96")
_NAT64 = _V6("64:ff9b::/96")
_HEAD_LIMIT = 64 * 1024
_HEAD_TIMEOUT_S = 30.0
_CONNECT_TIMEOUT_S = 15.0
_HOP_BY_HOP = {"proxy-connection", "proxy-authorization", "connection", "keep-alive"}


def refusal(address: IPAddress | str) -> str | None:
    """Why a sandbox may not connect to ``address``, or ``None`` when it may.

    Refused: loopback, unspecified, private (RFC 1918), carrier-grade NAT, link-local,
    multicast and reserved IPv4; IPv6 loopback, unspecified, unique local, link-local,
    site-local and multicast; IPv6 that embeds an IPv4 address (mapped, compatible, NAT64) is
    judged by that IPv4 address.
    """
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    embedded = _embedded_v4(ip)
    if embedded is not None:
        inner = _kind(embedded)
        return inner and f"{ip} embeds {embedded}, {inner}"
    kind = _kind(ip)
    return kind and f"{ip} is {kind}"


def _embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64 or (ip in _V4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _kind(ip: IPAddress) -> str | None:
    for network, kind in _REFUSED:
        if ip.version == network.version and ip in network:
            return kind
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        return "a scoped (interface-local) address"
    return None


def exempting(networks: list[str]) -> Policy:
    """:func:`refusal`, except that addresses in ``networks`` (CIDRs) are allowed.

    For a package mirror on a private network, say; an invalid CIDR raises ``ValueError``.
    """
    exempt = [ipaddress.ip_network(n, strict=False) for n in networks]

    def policy(ip: IPAddress) -> str | None:
        if any(ip.version == n.version and ip in n for n in exempt):
            return None
        return refusal(ip)

    return policy


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
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` as (host, port)."""
    parts = urlsplit(f"//{authority}")
    try:
        port = parts.port or default_port
    except ValueError as e:
        raise ProxyError(400, "Bad Request", f"bad port in {authority!r}") from e
    if not parts.hostname:
        raise ProxyError(400, "Bad Request", f"no host in {authority!r}")
    return parts.hostname, port


class EgressProxy:
    """An HTTP proxy (``CONNECT`` and absolute-URI requests) on a Unix socket.

    ``policy`` decides which resolved addresses may be connected to (:func:`refusal`).
    """

    def __init__(self, path: Path, policy: Policy = refusal) -> None:
        self.path = path
        self.policy = policy
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen on :attr:`path` (a stale socket left by an earlier engine is replaced).

        Running VMs name this path in their ``guestfwd``, so a restarted engine serves the
        VMs it adopts as soon as it listens again.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.path), limit=_HEAD_LIMIT
        )
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        """Stop listening and drop the connections in progress."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._handle(reader, writer)
        except ProxyError as e:
            log.info("egress refused: %s", e.message)
            body = f"sandfork egress proxy: {e.message}\n".encode()
            head = (
                f"HTTP/1.1 {e.status} {e.reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            with contextlib.suppress(OSError):
                writer.write(head.encode() + body)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
            up_reader, up_writer = await open_checked(host, port, self.policy)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            url = urlsplit(target)
            if url.scheme.lower() != "http" or not url.netloc:
                raise ProxyError(
                    400,
                    "Bad Request",
                    "only CONNECT and absolute http:// URIs are proxied "
                    f"(got {method} {target[:200]})",
                )
            host, port = _split_authority(url.netloc, 80)
            up_reader, up_writer = await open_checked(host, port, self.policy)
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


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then half-close ``writer``."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()
