"""``POST /v1/sandboxes/{id}/promote``: a fork child takes over from its parent (what the
SDKs' ``explore``/``promote`` need).

The parent (unless ``kill_parent`` is false) and, with ``kill_siblings``, the parent's other
fork children are killed; the child loses its ``fork_parent_id`` and gets ``promoted_from``.
"""

from __future__ import annotations

from sandfork.engine.handlers.base import ApiHandler
from sandfork.engine.handlers.validate import field


class PromoteHandler(ApiHandler):
    """``POST {"kill_parent"?: true, "kill_siblings"?: false}``: promote a fork child."""

    async def post(self, sandbox_id: str) -> None:
        body = self.json_body()
        child, killed = await self.snapshots.promote(
            sandbox_id,
            kill_parent=field(body, "kill_parent", bool, True),
            kill_siblings=field(body, "kill_siblings", bool, False),
        )
        self.write_json({"sandbox": child.to_api(), "killed": killed})
