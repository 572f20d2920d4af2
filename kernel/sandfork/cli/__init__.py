"""The ``sandfork`` command line (serve, gateway, lab, env, template, criu, sandbox, …).

Its commands: serve, gateway, lab, env, template, criu, sandbox, snapshot, doctor.

Expected failures (the engine refuses, a template cannot be built, QEMU is missing, a
permission is lacking, Ctrl-C) print ``sandfork: error: <message>`` and a ``hint:`` line and
exit 1 (130 for Ctrl-C; 2 for a usage error); ``--debug`` shows their traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from sandfork.cli import containers, host, resources
from sandfork.cli.errors import describe, report
from sandfork.gateway.cli import add_command as gateway_command

__all__ = ["build_parser", "main"]

_DEBUG_HELP = "show the traceback of a failure instead of a one-line error"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``sandfork`` command."""
    parser = argparse.ArgumentParser(prog="sandfork", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    common = argparse.ArgumentParser(add_help=False)  # options of every subcommand
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    host.add_commands(sub, common)
    containers.add_commands(sub, common)
    resources.add_commands(sub, common)
    gateway_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``sandfork`` command; its exit code."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "lab":  # everything sandfork does not know goes to `jupyter lab`
        args.lab_args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    debug = bool(args.debug) or (args.command == "serve" and "--debug" in args.app_args)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `sandfork ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (Exception, KeyboardInterrupt) as e:
        failure = describe(e)
        if debug or failure is None:
            raise
        return report(failure)
