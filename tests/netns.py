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
