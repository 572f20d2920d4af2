"""What the engine holds right now, counted: the measure of a leak (``GET /v1/engine/stats``).

A leak is something the engine keeps for each piece of work it did and never lets go of, so
that it grows without bound with the work done. The engine's RSS is a poor measure of that: a
capture commits a buffer for the pages it copies and the allocator returns freed memory when
it likes, so RSS swings by tens of MiB either way from one moment to the next without any
leak. What is counted here moves little, and within bounds of its own: live Python objects
by type (after a full collection), open file descriptors, threads, asyncio tasks, agent
requests waiting for an answer, and the sizes of the engine's own tables of sandboxes, locks,
leases and snapshots. Taken while the engine is idle, after the same work done again, each
count comes back to where it was (a few, such as timers not yet due, move back and forth); a
leak makes one of them grow with every repetition (``tests/test_load.py``).
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from collections import Counter
from typing import Any

from sandfork.engine.sandboxes import SandboxService

AGENT_REQUEST = "sandfork.backends.agent_link._Pending"  # one per request awaiting its reply


def _type_name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


async def engine_stats(sandboxes: SandboxService) -> dict[str, Any]:
    """Counts of what the engine process holds (see the module's docstring).

    ``objects`` maps each type's qualified name to its number of live instances among the
    objects the garbage collector tracks (containers and class instances; not strings or
    numbers, whose holders are counted instead); ``tracked`` has the sizes of the engine's
    tables. Taken once the deletions handed to the background so far are done (each holds
    a few objects while it waits), after a full garbage collection.
    """
    await asyncio.to_thread(sandboxes.store.drain)
    gc.collect()
    census = Counter(_type_name(type(o)) for o in gc.get_objects())
    return {
        "objects": dict(census.most_common()),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "tasks": len(asyncio.all_tasks()),
        "agent_requests": census[AGENT_REQUEST],
        "tracked": {
            **sandboxes.tracked(),
            **sandboxes.store.tracked(),
            **sandboxes.db.changes.tracked(),
        },
    }
