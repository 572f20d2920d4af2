"""``POST /v1/sandboxes/{id}/hibernate`` and ``/wake`` (PandaStack's shapes).

Hibernating captures the sandbox and stops its VM, freeing its memory; the sandbox keeps its
id and shows ``"status": "hibernated"``. Any later request to it (exec, run_code, files, a
kernel channel, a snapshot) wakes it from the capture first; ``/wake`` does so without one.
Both answer with the sandbox and are idempotent.
"""

from __future__ import annotations

from sandfork.engine.handlers.base import ApiHandler


class HibernateHandler(ApiHandler):
    """``POST``: capture the sandbox and stop its VM."""

    async def post(self, sandbox_id: str) -> None:
        record = await self.snapshots.hibernate(sandbox_id)
        self.write_json(record.to_api())


class WakeHandler(ApiHandler):
    """``POST``: resume a hibernated sandbox now (a running one is left as it is)."""

    async def post(self, sandbox_id: str) -> None:
        record = await self.snapshots.wake(sandbox_id)
        self.write_json(record.to_api())
