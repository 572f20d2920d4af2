"""Which engine a relayed request goes to: the owner of the sandbox or snapshot its path
names, a place with room for an import, or any engine that answers (templates, and paths no
route has, so that the answer is an engine's own, its 404 included); and which engines a
restore of a snapshot is tried on, in turn (a client's, and a fork's copy started elsewhere).

The paths are matched with patterns made from :mod:`sandfork.protocol.routes` and the ids'
forms; nothing here spells a route.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sandfork.gateway.base import engine_down, no_engine
from sandfork.gateway.fleet import Engine, Fleet
from sandfork.protocol import SANDBOX_ID, SNAPSHOT_ID, LimitExceeded, routes

_SANDBOX_PATH = re.compile(rf"{routes.API}{routes.SANDBOXES}/({SANDBOX_ID})(?:/(.*))?")
_SNAPSHOT_PATH = re.compile(rf"{routes.API}{routes.SNAPSHOTS}/({SNAPSHOT_ID})(?:/.*)?")
_IMPORT_PATH = routes.API + routes.SNAPSHOT_IMPORT
_FULL, _LACKS = 429, 404  # the answers after which a restore is tried on the next engine

Answer = TypeVar("Answer")

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


async def place_restore(
    fleet: Fleet,
    snapshot_id: str,
    attempt: Callable[[Engine], Awaitable[Answer]],
    status: Callable[[Answer], int],
) -> tuple[Engine, Answer] | None:
    """Restore the snapshot on the engines of :meth:`Fleet.restore_places` in turn, each
    asked by ``attempt`` (``status``: the HTTP status of its answer): the next is asked when
    one is full (429) or lacks the snapshot (404; then only those known to hold it, as the
    snapshot store gives the others none either). The engine that answered last and its
    answer (one that restored it now holds the snapshot and runs one more sandbox); ``None``
    when no engine has room; a 409 naming the engine when the snapshot is not found and
    only a silent engine holds it."""
    owner = await fleet.find(
        routes.snapshot(snapshot_id), lambda: fleet.snapshot_owner(snapshot_id)
    )
    holders = {e.name for e in fleet.snapshot_holders(snapshot_id)}
    last: tuple[Engine, Answer] | None = None
    code = 0
    for place in fleet.restore_places(snapshot_id):
        if code == _LACKS and place.name not in holders:
            continue  # the store lacks it: another engine without it would say the same
        last = place, await attempt(place)
        code = status(last[1])
        if code not in (_FULL, _LACKS):
            break
    if last is None:
        return None
    if code == _LACKS and owner is not None:
        reason = fleet.down_reason(owner)
        if reason is not None:  # only a silent engine has it
            raise engine_down(f"snapshot {snapshot_id}", owner, reason)
    if code < 300:
        fleet.restored(last[0], snapshot_id)
    return last
