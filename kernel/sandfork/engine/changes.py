"""A feed of the changes clients draw: a sandbox created, deleted or changing status (or
lineage), a snapshot created, renamed or deleted. Clients long-poll it
(``GET /v1/changes?after=CURSOR``) and reload what they show when the cursor moves, instead
of polling the listings (the Jupyter server extension turns it into server push).

A cursor names the engine's run and a change count, so that a restarted engine (whose count
starts again) never looks unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from typing import Any


class ChangeFeed:
    """A change counter that long-polling clients wait on."""

    def __init__(self) -> None:
        self._run = uuid.uuid4().hex[:12]
        self._count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._lock = threading.Lock()
        self._seen: dict[str, Any] = {}  # sandbox id -> what of it was last drawn

    @property
    def cursor(self) -> str:
        """The position of the feed now."""
        return f"{self._run}.{self._count}"

    def tracked(self) -> dict[str, int]:
        """How many sandboxes the feed remembers (:mod:`sandfork.engine.stats`)."""
        return {"change_feed_sandboxes": len(self._seen)}

    def sandbox(self, sandbox_id: str, drawn: Any) -> None:
        """A sandbox row was written: a change if what clients draw of it (``drawn``) did."""
        with self._lock:
            if self._seen.get(sandbox_id) == drawn:
                return
            self._seen[sandbox_id] = drawn
        self.bump()

    def forget(self, sandbox_id: str) -> None:
        """A sandbox row was deleted."""
        with self._lock:
            self._seen.pop(sandbox_id, None)
        self.bump()

    def bump(self) -> None:
        """Something changed: wake the waiting clients (from any thread)."""
        with self._lock:
            self._count += 1
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._wake()
        else:
            loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait(self, after: str, seconds: float) -> str:
        """The cursor once it is not ``after`` any more, or after ``seconds`` anyway."""
        self._loop = asyncio.get_running_loop()
        deadline = self._loop.time() + seconds
        while self.cursor == after and self._loop.time() < deadline:
            if self._changed is None:
                self._changed = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), deadline - self._loop.time())
        return self.cursor
