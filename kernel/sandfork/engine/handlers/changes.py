"""``GET /v1/changes?after=CURSOR&wait=SECONDS``: long-poll the engine's change feed
(:mod:`sandfork.engine.changes`). Answers ``{"cursor": ...}`` as soon as the cursor is not
``after`` (at once without ``after``), or when ``wait`` (default 25, at most 60) runs out."""

from __future__ import annotations

from sandfork.engine.errors import BadRequest
from sandfork.engine.handlers.base import ApiHandler
from sandfork.engine.handlers.validate import check_text

MAX_WAIT_S = 60.0


class ChangesHandler(ApiHandler):
    """``GET``: the feed's cursor, once it moves past ``after``."""

    async def get(self) -> None:
        changes = self.sandboxes.db.changes
        after = self.get_query_argument("after", None)
        wait = self.get_query_argument("wait", "25")
        try:
            seconds = float(wait)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds <= MAX_WAIT_S:
            raise BadRequest(f"query parameter 'wait' must be 0 to {MAX_WAIT_S:g} seconds")
        if after is None:
            self.write_json({"cursor": changes.cursor})
            return
        after = check_text(after, "query parameter 'after'", 64)
        self.write_json({"cursor": await changes.wait(after, seconds)})
