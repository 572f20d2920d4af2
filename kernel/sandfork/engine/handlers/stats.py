"""``GET /v1/engine/stats``: counts of what the engine holds, for finding leaks
(:mod:`sandfork.engine.stats`). Authenticated like every endpoint; nothing in it names a
sandbox's content."""

from __future__ import annotations

from sandfork.engine.handlers.base import ApiHandler
from sandfork.engine.stats import engine_stats


class EngineStatsHandler(ApiHandler):
    """``GET``: live objects by type, fds, threads, tasks, agent requests, table sizes."""

    async def get(self) -> None:
        self.write_json(await engine_stats(self.sandboxes))
