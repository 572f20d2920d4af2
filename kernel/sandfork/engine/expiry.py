"""What a sandbox's time to live running out does: kill it, or, when its lifecycle says
``"on_expiry": "hibernate"``, hibernate it (its memory and disk kept, woken by its next use).

A hibernation that fails leaves the sandbox running, its lease held again for its period (the
next expiry tries again): the user asked for its state to be kept, so it is never killed
instead.
"""

from __future__ import annotations

import logging

from sandfork.engine.errors import ApiError
from sandfork.engine.sandboxes import SandboxService
from sandfork.engine.snapshotting import SnapshotService

log = logging.getLogger(__name__)

ON_EXPIRY = ("kill", "hibernate")
"""What a lease running out may do."""


class Expiry:
    """The engine's policy for expired leases (:attr:`SandboxService.on_expired`)."""

    def __init__(self, sandboxes: SandboxService, snapshots: SnapshotService) -> None:
        self.sandboxes = sandboxes
        self.snapshots = snapshots
        sandboxes.on_expired = self.expired

    async def expired(self, sandbox_id: str) -> None:
        """Kill or hibernate the sandbox whose lease ran out."""
        record = self.sandboxes.get(sandbox_id)
        if record.on_expiry != "hibernate":
            log.warning("sandbox %s: its lease ran out; killing it", sandbox_id)
            await self.sandboxes.kill(sandbox_id)
            return
        log.warning("sandbox %s: its lease ran out; hibernating it", sandbox_id)
        try:
            await self.snapshots.hibernate(sandbox_id)
        except ApiError as e:
            log.warning("sandbox %s: hibernating it failed (%s); it runs on", sandbox_id, e)
            if record.lease_seconds is not None:
                self.sandboxes.lease(sandbox_id, record.lease_seconds)
