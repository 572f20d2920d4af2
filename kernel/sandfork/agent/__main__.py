"""Entry point: `python -m sandfork_agent` (guest) or `python -m sandfork.agent` (host)."""

from __future__ import annotations

import argparse
import asyncio
import logging

from .server import serve
from .transport import DEFAULT_PORT


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
        help="talk to the host on stdin and stdout (a container sandbox's pipes)",
    )
    where.add_argument(
        "--listen-unix",
        metavar="PATH",
        help="listen on a Unix socket instead, one host connection at a time (host tests)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s sandfork-agent %(levelname)s %(message)s"
    )
    asyncio.run(serve(args.port, args.listen_unix, stdio=args.stdio))


if __name__ == "__main__":
    main()
