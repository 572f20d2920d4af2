"""The kernel's process: options (traitlets config, the kernelspec's argv, the environment),
the sandbox it runs in, and the relay's event loop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

from jupyter_core.application import JupyterApp
from traitlets import Bool, Float, Int, Unicode, default

from sandfork.client import EngineClient, EngineConnection
from sandfork.protocol import CHECKPOINTS_KEPT, DEFAULT_CONTEXT
from sandfork.proxy_kernel.checkpoints import CellCheckpoints
from sandfork.proxy_kernel.lease import DEFAULT_SECONDS, LEASE_ENV
from sandfork.proxy_kernel.proxy import KernelProxy
from sandfork.proxy_kernel.state import Binding, load_state, state_file
from sandfork.sdk import Client, Sandbox


class SandforkKernelApp(JupyterApp):
    """``python -m sandfork.proxy_kernel -f {connection_file}``; configurable in
    ``sandfork_kernel_config.py`` like any Jupyter application (the engine as
    ``c.EngineConnection.engine_url`` and ``api_key``)."""

    name = "sandfork-kernel"
    description = "A Jupyter kernel whose cells run in a Sandfork sandbox."
    classes = [EngineConnection]  # noqa: RUF012 (traitlets' own class attribute)
    aliases = {  # noqa: RUF012 (traitlets' own class attribute)
        "f": "SandforkKernelApp.connection_file",
        "template": "SandforkKernelApp.template",
        "memory-mb": "SandforkKernelApp.memory_mb",
        "cpu": "SandforkKernelApp.cpu",
        "sandbox-id": "SandforkKernelApp.sandbox_id",
        "context": "SandforkKernelApp.context",
    }
    flags = {  # noqa: RUF012
        "persistent": ({"SandforkKernelApp": {"persistent": True}}, "Keep the sandbox at shutdown.")
    }

    connection_file = Unicode(help="The Jupyter connection file to serve.").tag(config=True)
    template = Unicode("code-interpreter", help="Template of a new sandbox.").tag(config=True)
    memory_mb = Int(0, help="Memory of a new sandbox in MiB (0: the template's).").tag(config=True)
    cpu = Int(0, help="CPUs of a new sandbox (0: the template's).").tag(config=True)
    persistent = Bool(False, help="Keep a new sandbox when the kernel shuts down.").tag(config=True)
    sandbox_id = Unicode(help="Attach to this running sandbox instead of creating one.").tag(
        config=True
    )
    context = Unicode(help="The code context to run in (default: the sandbox's default).").tag(
        config=True
    )
    own_sandbox = Bool(
        help="Kill the attached sandbox at shutdown, as if the kernel had created it."
    ).tag(config=True)
    lease_seconds = Float(
        help="Grace period of the kernel's own sandbox: the engine kills it this long after the "
        f"kernel stopped renewing its lease (the kernel died). Default: ${LEASE_ENV}, else "
        f"{DEFAULT_SECONDS:g}; the engine accepts 5 to 3600."
    ).tag(config=True)

    request_timeout = Float(
        3600.0,
        help="Seconds one engine request may take: the first sandbox of a template is booted "
        "and captured first, minutes under TCG and more on a loaded machine.",
    ).tag(config=True)

    checkpoint_cells = Bool(
        False,
        help="Capture the sandbox after every cell (incrementally), for %rewind; a notebook "
        "turns it on or off with %checkpoints on|off.",
    ).tag(config=True)
    checkpoints_kept = Int(
        CHECKPOINTS_KEPT, help="Per-cell checkpoints kept per kernel; older ones are deleted."
    ).tag(config=True)
    hibernate_after = Float(
        1800.0,
        help="Seconds a kernel may stay idle before its sandbox hibernates (captured, its VM "
        "stopped, memory freed; the next request wakes it with its state); 0: never. A "
        "notebook sets its own with %hibernate after SECONDS|off.",
    ).tag(config=True)

    @default("sandbox_id")
    def _sandbox_id_default(self) -> str:
        return os.environ.get("SANDFORK_SANDBOX_ID", "")

    @default("context")
    def _context_default(self) -> str:
        return os.environ.get("SANDFORK_CONTEXT", DEFAULT_CONTEXT)

    @default("lease_seconds")
    def _lease_seconds_default(self) -> float:
        return float(os.environ.get(LEASE_ENV) or DEFAULT_SECONDS)

    @default("own_sandbox")
    def _own_sandbox_default(self) -> bool:
        return os.environ.get("SANDFORK_OWN_SANDBOX", "") == "1"

    async def binding(self, client: Client, state: Path) -> Binding:
        """The configured sandbox, the one a restarted kernel had, or a new one."""
        saved = load_state(state)
        if saved is not None:  # a restart: the sandbox this kernel last ran in (%restore moves it)
            sandbox = await Sandbox.async_get(saved["sandbox_id"], client)
            return Binding(sandbox, saved["context"], owned=bool(saved["owned"]))
        if self.sandbox_id:
            sandbox = await Sandbox.async_get(self.sandbox_id, client)
            return Binding(sandbox, self.context, owned=self.own_sandbox)
        sandbox = await Sandbox.async_create(
            self.template,
            memory_mb=self.memory_mb or None,
            cpu=self.cpu or None,
            persistent=self.persistent,
            metadata={"created_by": "sandfork-kernel"},
            lease_seconds=None if self.persistent else self.lease_seconds,
            client=client,
        )
        return Binding(sandbox, self.context, owned=True)

    def start(self) -> None:
        """Serve the connection file until the kernel is shut down."""
        if not self.connection_file:
            self.exit("the connection file is required: -f {connection_file}")
        connection = json.loads(Path(self.connection_file).read_text())
        state = state_file(self.connection_file)
        saved = (load_state(state) or {}).get("checkpoints")
        checkpoints = CellCheckpoints.from_state(
            saved, self.checkpoint_cells, self.checkpoints_kept
        )
        config = EngineConnection.of(self, self.log)
        engine = EngineClient(
            config.engine_url or None, config.api_key or None, self.request_timeout
        )
        # Found now, before the loop runs: finding it there would take a thread.
        engine.resolve_now()
        asyncio.run(self._serve(connection, Client.wrapping(engine), state, checkpoints))

    async def _serve(
        self,
        connection: dict[str, Any],
        client: Client,
        state: Path,
        checkpoints: CellCheckpoints,
    ) -> None:
        binding = await self.binding(client, state)
        proxy = KernelProxy(
            connection, binding, state, self.lease_seconds, checkpoints, self.hibernate_after
        )
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, proxy.terminate)
        # Interrupts come as messages (interrupt_mode: message); a terminal's Ctrl-C is not ours.
        loop.add_signal_handler(signal.SIGINT, lambda: None)
        await proxy.run()


def main() -> None:
    """Entry point of ``python -m sandfork.proxy_kernel``."""
    SandforkKernelApp.launch_instance()
