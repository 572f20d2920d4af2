"""Work in flight in each sandbox, and the hibernations that wait for it to end.

Every API request that works inside a sandbox (exec, run_code, files, code contexts,
snapshots, forks) runs as an *operation* (:meth:`Activity.operation`). A hibernation stops
the VM, so it must not cut one short: :meth:`Activity.quiet` holds new operations back, waits
until none runs and no kernel of the sandbox is busy (a notebook cell sent through the kernel
channels is no API call, but its kernel says busy and idle), and only then lets the capture
and the stop happen. The wait is bounded (``EngineConfig.hibernate_wait``); past it the
hibernation is refused with a 409 "busy: …" and the sandbox runs on. Operations held back
run once the hibernation is over, and the first of them wakes the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from sandfork.engine.errors import Conflict

log = logging.getLogger(__name__)


class Activity:
    """Counts the operations running in each sandbox; holds them back during a hibernation."""

    def __init__(self) -> None:
        self._running: dict[str, int] = {}
        self._held: dict[str, asyncio.Event] = {}  # set when the sandbox's hibernation is over
        self._changed: dict[str, asyncio.Event] = {}  # set when a hibernation should look again

    def running(self, sandbox_id: str) -> int:
        """How many operations run in the sandbox now."""
        return self._running.get(sandbox_id, 0)

    async def held_back(self, sandbox_id: str) -> None:
        """Return once no hibernation of the sandbox is under way (at once if none is)."""
        while (over := self._held.get(sandbox_id)) is not None:
            log.info("sandbox %s: a request waits for its hibernation to end", sandbox_id)
            await over.wait()

    @contextlib.asynccontextmanager
    async def operation(self, sandbox_id: str) -> AsyncIterator[None]:
        """The block is an operation in the sandbox: it starts after any hibernation under
        way, and a hibernation waits for it to end."""
        await self.held_back(sandbox_id)
        self._running[sandbox_id] = self.running(sandbox_id) + 1
        try:
            yield
        finally:
            left = self._running[sandbox_id] = self._running[sandbox_id] - 1
            if not left:
                del self._running[sandbox_id]
            self.changed(sandbox_id)

    def changed(self, sandbox_id: str) -> None:
        """Something a hibernation waits on may have changed (an operation ended, a kernel
        turned idle)."""
        event = self._changed.get(sandbox_id)
        if event is not None:
            event.set()

    @contextlib.asynccontextmanager
    async def quiet(
        self,
        sandbox_id: str,
        busy_kernels: Callable[[], list[str]],
        wait: float,
        what: str = "hibernation",
    ) -> AsyncIterator[None]:
        """Hold new operations back and wait, at most ``wait`` seconds, until none runs and
        ``busy_kernels()`` names no context; the block then runs with them still held back.
        Past the wait: :class:`Conflict` ("busy: …", naming ``what`` did not happen), and the
        held operations go on."""
        await self.held_back(sandbox_id)  # one hibernation at a time
        over = self._held[sandbox_id] = asyncio.Event()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        try:
            while (reason := self._busy(sandbox_id, busy_kernels())) is not None:
                if loop.time() >= deadline:
                    raise Conflict(
                        f"sandbox {sandbox_id} is busy: {reason}; no {what} happened "
                        f"(waited {wait:g} s)"
                    )
                log.info("sandbox %s: its %s waits (%s)", sandbox_id, what, reason)
                changed = self._changed[sandbox_id] = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), deadline - loop.time())
            yield
        finally:
            self._changed.pop(sandbox_id, None)
            del self._held[sandbox_id]
            over.set()

    def _busy(self, sandbox_id: str, kernels: list[str]) -> str | None:
        count = self.running(sandbox_id)
        if count:
            return f"{count} operation{'s' if count > 1 else ''} running"
        if kernels:
            return f"the kernel of code context {', '.join(kernels)} is running code"
        return None
