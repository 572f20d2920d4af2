"""A veth pair into a network namespace of the test's own: addresses that exist only here.

The host end gets ``host_addresses`` (so they become addresses of this host), the namespace
end ``peer_address`` (a machine next door, for a server to listen on). Before anything is
yielded, ``ip route get`` must say every host address is local and the peer is reached over
the veth: no packet to any of them can leave this machine. Everything is removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Veth:
    """The pair made by :func:`veth_namespace`."""

    namespace: str
    host_end: str
    peer_end: str

    def run(self, *command: str) -> subprocess.Popen[bytes]:
        """Start ``command`` inside the namespace."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.namespace, *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@contextlib.contextmanager
def veth_namespace(host_addresses: list[str], peer_address: str | None = None) -> Iterator[Veth]:
    """Make the pair (skipping the test where this machine does not allow it)."""
    tag = f"{os.getpid() % 100000}"
    veth = Veth(f"sandfork-test-{tag}", f"sfkh{tag}", f"sfkp{tag}")
    try:
        _ip("netns", "add", veth.namespace)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot make a network namespace here: {e}")
    try:
        _ip("link", "add", veth.host_end, "type", "veth", "peer", "name", veth.peer_end)
        _ip("link", "set", veth.peer_end, "netns", veth.namespace)
        for address in host_addresses:
            _ip("addr", "add", f"{address}/32", "dev", veth.host_end)
        _ip("link", "set", veth.host_end, "up")
        inside = ["netns", "exec", veth.namespace, "ip"]
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "link", "set", veth.peer_end, "up")
        if peer_address is not None:
            _ip(*inside, "addr", "add", f"{peer_address}/32", "dev", veth.peer_end)
            _ip("route", "add", f"{peer_address}/32", "dev", veth.host_end)
            for address in host_addresses[:1]:
                _ip(*inside, "route", "add", f"{address}/32", "dev", veth.peer_end)
        for address in host_addresses:
            route = _ip("route", "get", address)
            assert route.startswith(f"local {address} "), route
        if peer_address is not None:
            route = _ip("route", "get", peer_address)
            assert route.startswith(f"{peer_address} dev {veth.host_end} "), route
        yield veth
    finally:
        subprocess.run(["ip", "link", "del", veth.host_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", veth.namespace], capture_output=True)


@dataclass(frozen=True)
class Hosts:
    """Machines next door made by :func:`hosts`: a network namespace for each name, and the
    address of this host that every one of them reaches (for the servers they share)."""

    service: str
    namespaces: dict[str, str]  # name -> its namespace
    addresses: dict[str, str]  # name -> its address
    links: dict[str, str]  # name -> the host end of its veth pair

    def prefix(self, name: str) -> tuple[str, ...]:
        """The command prefix that runs a program on host ``name``: in its network namespace
        and nothing else (``ip netns exec`` would also remount /sys, hiding the cgroups)."""
        return ("nsenter", f"--net=/run/netns/{self.namespaces[name]}")

    def unplug(self, name: str) -> None:
        """Take host ``name`` off the network for good: its veth pair and namespace go."""
        subprocess.run(["ip", "link", "del", self.links[name]], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.namespaces[name]], capture_output=True)


@contextlib.contextmanager
def hosts(names: list[str]) -> Iterator[Hosts]:
    """A namespace per name (``198.19.<n>.<i + 2>``, reached over its own veth pair) and
    ``198.18.<n>.1``, an address of this host (on its loopback link, so it outlives any one
    pair) that each namespace has a route to and nothing else: no default route, no
    forwarding, nothing to the outside. Every address is checked to route as meant before
    anything is yielded; all is removed after."""
    tag = f"{os.getpid() % 100000}"
    # The benchmarking range (RFC 2544), which no network here uses; two runs at once differ.
    net = os.getpid() % 250
    service = f"198.18.{net}.1"
    made = Hosts(
        service,
        {n: f"sandfork-{tag}-{n}" for n in names},
        {n: f"198.19.{net}.{i + 2}" for i, n in enumerate(names)},
        {n: f"sfh{tag}x{i}" for i, n in enumerate(names)},
    )
    try:
        _ip("addr", "add", f"{service}/32", "dev", "lo")
        for i, name in enumerate(names):
            namespace, peer = made.namespaces[name], f"sfp{tag}x{i}"
            try:
                _ip("netns", "add", namespace)
            except (OSError, subprocess.CalledProcessError) as e:
                pytest.skip(f"cannot make a network namespace here: {e}")
            _ip("link", "add", made.links[name], "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", namespace)
            _ip("link", "set", made.links[name], "up")
            inside = ["netns", "exec", namespace, "ip"]
            _ip(*inside, "link", "set", "lo", "up")
            _ip(*inside, "addr", "add", f"{made.addresses[name]}/32", "dev", peer)
            _ip(*inside, "link", "set", peer, "up")
            _ip(*inside, "route", "add", f"{service}/32", "dev", peer)
            address = f"{made.addresses[name]}/32"
            _ip("route", "add", address, "dev", made.links[name], "src", service)
        assert _ip("route", "get", service).startswith(f"local {service} ")
        for name in names:
            route = _ip("route", "get", made.addresses[name])
            assert route.startswith(f"{made.addresses[name]} dev {made.links[name]} "), route
            inside = _ip("netns", "exec", made.namespaces[name], "ip", "route", "show")
            assert "default" not in inside, inside
        yield made
    finally:
        for name in names:
            made.unplug(name)
        subprocess.run(["ip", "addr", "del", f"{service}/32", "dev", "lo"], capture_output=True)
