"""``POST /v1/sandboxes/{id}/hibernate``, ``/wake`` and ``/pause`` (PandaStack's shapes).

Hibernating captures the sandbox and stops its VM, freeing its memory; the sandbox keeps its
id and shows ``"status": "hibernated"``. Any later request to it (exec, run_code, files, a
kernel channel, a snapshot) wakes it from the capture first; ``/wake`` does so without one.
Both answer with the sandbox and are idempotent. ``/pause`` freezes the sandbox in place, its
memory kept; ``/resume`` of a paused one lets it go on (:mod:`sandfork.engine.lifecycle`).
"""

from __future__ import annotations

from sandfork.engine.handlers.base import ApiHandler


class HibernateHandler(ApiHandler):
    """``POST``: capture the sandbox and stop its VM."""

    async def post(self, sandbox_id: str) -> None:
        record = await self.sandboxes.hibernate(sandbox_id)
        self.write_json(record.to_api())


class WakeHandler(ApiHandler):
    """``POST``: resume a hibernated sandbox now (a running one is left as it is)."""

    async def post(self, sandbox_id: str) -> None:
        record = await self.sandboxes.wake(sandbox_id)
        self.write_json(record.to_api())


class PauseHandler(ApiHandler):
    """``POST``: freeze the sandbox where it is, its memory kept (idempotent)."""

    async def post(self, sandbox_id: str) -> None:
        record = await self.sandboxes.pause(sandbox_id, self.config.hibernate_wait)
        self.write_json(record.to_api())
