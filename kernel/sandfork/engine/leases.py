"""Leases: a sandbox whose holder stops renewing it is killed.

A sandbox started for a Jupyter kernel has a lease of ``lease_seconds`` (stored with it); the
kernel renews it every third of that while it runs. When no renewal came for ``lease_seconds``,
the manager's watch loop kills the sandbox: a kernel that ended without shutting down (SIGKILL,
a crash, JupyterLab gone) leaves nothing running for long.

Deadlines live in memory only. An engine that (re)starts gives every leased sandbox a fresh,
full period, so an engine restart never kills a sandbox whose holder is still there; nor does
a stall of the engine itself: time the watch loop could not run is added to every deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable

MIN_SECONDS = 5.0
MAX_SECONDS = 3600.0
MAX_TTL_SECONDS = 30 * 86400.0  # a time to live (PandaStack's lifecycle) is a lease too


class Leases:
    """Deadlines of the leased sandboxes of one engine (monotonic clock)."""

    def __init__(self, tick: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.tick = tick  # how often :meth:`expired` is called
        self._clock = clock
        self._deadlines: dict[str, float] = {}
        self._last_check: float | None = None

    def hold(self, sandbox_id: str, seconds: float) -> float:
        """Start or renew the lease of ``sandbox_id`` for ``seconds``; returns its deadline."""
        deadline = self._clock() + seconds
        self._deadlines[sandbox_id] = deadline
        return deadline

    def __len__(self) -> int:
        """The number of leases held."""
        return len(self._deadlines)

    def drop(self, sandbox_id: str) -> None:
        """Forget the lease of ``sandbox_id`` (killed, or released by its holder)."""
        self._deadlines.pop(sandbox_id, None)

    def remaining(self, sandbox_id: str) -> float | None:
        """Seconds left on the lease of ``sandbox_id``, or None if it has none."""
        deadline = self._deadlines.get(sandbox_id)
        return None if deadline is None else max(0.0, deadline - self._clock())

    def expired(self) -> list[str]:
        """The sandboxes whose lease ran out (dropped from the leases: kill them).

        Called every ``tick`` seconds; a call that comes much later than that means the engine
        itself was not running (suspended, stalled), and renewals may be waiting unread: that
        time is not held against the holders.
        """
        now = self._clock()
        if self._last_check is not None:
            stalled = now - self._last_check - 2 * self.tick
            if stalled > 0:
                for sandbox_id in self._deadlines:
                    self._deadlines[sandbox_id] += stalled
        self._last_check = now
        gone = [sid for sid, deadline in self._deadlines.items() if deadline <= now]
        for sandbox_id in gone:
            del self._deadlines[sandbox_id]
        return gone
