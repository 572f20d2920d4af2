"""``sandfork gateway``: the gateway as a traitlets ``Application``.

Settings are traits of :class:`~sandfork.gateway.config.GatewayConfig`, from their defaults,
then ``sandfork_gateway_config.py`` (or ``.json``) in Sandfork's config folder, then the file
named by ``--config``, then the command line (``--GatewayConfig.<name>=<value>``, ``--ip``,
``--port``, ``--state-dir``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import Any

from traitlets import TraitError, Unicode
from traitlets.config import Application

from sandfork.config_checks import unknown_settings
from sandfork.gateway.config import GatewayConfig
from sandfork.paths import config_dir

CONFIG_FILE_NAME = "sandfork_gateway_config"


class GatewayConfigError(Exception):
    """A config file or setting the gateway cannot use."""


class SandforkGatewayApp(Application):
    """``sandfork gateway``: one /v1 endpoint for a fleet of engines."""

    name = "sandfork gateway"
    description = (
        "Run the Sandfork gateway: one /v1 endpoint for the engines that register with it "
        f"(settings: {CONFIG_FILE_NAME}.py in ~/.config/sandfork, --config, the command "
        "line; --help-all lists them)."
    )
    classes = [GatewayConfig]  # noqa: RUF012 (traitlets' own class attribute)
    aliases = {  # noqa: RUF012
        **Application.aliases,
        "config": "SandforkGatewayApp.config_file",
        "ip": "GatewayConfig.ip",
        "port": "GatewayConfig.port",
        "state-dir": "GatewayConfig.state_dir",
    }
    config_file = Unicode("", help="A config file loaded after the one found.").tag(config=True)

    def initialize(self, argv: list[str] | None = None) -> None:
        """Read the command line, then the config files (the command line wins)."""
        self.parse_command_line(argv)
        self.raise_config_file_errors = True
        try:
            self.load_config_file(CONFIG_FILE_NAME, path=[str(config_dir())])
            if self.config_file:
                path = Path(self.config_file).expanduser().resolve()
                if not path.is_file():
                    raise GatewayConfigError(f"config file {path} not found")
                self.load_config_file(str(path))
        except GatewayConfigError:
            raise
        except Exception as e:  # a config file is Python: any error is the file's
            raise GatewayConfigError(f"cannot load the gateway's config: {e}") from e
        self.update_config(self.cli_config)

    def start(self) -> None:
        """Run the gateway until SIGINT/SIGTERM."""
        from sandfork.gateway.server import serve

        if (wrong := unknown_settings(self)) is not None:
            raise GatewayConfigError(wrong)
        try:
            config = GatewayConfig(parent=self)
        except TraitError as e:
            raise GatewayConfigError(str(e)) from e
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        asyncio.run(serve(config))


def run(argv: list[str]) -> int:
    """``sandfork gateway ARGV``."""
    app = SandforkGatewayApp()
    app.initialize(argv)
    app.start()
    return 0


def add_command(sub: Any) -> None:
    """Add ``gateway`` to the ``sandfork`` subcommands ``sub``."""
    gateway = sub.add_parser(
        "gateway",
        help="run the gateway: one /v1 endpoint for many engines; `sandfork gateway "
        "--help-all` lists every setting",
        add_help=False,
        prefix_chars="\0",  # every argument goes to the gateway application (traitlets)
    )
    gateway.add_argument("app_args", nargs=argparse.REMAINDER)
    gateway.set_defaults(func=lambda args: run(list(args.app_args)))
