"""``sandfork serve``: the engine as a traitlets ``Application``.

Every engine setting is a trait of :class:`~sandfork.engine.config.EngineConfig`, set from,
lowest priority first:

1. its default (``sandfork serve --help-all`` lists them all);
2. ``sandfork_engine_config.py`` (or ``.json``) in :func:`config_file_paths`: ``/etc/sandfork``,
   then ``<sys.prefix>/etc/sandfork``, then the user's ``paths.config_dir()``
   (``$SANDFORK_CONFIG_DIR`` or ``~/.config/sandfork``), each overriding the one before; then
   the file named by ``--config``;
3. the environment (:func:`env_config`): ``SANDFORK_<NAME>`` for setting ``<name>``, e.g.
   ``SANDFORK_STATE_DIR``, ``SANDFORK_RAM_DIR``, ``SANDFORK_MAX_SANDBOXES``, and
   ``SANDFORK_S3_<NAME>`` for ``S3Store.<name>`` (``SANDFORK_S3_BUCKET``);
   ``SANDFORK_HOME`` too names the state directory. The environment beats the files because
   the clients (SDK, ``sandfork env``) find the engine's state directory from it too;
4. the command line: ``--EngineConfig.<name>=<value>`` for any setting, and the short
   aliases and flags below (``--port``, ``--no-boot-captures``...).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from traitlets import Enum, List, TraitError, TraitType, Unicode
from traitlets.config import Application, Config, Configurable
from traitlets.config.loader import KVArgParseConfigLoader

from sandfork.config_checks import unknown_settings
from sandfork.engine.config import EngineConfig
from sandfork.paths import config_dir
from sandfork.store.config import S3Store

__all__ = [
    "CONFIG_FILE_NAME",
    "EngineConfigError",
    "SandforkEngineApp",
    "config_file_paths",
    "env_config",
    "env_name",
]

CONFIG_FILE_NAME = "sandfork_engine_config"
"""Base name of the engine's config files (``.py`` or ``.json``)."""

HOME_ENV = "SANDFORK_HOME"
"""Names the state directory when ``SANDFORK_STATE_DIR`` is unset (as in ``paths.state_dir``)."""


class EngineConfigError(Exception):
    """A config file, environment variable or setting the engine cannot use."""


def config_file_paths() -> list[str]:
    """Folders searched for ``sandfork_engine_config.py``, highest priority first."""
    return [str(config_dir()), os.path.join(sys.prefix, "etc", "sandfork"), "/etc/sandfork"]


ENV_PREFIXES: dict[type[Configurable], str] = {EngineConfig: "SANDFORK_", S3Store: "SANDFORK_S3_"}
"""Each configurable's environment variables: ``SANDFORK_<NAME>`` for the engine's own,
``SANDFORK_S3_<NAME>`` for the S3 snapshot store's."""


def env_name(trait_name: str, cls: type[Configurable] = EngineConfig) -> str:
    """The environment variable of one setting of ``cls``."""
    return f"{ENV_PREFIXES[cls]}{trait_name.upper()}"


def _from_string(trait: TraitType[Any, Any], value: str) -> Any:
    if isinstance(trait, List):  # a list: separated by commas or spaces
        return trait.from_string_list(value.replace(",", " ").split())
    return trait.from_string(value)


def env_config(environ: Mapping[str, str]) -> Config:
    """The engine settings named in ``environ`` (empty variables count as unset)."""
    config = Config()
    for cls in ENV_PREFIXES:
        settings: dict[str, Any] = {}
        for name, trait in cls.class_traits(config=True).items():
            var = env_name(name, cls)
            value = environ.get(var, "")
            if cls is EngineConfig and name == "state_dir" and not value:
                var, value = HOME_ENV, environ.get(HOME_ENV, "")
            if not value:
                continue
            try:
                settings[name] = _from_string(trait, value)
            except (TraitError, ValueError) as e:
                raise EngineConfigError(f"{var}={value!r}: {e}") from e
        if settings:
            config[cls.__name__] = Config(settings)
    return config


