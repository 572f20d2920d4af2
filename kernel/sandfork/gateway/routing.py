"""Which engine a relayed request goes to: the owner of the sandbox or snapshot its path
names, a place with room for an import, or any engine that answers (templates, and paths no
route has, so that the answer is an engine's own, its 404 included).

The paths are matched with patterns made from :mod:`sandfork.protocol.routes` and the ids'
forms; nothing here spells a route.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sandfork.gateway.base import engine_down, no_engine
from sandfork.gateway.fleet import Engine, Fleet
from sandfork.protocol import SANDBOX_ID, SNAPSHOT_ID, LimitExceeded, routes

_SANDBOX_PATH = re.compile(rf"{routes.API}{routes.SANDBOXES}/({SANDBOX_ID})(?:/(.*))?")
_SNAPSHOT_PATH = re.compile(rf"{routes.API}{routes.SNAPSHOTS}/({SNAPSHOT_ID})(?:/.*)?")
_IMPORT_PATH = routes.API + routes.SNAPSHOT_IMPORT

# Answers that describe sandboxes or snapshots (never those carrying guest output): learned.
_LEARNED_ACTIONS = frozenset(
    {"", "fork", "fork-tree", "resume", "snapshots", "checkpoints", "promote"}
    | {"hibernate", "wake", "pause"}
)


@dataclass
class Target:
    """Where one request goes: ``engine``, or ``answer`` given by the gateway itself (the
    record of a sandbox whose engine is silent)."""

    engine: Engine | None = None
    answer: dict[str, Any] | None = None
    learn: bool = False  # its JSON answer names sandboxes or snapshots
    killed: str | None = None  # a kill of this sandbox


def sandbox_in(path: str) -> str | None:
    """The sandbox a path is under, if any."""
    match = _SANDBOX_PATH.fullmatch(path)
    return match.group(1) if match else None


async def target(fleet: Fleet, method: str, path: str) -> Target:
    """Where ``method path`` goes; a 409 naming the engine when it is one that does not
    answer, a 502 when none answers, a 429 when an import has nowhere to go."""
    if match := _SANDBOX_PATH.fullmatch(path):
        sandbox_id, action = match.group(1), match.group(2) or ""
        engine = await fleet.find(
            routes.sandbox(sandbox_id), lambda: fleet.sandbox_owner(sandbox_id)
        )
        if engine is not None and (reason := fleet.down_reason(engine)) is not None:
            if method == "GET" and not action:
                return Target(answer=fleet.dead_record(sandbox_id, engine, reason))
            raise engine_down(f"sandbox {sandbox_id}", engine, reason)
        learn = action in _LEARNED_ACTIONS
        killed = sandbox_id if method == "DELETE" and not action else None
        return Target(engine or _any(fleet), learn=learn, killed=killed)
    if match := _SNAPSHOT_PATH.fullmatch(path):
        snapshot_id = match.group(1)
        engine = await fleet.find(
            routes.snapshot(snapshot_id), lambda: fleet.snapshot_owner(snapshot_id)
        )
        if engine is not None and (reason := fleet.down_reason(engine)) is not None:
            raise engine_down(f"snapshot {snapshot_id}", engine, reason)
        return Target(engine or _any(fleet), learn=True)
    if path == _IMPORT_PATH:
        places = fleet.candidates(0)
        if not places:
            raise LimitExceeded("no engine of this gateway has room for a sandbox or snapshot")
        return Target(places[0], learn=True)
    return Target(_any(fleet))


def _any(fleet: Fleet) -> Engine:
    alive = fleet.alive()
    if not alive:
        raise no_engine()
    return alive[0]
