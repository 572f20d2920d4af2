"""Where the egress proxy lets a sandbox connect: globally reachable addresses that are not
the host's own. The host-address cases use this machine's real addresses, and one made here
on a veth pair into a network namespace of the test's own (no traffic is sent)."""

from __future__ import annotations

import socket
from ipaddress import ip_address

import pytest

from netns import veth_namespace
from sandfork.engine.egress_policy import exempting, refusal

REFUSED = [
    "127.0.0.1",
    "127.8.9.10",
    "0.0.0.0",
    "10.0.2.2",
    "10.1.2.3",
    "172.16.0.1",
    "172.31.255.254",
    "192.168.1.1",
    "100.64.0.1",
    "169.254.169.254",
    "224.0.0.251",
    "255.255.255.255",
    "::1",
    "::",
    "::ffff:127.0.0.1",
    "::ffff:192.168.0.1",
    "::127.0.0.1",
    "64:ff9b::a00:1",
    "fd12:3456::1",
    "fe80::1",
    "fe80::1%1",
    "ff02::1",
]
# Special-purpose ranges the policy once let through, each with what the refusal calls it.
SPECIAL = {
    "192.0.2.1": "documentation address (TEST-NET-1)",
    "198.51.100.7": "documentation address (TEST-NET-2)",
    "203.0.113.9": "documentation address (TEST-NET-3)",
    "198.18.0.1": "benchmarking address",
    "192.0.0.8": "IETF protocol assignment address",
    "2001:db8::1": "documentation address",
    "3fff::1": "documentation address",
    "2001:2::1": "benchmarking address",
    "100::1": "discard-only address",
    "2001:10::1": "ORCHID address",
    "fec0::1": "site-local address",
    "ff0e::1": "multicast address",
    "224.0.0.251": "multicast address",
    # 6to4 and Teredo embed IPv4: judged by it (Teredo's client is the low 32 bits, inverted).
    "2002:7f00:1::1": "embeds the 6to4 IPv4 address 127.0.0.1, and 127.0.0.1 is a loopback",
    "2002:c0a8:101::1": "embeds the 6to4 IPv4 address 192.168.1.1",
    "2001:0:7f00:1::1": "embeds the Teredo server 127.0.0.1",
    "2001:0:808:808:0:0:3f57:fefe": "embeds the Teredo client 192.168.1.1",
    "2001:0:808:808:0:0:f7f7:f7f7": "a Teredo address",  # both public: Teredo is not global
}
ALLOWED = [
    "93.184.216.34",
    "8.8.8.8",
    "172.32.0.1",
    "2606:4700:4700::1111",
    "::ffff:8.8.4.4",
    "2002:808:808::1",  # 6to4 of a public address
    "192.88.99.7",  # globally reachable for the rules (the host-address test uses it)
]


@pytest.mark.parametrize("address", REFUSED)
def test_policy_refuses_host_and_private_addresses(address: str) -> None:
    reason = refusal(address)
    assert reason is not None and reason.endswith("address"), reason


@pytest.mark.parametrize("address", sorted(SPECIAL))
def test_policy_refuses_every_special_purpose_range(address: str) -> None:
    reason = refusal(address)
    assert reason is not None and SPECIAL[address] in reason, reason


def test_policy_refuses_this_hosts_own_addresses() -> None:
    """Every address of every interface of this machine, whatever its range."""
    import psutil

    mine = {
        entry.address.split("%")[0]
        for entries in psutil.net_if_addrs().values()
        for entry in entries
        if entry.family in (socket.AF_INET, socket.AF_INET6)
    }
    assert len(mine) > 2, mine  # more than loopback
    for address in mine:
        assert refusal(address) is not None, address


def test_an_address_added_while_running_is_refused_at_once() -> None:
    """An address that passes every range rule, made a host address (and removed) here."""
    assert refusal("192.88.99.7") is None
    with veth_namespace(["192.88.99.7"]) as veth:
        reason = refusal("192.88.99.7")
        assert reason == f"192.88.99.7 is an address of this host (interface {veth.host_end})"
        assert refusal("::ffff:192.88.99.7") is not None
        assert "6to4 IPv4 address 192.88.99.7" in str(refusal("2002:c058:6307::1"))
    assert refusal("192.88.99.7") is None


@pytest.mark.parametrize("address", ALLOWED)
def test_policy_allows_public_addresses(address: str) -> None:
    assert refusal(address) is None


def test_operator_can_exempt_a_private_network() -> None:
    policy = exempting(["10.1.2.0/24", "fd00:1::/64"])
    assert policy(ip_address("10.1.2.3")) is None and policy(ip_address("fd00:1::5")) is None
    for refused in ("10.1.3.1", "127.0.0.1", "fd00:2::1"):
        assert policy(ip_address(refused)) == refusal(refused)
    with pytest.raises(ValueError):
        exempting(["not-a-network"])