class SandforkEngineApp(Application):
    """``sandfork serve``: run the engine (HTTP API) in the foreground."""

    name = "sandfork serve"
    description = (
        "Run the Sandfork engine (HTTP API) in the foreground. Settings come from "
        f"{CONFIG_FILE_NAME}.py (in $SANDFORK_CONFIG_DIR or ~/.config/sandfork, "
        "<sys.prefix>/etc/sandfork, /etc/sandfork), then SANDFORK_<NAME> environment "
        "variables, then the command line; --help-all lists every setting."
    )
    examples = (
        "sandfork serve --port 0 --state-dir /tmp/engine\n"
        "sandfork serve --EngineConfig.max_sandboxes=8 --egress-allow 10.1.2.3/32\n"
        "sandfork serve --show-config"
    )
    classes = [*ENV_PREFIXES]  # noqa: RUF012 (traitlets' own class attribute)
    aliases = {  # noqa: RUF012
        **Application.aliases,
        "config": "SandforkEngineApp.config_file",
        "ip": "EngineConfig.ip",
        "port": "EngineConfig.port",
        "state-dir": "EngineConfig.state_dir",
        "accelerator": "EngineConfig.accelerator",
        "ram-dir": "EngineConfig.ram_dir",
        "boot-capture-dir": "EngineConfig.boot_capture_dir",
        "egress-allow": "EngineConfig.egress_allow",
        "max-sandboxes": "EngineConfig.max_sandboxes",
    }
    flags = {  # noqa: RUF012
        **Application.flags,
        "no-boot-captures": (
            {"EngineConfig": {"boot_captures": False}},
            "Boot every sandbox instead of restoring its template's boot capture.",
        ),
        "no-track-writes": (
            {"EngineConfig": {"track_writes": False}},
            "Compare every page a VM wrote at each capture instead of tracking its writes.",
        ),
        "copy-memory": (
            {"EngineConfig": {"copy_memory": True}},
            "Copy guest memory whole at every capture and restore (for comparison only).",
        ),
        "allow-host-access": (
            {"EngineConfig": {"allow_host_access": True}},
            "Let sandboxes created with host_access reach the host's loopback and private "
            "networks.",
        ),
    }

    log_level = Enum(
        (0, 10, 20, 30, 40, 50, "DEBUG", "INFO", "WARN", "ERROR", "CRITICAL"),
        logging.INFO,
        help="Set the log level by value or name (the engine's log; --debug: DEBUG).",
    ).tag(config=True)
    config_file = Unicode(
        "",
        help=f"A config file loaded after (over) the {CONFIG_FILE_NAME}.py files found in the "
        "config folders.",
    ).tag(config=True)

    def _create_loader(
        self,
        argv: list[str] | None,
        aliases: dict[str, Any],
        flags: dict[str, Any],
        classes: Any,
    ) -> KVArgParseConfigLoader:
        """The command-line parser, named ``sandfork serve`` in its messages."""
        return KVArgParseConfigLoader(
            argv, aliases, flags, classes=classes, log=self.log, prog=self.name
        )

    def initialize(self, argv: list[str] | None = None) -> None:
        """Read the command line, the config files and the environment (see the module)."""
        self.parse_command_line(argv)
        self.raise_config_file_errors = True
        self.load_config_files(os.environ)

    def load_config_files(self, environ: Mapping[str, str]) -> None:
        """Apply the config files, then ``environ``'s settings, then the command line again."""
        try:
            self.load_config_file(CONFIG_FILE_NAME, path=config_file_paths())
            if self.config_file:
                path = Path(self.config_file).expanduser().resolve()
                if not path.is_file():
                    raise EngineConfigError(f"config file {path} not found")
                self.load_config_file(str(path))
        except EngineConfigError:
            raise
        except Exception as e:  # a config file is Python: any error is the file's
            raise EngineConfigError(f"cannot load {CONFIG_FILE_NAME}: {e}") from e
        settings = env_config(environ)
        settings.merge(self.cli_config)  # the command line wins over the environment
        self.update_config(settings)

    def engine_config(self) -> EngineConfig:
        """The engine's settings as configured."""
        if (wrong := unknown_settings(self)) is not None:
            raise EngineConfigError(wrong)
        try:
            return EngineConfig(parent=self)
        except TraitError as e:
            raise EngineConfigError(str(e)) from e

    def start_show_config(self) -> None:
        """``--show-config``: check the settings as a start would, then print them."""
        self.engine_config()
        super().start_show_config()

    def start(self) -> None:
        """Run the engine until SIGINT/SIGTERM."""
        from sandfork.engine.server import serve

        config = self.engine_config()
        logging.basicConfig(
            level=cast(int | str, self.log_level),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        for path in self.loaded_config_files:
            self.log.info("loaded config file %s", path)
        asyncio.run(serve(config))


def run(argv: list[str]) -> int:
    """``sandfork serve ARGV``: run the engine application."""
    app = SandforkEngineApp()
    app.initialize(argv)
    app.start()
    return 0
