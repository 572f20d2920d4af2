"""The gateway's fleet: the engines registered with it, whether each answers, what each can
still take, and which engine owns which sandbox and snapshot.

Ownership is learned, never configured: from the records the engines' answers carry as the
gateway relays them (a create, a fork, a snapshot, a listing), from listing an engine when it
registers, and, for an id never seen, by asking every engine that answers. It is kept in
memory only: the engines are the truth about what they hold, and a restarted gateway learns
it all again from their next heartbeats (each lists its engine again). What it loses is the
last record of a sandbox whose engine is silent when the gateway starts.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandfork.client import EngineClient
from sandfork.protocol import (
    DEFAULT_MEMORY_MB,
    SANDBOX_ID,
    SNAPSHOT_ID,
    AuthError,
    BadRequestError,
    SandboxStatus,
    SandforkError,
    routes,
)
from sandfork.serving import key_matches

log = logging.getLogger(__name__)

_SANDBOX = re.compile(SANDBOX_ID)
_SNAPSHOT = re.compile(SNAPSHOT_ID)
CAPACITY_COUNTS = ("memory_free_mb", "sandboxes", "max_sandboxes")
"""The numbers of a heartbeat's capacity that placement reads."""
RECORD_KEYS = ("sandbox", "children", "items", "snapshots")
"""Where an answer holds records besides its top level (a fork's, a resume's, a listing)."""


@dataclass
class Engine:
    """One registered engine, as its last heartbeat described it."""

    name: str
    url: str
    api_key: str
    instance: str  # its run: a new one after a restart
    interval: float  # seconds between its heartbeats
    capacity: dict[str, Any]
    last_seen: float  # time.monotonic() of its last heartbeat
    failure: str | None = None  # a relayed call could not reach it since that heartbeat
    client: EngineClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = EngineClient(self.url, self.api_key, auto_start=False)

    def describe(self) -> str:
        """How messages name it."""
        return f"engine {self.name!r} ({self.url})"

    def free_memory_mb(self) -> int:
        """Memory it can still give sandboxes, as it last said (less what was placed since)."""
        return int(self.capacity.get("memory_free_mb", 0))

    def fits(self, memory_mb: int) -> bool:
        """Whether one more sandbox of ``memory_mb`` fits, by its last heartbeat."""
        room = int(self.capacity.get("max_sandboxes", 0)) - int(self.capacity.get("sandboxes", 0))
        return room > 0 and self.free_memory_mb() >= memory_mb


def memory_of(value: object) -> int:
    """A record's or a request's ``memory_mb`` if it is one, else the default."""
    return value if isinstance(value, int) and value > 0 else DEFAULT_MEMORY_MB


def _text(body: dict[str, Any], name: str, longest: int = 2048) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value or len(value) > longest:
        raise BadRequestError(f"a heartbeat's {name!r} is text of 1 to {longest} characters")
    return value


