"""``POST /v1/sandboxes/{id}/promote``: a fork child becomes independent (the end of the
SDKs' ``explore``; :mod:`sandfork.engine.promotion`).

Our SDKs send ``kill_parent``/``kill_siblings``; PandaStack's send ``cleanup_siblings`` and
``tree_id``. Both are answered with both shapes.
"""

from __future__ import annotations

from sandfork.engine.handlers.base import ApiHandler
from sandfork.engine.handlers.validate import field
from sandfork.engine.promotion import promote


class PromoteHandler(ApiHandler):
    """``POST {"kill_siblings"?|"cleanup_siblings"?: false, "tree_id"?, "kill_parent"?: false}``."""

    async def post(self, sandbox_id: str) -> None:
        body = self.json_body()
        cleanup = field(body, "cleanup_siblings", bool, False)
        tree_id = field(body, "tree_id", str)
        done = await promote(
            self.sandboxes,
            sandbox_id,
            kill_siblings=field(body, "kill_siblings", bool, False) or cleanup,
            tree_id=tree_id,
            kill_parent=field(body, "kill_parent", bool, False),
        )
        self.write_json(
            {
                "sandbox": done.child.to_api(),
                "killed": done.siblings + done.parent,
                "winner": done.child.id,
                "tree_id": tree_id,
                "deleted": done.siblings,
                "failures": done.failures,
            }
        )
