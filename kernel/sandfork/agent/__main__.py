"""Entry point: `python -m sandfork_agent` (guest) or `python -m sandfork.agent` (host)."""

from __future__ import annotations

import argparse
import asyncio
import logging

from .egress import DEFAULT_ADDRESS
from .server import link, serve
from .transport import DEFAULT_PORT, EGRESS_PORT
from .workloads import configure


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run the agent until it is told to stop."""
    parser = argparse.ArgumentParser(
        prog="sandfork_agent", description="Sandfork guest agent (see docs/agent-protocol.md)."
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--port", default=DEFAULT_PORT, help="virtio-serial port device (default: %(default)s)"
    )
    where.add_argument(
        "--stdio",
        action="store_true",
        help="a container sandbox's channels: the agent's on fds 0 and 1, egress on 3 and 4",
    )
    where.add_argument(
        "--listen-unix",
        metavar="PATH",
        help="listen on a Unix socket instead, one host connection at a time (host tests)",
    )
    parser.add_argument(
        "--cgroup-root",
        metavar="PATH",
        help="a cgroup2 mount to run user work under, in groups of its own (the guest's init"
        " passes /sys/fs/cgroup); without it, user work runs in the agent's group",
    )
    channel = parser.add_mutually_exclusive_group()
    channel.add_argument(
        "--egress-port",
        help=f"virtio-serial port of the egress channel (default: {EGRESS_PORT}, when the "
        "agent serves its default port; otherwise no egress relay unless named)",
    )
    channel.add_argument(
        "--egress-listen-unix",
        metavar="PATH",
        help="listen on a Unix socket for the egress channel instead (host tests)",
    )
    parser.add_argument(
        "--egress-address",
        type=_address,
        default=DEFAULT_ADDRESS,
        metavar="HOST:PORT",
        help="where the egress proxy listens in the sandbox (default: "
        f"{DEFAULT_ADDRESS[0]}:{DEFAULT_ADDRESS[1]})",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s sandfork-agent %(levelname)s %(message)s"
    )
    configure(args.cgroup_root)  # before any thread starts: the move takes the whole process
    if args.stdio:
        asyncio.run(serve(link("", None, (0, 1)), link("", None, (3, 4)), args.egress_address))
        return
    in_guest = args.port == DEFAULT_PORT and args.listen_unix is None
    egress_port = args.egress_port or (EGRESS_PORT if in_guest else None)
    egress = None
    if egress_port is not None or args.egress_listen_unix is not None:
        egress = link(egress_port or EGRESS_PORT, args.egress_listen_unix)
    asyncio.run(serve(link(args.port, args.listen_unix), egress, args.egress_address))


if __name__ == "__main__":
    main()
