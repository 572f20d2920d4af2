"""The API's paths, under :data:`API` (``/v1``), spelled here once for every client.

Ids are quoted, so no value can reach another route; an action a route does not have is a
:class:`ValueError` at the call, not a 404 from the engine.
"""

from __future__ import annotations

from urllib.parse import quote

API = "/v1"  # every route below is under it
HEALTH = "/health"
CHANGES = "/changes"  # the change feed, long-polled
TEMPLATES = "/templates"
SANDBOXES = "/sandboxes"
SNAPSHOTS = "/snapshots"
SNAPSHOT_IMPORT = "/snapshots/import"
GATEWAY_HEARTBEAT = "/gateway/heartbeat"  # a gateway's: where its engines register
GATEWAY_ENGINES = "/gateway/engines"  # a gateway's: its fleet

SANDBOX_ACTIONS = frozenset(
    {
        "checkpoints",
        "exec",
        "exec/stream",
        "exec/stream/ledgered",
        "fork",
        "fork-tree",
        "fs",
        "fs/dir",
        "fs/stat",
        "hibernate",
        "lease",
        "ledger",
        "lifecycle",
        "logs",
        "pause",
        "ports",
        "promote",
        "repl/sessions",
        "resume",
        "snapshots",
        "wake",
    }
)
CONTEXT_ACTIONS = frozenset({"channels", "interrupt", "restart", "run"})
SNAPSHOT_ACTIONS = frozenset({"export"})


def _segment(value: str) -> str:
    return quote(str(value), safe="")


def _action(path: str, action: str, allowed: frozenset[str]) -> str:
    if not action:
        return path
    if action not in allowed:
        raise ValueError(f"no route {path}/{action}")
    return f"{path}/{action}"


def sandbox(sandbox_id: str, action: str = "") -> str:
    """``/sandboxes/{id}``, or one of its :data:`SANDBOX_ACTIONS`."""
    return _action(f"{SANDBOXES}/{_segment(sandbox_id)}", action, SANDBOX_ACTIONS)


def context(sandbox_id: str, context_id: str, action: str = "") -> str:
    """A code context, ``/sandboxes/{id}/repl/sessions/{context}``, or one of its
    :data:`CONTEXT_ACTIONS`."""
    path = f"{sandbox(sandbox_id, 'repl/sessions')}/{_segment(context_id)}"
    return _action(path, action, CONTEXT_ACTIONS)


def port(sandbox_id: str, number: int | str, rest: str = "/") -> str:
    """Where a server listening on port ``number`` in the sandbox answers (``rest``: the path
    and query under it, as the client asked for them)."""
    return f"{sandbox(sandbox_id, 'ports')}/{_segment(str(number))}{rest}"


def snapshot(snapshot_id: str, action: str = "") -> str:
    """``/snapshots/{id}``, or one of its :data:`SNAPSHOT_ACTIONS`."""
    return _action(f"{SNAPSHOTS}/{_segment(snapshot_id)}", action, SNAPSHOT_ACTIONS)


def attachment(snapshot_id: str, name: str) -> str:
    """One attachment of a snapshot."""
    return f"{snapshot(snapshot_id)}/attachments/{_segment(name)}"
