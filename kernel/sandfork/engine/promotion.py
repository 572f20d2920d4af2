"""Promote: a fork child becomes an independent sandbox (what ``explore`` ends with).

PandaStack's meaning: the child loses ``fork_parent_id`` and ``fork_tree_id`` and gets
``promoted_from``; its siblings (the parent's other fork children, or only those of one fork
call when a ``tree_id`` is given) are killed when asked; the parent is killed only when a
caller asks for it by name (``kill_parent``), never by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sandfork.crashpoints import crash_point
from sandfork.engine.db import SandboxRecord
from sandfork.engine.errors import ApiError, BadRequest, NotFound
from sandfork.engine.sandboxes import SandboxService


@dataclass
class Promoted:
    """What a promote did."""

    child: SandboxRecord
    siblings: list[str] = field(default_factory=list)  # killed
    parent: list[str] = field(default_factory=list)  # killed: the parent, if asked and done
    failures: dict[str, str] = field(default_factory=dict)  # id -> why it could not be killed


async def promote(
    sandboxes: SandboxService,
    sandbox_id: str,
    *,
    kill_siblings: bool,
    tree_id: str | None = None,
    kill_parent: bool = False,
) -> Promoted:
    """Make fork child ``sandbox_id`` independent; kill what was asked for."""
    child = sandboxes.get(sandbox_id)
    parent_id = child.fork_parent_id
    if parent_id is None:
        raise BadRequest(f"sandbox {sandbox_id} is not a fork child: nothing to promote")
    sandboxes.live(sandbox_id)  # promoting a dead child would leave nothing running
    result = Promoted(child)

    async def kill(victim: str, killed: list[str]) -> None:
        try:
            await sandboxes.kill(victim)
            killed.append(victim)
        except NotFound:
            pass  # already gone
        except ApiError as e:
            result.failures[victim] = e.message

    if kill_siblings:
        for sibling in sandboxes.all():
            if (
                sibling.fork_parent_id == parent_id
                and sibling.id != sandbox_id
                and (tree_id is None or sibling.fork_tree_id == tree_id)
            ):
                await kill(sibling.id, result.siblings)
    if kill_parent:
        await kill(parent_id, result.parent)
    crash_point("promote.killed")
    child.fork_parent_id, child.fork_tree_id, child.promoted_from = None, None, parent_id
    sandboxes.save(child)
    return result
