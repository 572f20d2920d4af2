"""Where Sandfork keeps its files on the host.

Every location can be moved with an environment variable, which is what tests and
multi-user setups use:

- ``cache_dir()``: ``$SANDFORK_CACHE_DIR`` or ``$XDG_CACHE_HOME/sandfork`` (``~/.cache/sandfork``):
  rebuildable artifacts (template images, downloaded packages).
- ``config_dir()``: ``$SANDFORK_CONFIG_DIR`` or ``$XDG_CONFIG_HOME/sandfork``
  (``~/.config/sandfork``): files a person writes (``sandfork_engine_config.py``, templates).
- ``state_dir()``: ``$SANDFORK_STATE_DIR``, ``$SANDFORK_HOME`` or ``$XDG_STATE_HOME/sandfork``
  (``~/.local/state/sandfork``): data that is not rebuildable (sandboxes, snapshots).
- ``runtime_dir()``: ``state_dir()/run``: the running engine's address and API key.
- ``user_templates_dir()``: ``$SANDFORK_TEMPLATES_DIR`` or ``config_dir()/templates``.

The functions only compute paths; they never create directories.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "config_dir", "runtime_dir", "state_dir", "user_templates_dir"]


def _from_env(var: str, xdg_var: str, xdg_default: str) -> Path:
    value = os.environ.get(var)
    if value:
        return Path(value).expanduser()
    base = os.environ.get(xdg_var) or str(Path.home() / xdg_default)
    return Path(base).expanduser() / "sandfork"


def cache_dir() -> Path:
    """Directory for rebuildable artifacts (``$SANDFORK_CACHE_DIR`` or ``~/.cache/sandfork``)."""
    return _from_env("SANDFORK_CACHE_DIR", "XDG_CACHE_HOME", ".cache")


def config_dir() -> Path:
    """Directory for user configuration (``$SANDFORK_CONFIG_DIR`` or ``~/.config/sandfork``)."""
    return _from_env("SANDFORK_CONFIG_DIR", "XDG_CONFIG_HOME", ".config")


def state_dir() -> Path:
    """Directory for persistent state (``$SANDFORK_STATE_DIR``, ``$SANDFORK_HOME`` or
    ``~/.local/state/sandfork``)."""
    home = os.environ.get("SANDFORK_HOME")
    if home and not os.environ.get("SANDFORK_STATE_DIR"):
        return Path(home).expanduser()
    return _from_env("SANDFORK_STATE_DIR", "XDG_STATE_HOME", ".local/state")


def runtime_dir() -> Path:
    """Directory of the running engine's files (``engine.json``, ``api_key``):
    ``state_dir()/run``."""
    return state_dir() / "run"


def user_templates_dir() -> Path:
    """Directory of user template specs, ``*.toml`` (``$SANDFORK_TEMPLATES_DIR`` or
    ``config_dir()/templates``)."""
    value = os.environ.get("SANDFORK_TEMPLATES_DIR")
    if value:
        return Path(value).expanduser()
    return config_dir() / "templates"
