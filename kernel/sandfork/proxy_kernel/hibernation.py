"""Hibernating an idle kernel's sandbox instead of losing it (as Jupyter's culler would).

A kernel idle for ``after`` seconds (no request, no message from the guest, nothing running)
has its sandbox hibernated: captured, its VM stopped and its memory freed. The kernel process
stays, and the next request (an execute, a completion, an inspection) wakes the sandbox from
the capture before it goes on. ``%hibernate after SECONDS|off`` sets the time per kernel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class IdleTimer:
    """How long the kernel has been idle, and whether its sandbox sleeps."""

    after: float  # seconds idle before the sandbox hibernates; 0: never
    asleep: bool = False
    last: float = field(default_factory=time.monotonic)

    def touch(self) -> None:
        """Something happened: the idle time starts again."""
        self.last = time.monotonic()

    def due(self, busy: bool) -> bool:
        """True if the sandbox should hibernate now."""
        idle = time.monotonic() - self.last
        return self.after > 0 and not self.asleep and not busy and idle >= self.after

    def describe(self) -> str:
        """``%hibernate``'s answer."""
        if self.after <= 0:
            return "hibernation when idle: off"
        return f"hibernation when idle: after {self.after:g} s"


async def watch(
    timer: IdleTimer, busy: Callable[[], bool], hibernate: Callable[[], Awaitable[None]]
) -> None:
    """Hibernate whenever the timer is due, until cancelled."""
    while True:
        await asyncio.sleep(min(5.0, max(0.25, timer.after / 4)) if timer.after > 0 else 5.0)
        if timer.due(busy()):
            await hibernate()
