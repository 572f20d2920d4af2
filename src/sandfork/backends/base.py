"""The interface every sandbox backend implements."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from sandfork.backends.channel import AgentChannel
from sandfork.templates import BuiltTemplate


class Instance(Protocol):
    """One running sandbox as a backend sees it."""

    pid: int
    agent: AgentChannel

    def is_alive(self) -> bool:
        """True while the sandbox runs."""

    def failure_reason(self) -> str:
        """Why the sandbox stopped, for the person who asks."""

    async def destroy(self) -> None:
        """Stop the sandbox and delete everything it owns."""


class Backend(Protocol):
    """Creates sandboxes from templates and re-attaches to running ones."""

    name: str

    @property
    def accelerator(self) -> str:
        """How sandboxes are run (for example ``tcg`` or ``kvm``)."""

    async def create(
        self, template: BuiltTemplate, memory_mb: int, cpus: int, directory: Path
    ) -> Instance:
        """Start a sandbox from ``template`` with its files in ``directory``."""

    async def adopt(self, directory: Path, pid: int) -> Instance:
        """Re-attach to a sandbox an earlier engine process started."""