class Fleet:
    """The engines of one gateway and what they own."""

    def __init__(self, engine_keys: dict[str, str], missed_heartbeats: int) -> None:
        self._keys = dict(engine_keys)
        self._missed = missed_heartbeats
        self.engines: dict[str, Engine] = {}
        self._sandboxes: dict[str, tuple[str, dict[str, Any]]] = {}  # id: engine, last record
        self._snapshots: dict[str, dict[str, dict[str, Any]]] = {}  # id: engine: record
        self._changed = asyncio.Event()
        self._was_down: dict[str, bool] = {}

    # -- registration and liveness -------------------------------------------------------

    def heartbeat(self, key: str, body: dict[str, Any]) -> tuple[Engine, bool]:
        """Take one engine's heartbeat (``key``: the engine key it sent); the engine, and
        whether it is new to the gateway (first seen, restarted or moved: list it)."""
        name = _text(body, "name", 128)
        expected = self._keys.get(name)
        if expected is None or not key_matches(key, expected):
            raise AuthError(f"engine {name[:128]!r} is not registered here with that key")
        url = _text(body, "url").rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise BadRequestError(f"a heartbeat's url is http(s)://, not {url[:64]!r}")
        interval = body.get("interval")
        if not isinstance(interval, int | float) or not 0 < interval <= 3600:
            raise BadRequestError("a heartbeat's interval is a number of seconds, 0 to 3600")
        capacity = body.get("capacity")
        if not isinstance(capacity, dict) or not all(
            isinstance(capacity.get(k, 0), int) for k in CAPACITY_COUNTS
        ):
            raise BadRequestError(
                f"a heartbeat's capacity is a JSON object whose {', '.join(CAPACITY_COUNTS)} "
                "are integers"
            )
        instance = _text(body, "instance", 64)
        api_key = _text(body, "api_key", 512)
        old = self.engines.get(name)
        new = old is None or (old.instance, old.url, old.api_key) != (instance, url, api_key)
        if new:
            engine = Engine(name, url, api_key, instance, float(interval), capacity, 0.0)
            self.engines[name] = engine
        else:
            assert old is not None
            engine = old
            engine.capacity, engine.interval = capacity, float(interval)
        engine.last_seen, engine.failure = time.monotonic(), None
        self.check_liveness()
        return engine, new

    def down_reason(self, engine: Engine) -> str | None:
        """Why the engine counts as not answering (None: it answers)."""
        if engine.failure is not None:
            return engine.failure
        silent = time.monotonic() - engine.last_seen
        if silent > engine.interval * self._missed:
            return (
                f"no heartbeat for {silent:.1f} s ({self._missed} missed at "
                f"{engine.interval:g} s each)"
            )
        return None

    def unreachable(self, engine: Engine, error: object) -> None:
        """A relayed call could not reach ``engine``: down until its next heartbeat."""
        engine.failure = f"it did not answer the gateway: {error}"
        self.check_liveness()

    def alive(self) -> list[Engine]:
        """The engines that answer, by name."""
        return [e for _, e in sorted(self.engines.items()) if self.down_reason(e) is None]

    def check_liveness(self) -> None:
        """Note engines that went down or came back (the change feed moves)."""
        for name, engine in self.engines.items():
            reason = self.down_reason(engine)
            down = reason is not None
            if self._was_down.get(name) != down:
                self._was_down[name] = down
                if down:
                    log.warning("%s stopped answering: %s", engine.describe(), reason)
                self._changed.set()

    async def changed(self, timeout: float) -> None:
        """Wait until an engine goes down or comes back, or ``timeout`` runs out."""
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass

    # -- placement ---------------------------------------------------------------------

    def candidates(self, memory_mb: int) -> list[Engine]:
        """The answering engines where a sandbox of ``memory_mb`` fits, most free memory
        first."""
        fitting = [e for e in self.alive() if e.fits(memory_mb)]
        return sorted(fitting, key=lambda e: -e.free_memory_mb())

    def placed(self, engine: Engine, memory_mb: int) -> None:
        """A sandbox was started there: count it until the engine's next heartbeat."""
        engine.capacity["memory_free_mb"] = engine.free_memory_mb() - memory_mb
        engine.capacity["sandboxes"] = int(engine.capacity.get("sandboxes", 0)) + 1

    # -- ownership ---------------------------------------------------------------------

    def learn(self, engine: Engine, answer: Any) -> None:
        """Note the sandboxes and snapshots an answer of ``engine`` describes (its top level
        and :data:`RECORD_KEYS`; nothing deeper, where guest output could pose as one)."""
        for record in _records(answer):
            ident = record.get("id")
            if isinstance(ident, str) and _SANDBOX.fullmatch(ident) and "status" in record:
                self._sandboxes[ident] = (engine.name, record)
            elif isinstance(ident, str) and _SNAPSHOT.fullmatch(ident):
                self._snapshots.setdefault(ident, {})[engine.name] = record
            checkpoint = record.get("snapshot_id")
            if record.get("type") == "sandbox.checkpoint_created" and isinstance(checkpoint, str):
                self.holds(engine, checkpoint)

    def holds(self, engine: Engine, snapshot_id: str) -> None:
        """``engine`` holds the snapshot (a checkpoint it took, a snapshot it fetched)."""
        self._snapshots.setdefault(snapshot_id, {}).setdefault(engine.name, {})

    def killed(self, sandbox_id: str) -> None:
        """The sandbox was killed through the gateway (its engine lists it no more)."""
        if sandbox_id in self._sandboxes:
            name, record = self._sandboxes[sandbox_id]
            self._sandboxes[sandbox_id] = (name, {**record, "status": SandboxStatus.DEAD.value})

    def sandbox_owner(self, sandbox_id: str) -> Engine | None:
        """The engine known to own the sandbox."""
        owner = self._sandboxes.get(sandbox_id)
        return self.engines.get(owner[0]) if owner else None

    def snapshot_holders(self, snapshot_id: str) -> list[Engine]:
        """The engines known to hold the snapshot (it took it, or fetched it from the
        snapshot store), those that answer first."""
        held = [self.engines[n] for n in self._snapshots.get(snapshot_id, {}) if n in self.engines]
        return sorted(held, key=lambda e: self.down_reason(e) is not None)

    def snapshot_owner(self, snapshot_id: str) -> Engine | None:
        """An engine known to hold the snapshot, one that answers if any does."""
        holders = self.snapshot_holders(snapshot_id)
        return holders[0] if holders else None

    def sandbox_memory_mb(self, sandbox_id: str) -> int:
        """The memory the sandbox takes, as its last record says."""
        return memory_of(self._sandboxes.get(sandbox_id, ("", {}))[1].get("memory_mb"))

    def dropped(self, snapshot_id: str) -> None:
        """The snapshot was deleted from every engine that held it."""
        self._snapshots.pop(snapshot_id, None)

    def snapshot_memory_mb(self, snapshot_id: str) -> int:
        """The memory a sandbox restored from the snapshot takes, as its record says."""
        for record in self._snapshots.get(snapshot_id, {}).values():
            memory_mb = record.get("memory_mb")
            if isinstance(memory_mb, int) and memory_mb > 0:
                return memory_mb
        return DEFAULT_MEMORY_MB

    def restored(self, engine: Engine, snapshot_id: str) -> None:
        """A sandbox was restored there from the snapshot (fetched first if it lacked it)."""
        self.placed(engine, self.snapshot_memory_mb(snapshot_id))
        self.holds(engine, snapshot_id)

    def restore_places(self, snapshot_id: str) -> list[Engine]:
        """Where a restore of the snapshot is tried, in turn: the answering engines that
        hold it and have room, then the others with room (they fetch it from the snapshot
        store), then the holders without room (whose refusal is then the answer)."""
        holders = {e.name for e in self.snapshot_holders(snapshot_id)}
        fitting = self.candidates(self.snapshot_memory_mb(snapshot_id))
        full = [e for e in self.alive() if e.name in holders and e not in fitting]
        return sorted(fitting, key=lambda e: e.name not in holders) + full

    async def find(self, path: str, owner: Callable[[], Engine | None]) -> Engine | None:
        """The owner, after asking every answering engine for ``path`` (a sandbox's or a
        snapshot's) when it is not known yet."""
        found = owner()
        if found is not None:
            return found
        engines = self.alive()
        answers = await asyncio.gather(
            *(e.client.request("GET", path) for e in engines), return_exceptions=True
        )
        for engine, answer in zip(engines, answers, strict=True):
            if not isinstance(answer, BaseException):
                self.learn(engine, answer)
        return owner()

    def dead_records(self, engine: Engine, reason: str) -> list[dict[str, Any]]:
        """The sandboxes of an engine that does not answer, as last seen, reported dead
        (those already dead before are left out, as the engine lists no killed one)."""
        return [
            self.dead_record(sandbox_id, engine, reason)
            for sandbox_id, (name, record) in self._sandboxes.items()
            if name == engine.name and record.get("status") != SandboxStatus.DEAD.value
        ]

    def dead_record(self, sandbox_id: str, engine: Engine, reason: str) -> dict[str, Any]:
        """One sandbox of an engine that does not answer, reported dead with the reason."""
        record = self._sandboxes.get(sandbox_id, ("", {"id": sandbox_id}))[1]
        error = f"{engine.describe()} stopped answering: {reason}"
        return {**record, "status": SandboxStatus.DEAD.value, "error": error}

    async def register(self, engine: Engine) -> None:
        """Learn what a new engine holds (its sandboxes and snapshots)."""
        for path in (routes.SANDBOXES, routes.SNAPSHOTS):
            try:
                self.learn(engine, await engine.client.request("GET", path))
            except SandforkError as e:
                log.warning("could not list what %s holds: %s", engine.describe(), e)
                return
        log.info("%s registered", engine.describe())


def _records(answer: Any) -> list[dict[str, Any]]:
    if isinstance(answer, list):
        return [r for r in answer if isinstance(r, dict)]
    if not isinstance(answer, dict):
        return []
    found = [answer]
    for key in RECORD_KEYS:
        inner = answer.get(key)
        found += [inner] if isinstance(inner, dict) else _records(inner)
    return found
