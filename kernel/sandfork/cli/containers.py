"""``sandfork criu install|check``: the CRIU the container backend runs, installed and proved."""

from __future__ import annotations

import argparse
from typing import Any

from sandfork.cli.output import console

__all__ = ["add_commands"]


def _install(args: argparse.Namespace) -> int:
    from sandfork.backends.container import criu
    from sandfork.backends.container.smoke import smoke

    with console.status("installing CRIU (Debian unstable's, into a tree of its own)…"):
        found = criu.install(smoke=smoke)
    console.print(f"[green]CRIU {found.version} ready[/] ({found.prefix[-1]})", highlight=False)
    return 0


def _check(args: argparse.Namespace) -> int:
    from sandfork.backends.container import criu
    from sandfork.backends.container.smoke import smoke

    found = criu.require()
    with console.status(f"checking CRIU {found.version}: criu check, a dump and a restore…"):
        criu.check(found)
        if found.bin_dir is not None:
            smoke(found, found.bin_dir.parent)
    console.print(f"[green]CRIU {found.version} works here[/]", highlight=False)
    return 0


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``criu install`` and ``criu check`` to the subcommands ``sub``."""
    criu = sub.add_parser(
        "criu", help="install or check CRIU, which the container backend runs (root)"
    ).add_subparsers(dest="criu_command", required=True)
    install = criu.add_parser(
        "install",
        help="install CRIU >= 4.2 from Debian unstable into the cache, then prove it with a "
        "dump and restore (skipped when a working one is there)",
        parents=[common],
    )
    install.set_defaults(func=_install)
    check = criu.add_parser(
        "check", help="run `criu check` and a dump and restore of a small sandbox", parents=[common]
    )
    check.set_defaults(func=_check)
