"""The engine's services, built together: what the HTTP handlers speak to.

- :class:`~sandfork.engine.sandboxes.SandboxService`: the life of each sandbox (create,
  restore, watch, lease), each status transition its
  :class:`~sandfork.engine.lifecycle.Lifecycle`'s (start, pause, hibernate, wake, kill,
  adopt after a restart);
- :class:`~sandfork.engine.execution.ExecutionService`: work inside a running sandbox
  (commands, files, code contexts) and the ledger that records it;
- :class:`~sandfork.engine.snapshots.SnapshotService`: snapshots, forks, checkpoints,
  export and import.

Each is given its collaborators when it is built (:meth:`EngineServices.build`); the
:class:`~sandfork.engine.capture.Capturer`, which the hibernations of the sandbox service and
the snapshots of the snapshot service both use, is built before either. Data flows one way:
handler → service → backend → guest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandfork.engine.backends import Backends
from sandfork.engine.boot_captures import BootCaptures
from sandfork.engine.capture import Capturer
from sandfork.engine.config import EngineConfig
from sandfork.engine.db import Database
from sandfork.engine.egress_tunnel import EgressTunnels
from sandfork.engine.execution import ExecutionService
from sandfork.engine.fetches import Fetches
from sandfork.engine.lazy_servers import LazyServers
from sandfork.engine.ledger import Ledger
from sandfork.engine.limits import Limits
from sandfork.engine.sandboxes import SandboxService
from sandfork.engine.snapshot_store import SnapshotStore
from sandfork.engine.snapshots import SnapshotService
from sandfork.engine.template_travel import TemplateTravel
from sandfork.engine.uploads import Uploads
from sandfork.store.chunks import ChunkStore


@dataclass(frozen=True)
class Bounds:
    """What one request may cost inside a sandbox."""

    max_output: int  # bytes kept per output stream of exec and run_code
    default_timeout: float  # seconds of an exec or run_code that names none
    agent_timeout: float  # seconds any agent request may take past its own timeout
    max_file_bytes: int  # largest file read or written in one request
    # seconds a snapshot waits for the kernel's variable inventory
    inventory_timeout: float = EngineConfig.inventory_timeout.default_value
    # seconds a hibernation waits for the work in its sandbox to end
    hibernate_wait: float = EngineConfig.hibernate_wait.default_value
    # the largest sandbox a snapshot fetched from the snapshot store may restore into
    max_memory_mb: int = EngineConfig.max_memory_mb.default_value
    max_cpus: int = EngineConfig.max_cpus.default_value


@dataclass(frozen=True)
class EngineServices:
    """The three services of one engine over one database, its backends and state folder."""

    sandboxes: SandboxService
    execution: ExecutionService
    snapshots: SnapshotService
    uploads: Uploads | None = None

    @classmethod
    def build(
        cls,
        db: Database,
        backends: Backends,
        home: Path,
        boot_captures: BootCaptures | None,
        scratch: Path,
        limits: Limits,
        bounds: Bounds,
        egress: EgressTunnels | None = None,
        chunks: ChunkStore | None = None,
        lazy: LazyServers | None = None,
    ) -> EngineServices:
        """The services of an engine whose state is in ``home`` (fork captures in the RAM
        folder's ``scratch``); ``egress`` serves the sandboxes' egress channels; ``chunks``
        is the snapshot store snapshots are uploaded to and fetched from (``None``: they
        stay on this engine's disk); ``lazy`` serves a fetched snapshot's memory while it
        fills (``None``: fetches are whole)."""
        store = SnapshotStore(db, home, scratch)
        ledger = Ledger(db)
        capturer = Capturer(
            db,
            store,
            backends,
            inventory_timeout=bounds.inventory_timeout,
            agent_timeout=bounds.agent_timeout,
        )
        fetches = uploads = None
        if chunks is not None:
            templates = TemplateTravel(chunks, store.tmp_dir)
            uploads = Uploads(store, chunks, backends, templates)
            fetches = Fetches(
                store,
                chunks,
                backends,
                limits,
                templates,
                max_memory_mb=bounds.max_memory_mb,
                max_cpus=bounds.max_cpus,
                lazy=lazy,
            )
        sandboxes = SandboxService(
            db,
            backends,
            home,
            store,
            capturer,
            boot_captures,
            limits,
            hibernate_wait=bounds.hibernate_wait,
            egress=egress,
            fetches=fetches,
        )
        execution = ExecutionService(
            sandboxes,
            ledger,
            max_output=bounds.max_output,
            default_timeout=bounds.default_timeout,
            agent_timeout=bounds.agent_timeout,
            max_file_bytes=bounds.max_file_bytes,
        )
        snapshots = SnapshotService(sandboxes, execution, store, ledger, backends, limits, uploads)
        return cls(sandboxes, execution, snapshots, uploads)

    async def start(self) -> None:
        """Adopt the sandboxes an earlier engine left, clean up after it, start watching."""
        await self.sandboxes.start()
        if self.sandboxes.fetches is not None:
            await self.sandboxes.fetches.start()
        if self.uploads is not None:
            self.uploads.start()

    async def stop(self) -> None:
        """Detach from every sandbox; the VMs keep running for the next engine (and uploads
        in flight resume in it)."""
        await self.snapshots.store.writes.drain()  # memory layers still being written
        if self.sandboxes.fetches is not None:
            await self.sandboxes.fetches.stop()  # fetched snapshots still filling
        if self.uploads is not None:
            await self.uploads.stop()
        await self.sandboxes.stop()
