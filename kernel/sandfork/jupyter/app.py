"""The Jupyter Server extension application: configuration and handler registration."""

from __future__ import annotations

from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Int

from sandfork.client import EngineConnection
from sandfork.jupyter.handlers import HANDLERS
from sandfork.jupyter.lineage_events import LineageEvents
from sandfork.jupyter.operations import Operations
from sandfork.jupyter.ports import PORT_HANDLERS
from sandfork.jupyter.service import SandforkService
from sandfork.protocol import MAX_BRANCHES


class SandforkExtension(ExtensionApp):
    """Snapshot, restore and fork for notebooks on Sandfork kernels.

    Configure in ``jupyter_server_config.py`` as ``c.SandforkExtension.<trait>``; the engine
    as ``c.EngineConnection.engine_url`` and ``api_key``.
    """

    name = "sandfork"
    load_other_extensions = True
    classes = [EngineConnection]  # noqa: RUF012 (traitlets' own class attribute)

    max_branches = Int(MAX_BRANCHES, help="Most branch notebooks one fork may open.").tag(
        config=True
    )
    max_json_depth = Int(
        64,
        help="Deepest nesting of arrays and objects in a request body or a stored notebook; "
        "deeper are refused (400, 422). More than the engine's 32: a notebook's JSON outputs "
        "and widget state nest inside the document.",
    ).tag(config=True)
    lease_seconds = Float(
        120.0,
        help="Lease of a sandbox made for a restored or branch notebook, until its kernel "
        "attaches and keeps the lease itself: if the server goes first, the engine kills it.",
    ).tag(config=True)

    def initialize_settings(self) -> None:
        """Make the service the handlers use."""
        engine = EngineConnection.of(self, self.log).client()
        serverapp: Any = self.serverapp
        self.events = LineageEvents(serverapp.event_logger, engine, serverapp.kernel_manager)
        service = SandforkService(
            self.serverapp,
            engine,
            Operations(),
            self.max_branches,
            self.lease_seconds,
            self.max_json_depth,
            self.events.emit,
        )
        self.settings["sandfork_service"] = service

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Start pushing lineage events, once the server's event loop runs."""
        self.events.start()

    async def stop_extension(self) -> None:
        """Stop pushing lineage events."""
        await self.events.stop()

    def initialize_handlers(self) -> None:
        """Register the REST handlers and the sandboxes' ports (under the server's base URL)."""
        self.handlers.extend(HANDLERS)
        self.handlers.extend(PORT_HANDLERS)
