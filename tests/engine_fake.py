"""An engine in this process on the fake backend, for the tests of the engine's own rules.

Everything but the backend is the engine's own: its SQLite database in a temporary folder,
the snapshot store, limits, leases, boot captures and the three services, built by
:meth:`EngineServices.build` as ``sandfork serve`` builds them. The backend is
:class:`sandfork.backends.fake.FakeBackend` (no VM, no process), the template a small file
standing for its image, the lease clock one the test moves. See ``docs/design-notes.md``,
"Testing the engine's rules".
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandfork.backends.fake import FakeBackend, FakeHost, FakeImages
from sandfork.engine.backends import Backends
from sandfork.engine.boot_captures import BootCaptures
from sandfork.engine.db import Database, SandboxRecord
from sandfork.engine.execution import ShellCommand
from sandfork.engine.leases import Leases
from sandfork.engine.limits import Limits
from sandfork.engine.services import Bounds, EngineServices
from sandfork.engine.snapshot_store import SnapshotStore
from sandfork.protocol import SandboxStatus
from sandfork.store.chunks import ChunkStore
from sandfork.templates import BuiltTemplate, TemplateSpec

TEMPLATE = "code-interpreter"  # its spec is read; its image is the fake's small file
TICK = 1.0  # seconds the clock moves between two ticks of the watch loop
DB = "engine.sqlite"  # as `sandfork serve` names it


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# The engine's limits unless a test says otherwise (``Engines.start(limits=...)``).
LIMITS = {"max_sandboxes": 8, "max_total_memory_mb": 64 * 1024, "snapshot_quota_mb": 0}


@dataclass
class FakeEngine:
    """One engine (its services over its database) on the fake backend."""

    root: Path  # the test's folder: the engine's state is in root / "home"
    host: FakeHost
    clock: Clock
    db: Database
    services: EngineServices
    boot_captures: bool
    limits: dict[str, int]  # what the test changed of :data:`LIMITS`
    chunks: ChunkStore | None = None  # its snapshot store

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def store(self) -> SnapshotStore:
        return self.services.snapshots.store

    async def create(self, memory_mb: int = 256, persistent: bool = False) -> SandboxRecord:
        """A new sandbox of the template, through the engine."""
        return await self.services.sandboxes.create(
            TEMPLATE, memory_mb=memory_mb, cpu=1, metadata={}, persistent=persistent
        )

    async def restore(self, snapshot_id: str) -> SandboxRecord:
        """A new sandbox resuming a snapshot, through the engine."""
        return await self.services.sandboxes.create_from_snapshot(
            snapshot_id, metadata={}, persistent=False
        )

    async def write(self, sandbox_id: str, path: str, data: bytes) -> None:
        """Write a file in the sandbox through the engine."""
        await self.services.execution.write_file(sandbox_id, path, data)

    async def read(self, sandbox_id: str, path: str) -> bytes:
        """Read a file in the sandbox through the engine."""
        return await self.services.execution.read_file(sandbox_id, path)

    async def exec(self, sandbox_id: str, cmd: str) -> dict[str, object]:
        """Run a command through the engine (the fake answers it as its output)."""
        return await self.services.execution.exec(sandbox_id, ShellCommand(cmd), {"cmd": cmd})

    async def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass, the watch loop ticking every :data:`TICK` as it does."""
        while seconds > 0:
            self.clock.now += min(TICK, seconds)
            seconds -= TICK
            await self.services.sandboxes.tick()

    def layers(self) -> set[Path]:
        """The layer files on disk, once every deletion in flight is done; the database
        lists exactly these."""
        self.store.drain()
        on_disk = {p for p in self.store.layers_dir.iterdir() if not p.name.startswith(".")}
        assert {Path(p) for p in self.db.layers()} == on_disk
        return on_disk

    async def stop(self) -> None:
        """Detach from the sandboxes (they run on in the fake host) and close the database."""
        await self.services.stop()
        self.db.close()


class Engines:
    """The engines one test runs, one after the other, over one state folder, one fake host
    and one clock; :meth:`close` stops every one."""

    def __init__(self, root: Path, host: FakeHost) -> None:
        self.root = root
        self.host = host
        self.clock = Clock()
        self._started: list[FakeEngine] = []

    async def start(
        self,
        *,
        boot_captures: bool = False,
        limits: dict[str, int] | None = None,
        chunks: ChunkStore | None = None,
    ) -> FakeEngine:
        """An engine over the state folder (made if missing), started; ``limits`` change
        those of :data:`LIMITS`; ``chunks`` is its snapshot store."""
        engine = build_engine(self.root, self.host, self.clock, boot_captures, limits or {}, chunks)
        self._started.append(engine)
        await engine.services.start()
        return engine

    async def restart(
        self, engine: FakeEngine, edit: Callable[[Database], None] | None = None
    ) -> FakeEngine:
        """Stop ``engine`` (its sandboxes run on), let ``edit`` change the database as an
        engine killed at the wrong instant leaves it, and start another engine."""
        await engine.stop()
        if edit is not None:
            db = Database(engine.home / DB)
            edit(db)
            db.close()
        return await self.start(
            boot_captures=engine.boot_captures, limits=engine.limits, chunks=engine.chunks
        )

    async def close(self) -> None:
        """Stop every engine started."""
        for engine in self._started:
            await engine.stop()


def set_status(sandbox_id: str, status: SandboxStatus) -> Callable[[Database], None]:
    """An edit for :meth:`Engines.restart`: the sandbox's record has ``status``."""

    def edit(db: Database) -> None:
        (record,) = [r for r in db.all() if r.id == sandbox_id]
        record.status = status
        db.put(record)

    return edit


def template(root: Path) -> BuiltTemplate:
    """The template, built: its image a fake layer that lies over nothing."""
    image = root / "template" / "rootfs.fake"
    image.parent.mkdir(parents=True, exist_ok=True)
    image.write_text("{}")
    spec = TemplateSpec(name=TEMPLATE, memory_mb=256, cpu=1)
    when = datetime.datetime.now(datetime.UTC)
    return BuiltTemplate(TEMPLATE, "fake", image, image, image, "", when, spec, "fake", "fake")


def build_engine(
    root: Path,
    host: FakeHost,
    clock: Clock,
    boot_captures: bool,
    limits: dict[str, int],
    chunks: ChunkStore | None = None,
) -> FakeEngine:
    """The services of an engine over the state in ``root / "home"``, its sandboxes on
    ``host``, not started yet."""
    home = root / "home"
    db = Database(home / DB)
    backends = Backends({"vm": FakeBackend(host)}, "vm", allow_container=False)
    captures = BootCaptures(root / "boot-captures", backends.all()) if boot_captures else None
    services = EngineServices.build(
        db,
        backends,
        home,
        captures,
        root / "ram" / "staging",
        Limits(**{**LIMITS, **limits}, snapshots_dir=home),
        Bounds(
            max_output=1 << 20, default_timeout=60.0, agent_timeout=30.0, max_file_bytes=1 << 25
        ),
        chunks=chunks,
    )
    built = template(root)
    services.sandboxes.build_template = lambda spec: built
    services.sandboxes.leases = Leases(tick=TICK, clock=clock)
    return FakeEngine(root, host, clock, db, services, boot_captures, limits, chunks)


def chain(disk: str | Path) -> list[Path]:
    """A layer and those below it, as the fake's layer files name them."""
    return FakeImages().backing_chain(Path(disk))
