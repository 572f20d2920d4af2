"""Entry point: `python -m sandfork_agent` (guest) or `python -m sandfork.agent` (host)."""

from __future__ import annotations

import argparse
import asyncio
import logging

from .server import serve
from .transport import DEFAULT_PORT
from .workloads import configure


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
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s sandfork-agent %(levelname)s %(message)s"
    )
    configure(args.cgroup_root)  # before any thread starts: the move takes the whole process
    asyncio.run(serve(args.port, args.listen_unix))


if __name__ == "__main__":
    main()
