"""``EngineConnection``: the one configurable for the engine's URL and key, shared by the
proxy kernel's application and the server extension (``c.EngineConnection.engine_url``,
``c.EngineConnection.api_key``)."""

from __future__ import annotations

import logging

from traitlets import Unicode
from traitlets.config import Configurable

from sandfork.client.engine_client import EngineClient

_TRAITS = ("engine_url", "api_key")


class EngineConnection(Configurable):
    """Which engine to talk to. Unset, the engine is found like the SDK finds it: the
    environment (``SANDFORK_API`` and ``SANDFORK_API_KEY``), then the local engine."""

    engine_url = Unicode(help="The Sandfork engine's URL (default: as the SDK finds it).").tag(
        config=True
    )
    api_key = Unicode(help="The engine's API key (with engine_url).").tag(config=True)

    @classmethod
    def of(cls, parent: Configurable, log: logging.Logger | None = None) -> EngineConnection:
        """The connection configured for ``parent``'s application.

        The names these traits had before, ``c.<parent's class>.engine_url`` and ``api_key``,
        still work (with a deprecation warning) where the new ones are not set.
        """
        connection = cls(parent=parent)
        old = parent.config.get(type(parent).__name__, {})
        for name in _TRAITS:
            if name in old and not getattr(connection, name):
                (log or logging.getLogger(__name__)).warning(
                    "c.%s.%s is deprecated: use c.EngineConnection.%s",
                    type(parent).__name__,
                    name,
                    name,
                )
                setattr(connection, name, str(old[name]))
        return connection

    def client(self, timeout: float = 600.0) -> EngineClient:
        """An asynchronous client of the configured engine."""
        return EngineClient(self.engine_url or None, self.api_key or None, timeout)
