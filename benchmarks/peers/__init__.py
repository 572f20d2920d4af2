"""Peers measured beside Sandfork in the benchmarks, on the same machine and data."""

from peers.criu import criu_peer
from peers.kishu import kishu_peer

__all__ = ["criu_peer", "kishu_peer"]
