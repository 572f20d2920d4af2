"""Where a sandbox may connect through the egress proxy: globally reachable addresses only.

An address is refused when it is not globally reachable (``ipaddress``' ``is_global``, plus
multicast, reserved and site-local, which Python counts as global, and the few ranges newer
than its tables), when it embeds an IPv4 address that is refused (IPv4-mapped, -compatible,
NAT64, 6to4, either end of Teredo), or when it is an address of this host: every address on
every interface, read again at each check, so that one added while the engine runs is
refused at once.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import psutil

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Policy = Callable[[IPAddress], str | None]

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network
# The names of special-purpose ranges (IANA's registries), most specific first: they only
# name what is refused; whether it is refused is the rule above.
_NAMES: list[tuple[_V4 | _V6, str]] = [
    (_V4("0.0.0.0/8"), "an unspecified ('this network') address"),
    (_V4("127.0.0.0/8"), "a loopback address"),
    (_V4("10.0.0.0/8"), "a private (RFC 1918) address"),
    (_V4("172.16.0.0/12"), "a private (RFC 1918) address"),
    (_V4("192.168.0.0/16"), "a private (RFC 1918) address"),
    (_V4("100.64.0.0/10"), "a carrier-grade NAT (RFC 6598) address"),
    (_V4("169.254.0.0/16"), "a link-local address"),
    (_V4("192.0.0.0/24"), "an IETF protocol assignment address"),
    (_V4("192.0.2.0/24"), "a documentation address (TEST-NET-1)"),
    (_V4("198.51.100.0/24"), "a documentation address (TEST-NET-2)"),
    (_V4("203.0.113.0/24"), "a documentation address (TEST-NET-3)"),
    (_V4("198.18.0.0/15"), "a benchmarking address"),
    (_V4("224.0.0.0/4"), "a multicast address"),
    (_V4("255.255.255.255/32"), "the broadcast address"),
    (_V4("240.0.0.0/4"), "a reserved address"),
    (_V6("::/128"), "the unspecified address"),
    (_V6("::1/128"), "a loopback address"),
    (_V6("64:ff9b:1::/48"), "a local-use NAT64 address"),
    (_V6("100::/64"), "a discard-only address"),
    (_V6("2001::/32"), "a Teredo address"),
    (_V6("2001:2::/48"), "a benchmarking address"),
    (_V6("2001:db8::/32"), "a documentation address"),
    (_V6("2001:10::/28"), "an ORCHID address"),
    (_V6("2001::/23"), "an IETF protocol assignment address"),
    (_V6("3fff::/20"), "a documentation address"),
    (_V6("fc00::/7"), "a unique local (ULA) address"),
    (_V6("fe80::/10"), "a link-local address"),
    (_V6("fec0::/10"), "a site-local address"),
    (_V6("ff00::/8"), "a multicast address"),
]
# Special-purpose ranges missing from the tables of some Python versions we run on (3.11 has
# only 192.0.0.0/29 of 192.0.0.0/24, and neither of the IPv6 ones).
_NOT_GLOBAL: list[_V4 | _V6] = [_V4("192.0.0.0/24"), _V6("3fff::/20"), _V6("64:ff9b:1::/48")]
_V4_COMPATIBLE = _V6("::/96")
_NAT64 = _V6("64:ff9b::/96")


def refusal(address: IPAddress | str) -> str | None:
    """Why a sandbox may not connect to ``address``, or ``None`` when it may."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    embedded = _embedded_v4(ip)
    for what, inner in embedded:
        reason = refusal(inner)
        if reason is not None:
            return f"{ip} embeds {what} {inner}, and {reason}"
    # An address that stands for an IPv4 one (mapped, compatible, NAT64, 6to4) is in range
    # when that one is; Teredo is judged as itself too (and is not globally reachable).
    if not embedded or _is_teredo(ip):
        kind = range_refusal(ip)
        if kind is not None:
            return f"{ip} is {kind}"
    interface = host_interface(ip)
    if interface is not None:
        return f"{ip} is an address of this host (interface {interface})"
    return None


def range_refusal(ip: IPAddress) -> str | None:
    """What ``ip`` is when it is not a globally reachable unicast address, else ``None``."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        return "a scoped (interface-local) address"
    special = (
        not ip.is_global
        or ip.is_multicast
        or ip.is_reserved
        or (isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local)
        or any(ip.version == n.version and ip in n for n in _NOT_GLOBAL)
    )
    if not special:
        return None
    for network, kind in _NAMES:
        if ip.version == network.version and ip in network:
            return kind
    return "a special-purpose address (not globally reachable)"


def host_interface(ip: IPAddress) -> str | None:
    """The interface of this host that has address ``ip``, or ``None``."""
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            text = entry.address.split("%", 1)[0]
            try:
                if ipaddress.ip_address(text) == ip:
                    return name
            except ValueError:  # a link-layer (MAC) address
                continue
    return None


def _is_teredo(ip: IPAddress) -> bool:
    return isinstance(ip, ipaddress.IPv6Address) and ip.teredo is not None


def _is_v4_compatible(ip: ipaddress.IPv6Address) -> bool:
    return ip in _V4_COMPATIBLE and int(ip) > 1


def _embedded_v4(ip: IPAddress) -> list[tuple[str, ipaddress.IPv4Address]]:
    """The IPv4 addresses an IPv6 address carries, each with what it is."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    if ip.ipv4_mapped is not None:
        return [("the IPv4 address", ip.ipv4_mapped)]
    if ip in _NAT64 or _is_v4_compatible(ip):
        return [("the IPv4 address", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))]
    if ip.sixtofour is not None:
        return [("the 6to4 IPv4 address", ip.sixtofour)]
    if ip.teredo is not None:
        server, client = ip.teredo
        return [("the Teredo server", server), ("the Teredo client", client)]
    return []


def exempting(networks: list[str]) -> Policy:
    """:func:`refusal`, except that addresses in ``networks`` (CIDRs) are allowed.

    For a package mirror on a private network, say; an exemption wins over every rule, the
    host's own addresses included. An invalid CIDR raises ``ValueError``.
    """
    exempt = [ipaddress.ip_network(n, strict=False) for n in networks]

    def policy(ip: IPAddress) -> str | None:
        if any(ip.version == n.version and ip in n for n in exempt):
            return None
        return refusal(ip)

    return policy
