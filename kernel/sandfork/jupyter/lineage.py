"""What the side panel draws, from the engine's listings: snapshots (checkpoints among them)
and the sandboxes they relate to, each sandbox with the notebook and kernel of this server
attached to it; and what is inside a snapshot (its variable inventory) and between two."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sandfork.protocol import INVENTORY_ATTACHMENT as INVENTORY
from sandfork.protocol import SandboxInfo, SnapshotInfo
from sandfork.proxy_kernel.checkpoints import CELL_CHECKPOINT, CELL_ID, LINEAGE, PREVIOUS
from sandfork.sdk.inventory import Inventory, diff

NOTEBOOK = "notebook.ipynb"  # the attachment holding the notebook document of a snapshot


def listing(
    snapshots: Sequence[SnapshotInfo],
    sandboxes: Sequence[SandboxInfo],
    kernels: dict[str, str],
    sessions: list[dict[str, Any]],
) -> dict[str, Any]:
    """The panel's listing: every snapshot, and the sandboxes that belong in the graph (those
    snapshotted, restored, forked or running a kernel of this server, and a branch's parents).
    ``kernels`` maps sandbox ids to this server's kernels attached to them."""
    known = {s.id: s for s in sandboxes}
    paths = {s["kernel"]["id"]: s["path"] for s in sessions if s.get("kernel")}
    wanted = {s.sandbox_id for s in snapshots} | set(kernels)
    wanted |= {sid for sid, s in known.items() if s.from_snapshot or s.fork_parent_id}
    pending = list(wanted)
    while pending:  # a branch's parent belongs in the graph too
        found = known.get(pending.pop())
        parent = found.fork_parent_id if found else None
        if parent and parent not in wanted:
            wanted.add(parent)
            pending.append(parent)
    nodes = []
    for sid in sorted(wanted):
        kernel_id = kernels.get(sid)
        s = known.get(sid)
        if s is None:  # gone: only its id is known
            node = {"status": "gone", "created_at": None, "from_snapshot": None}
            node |= {"forked_from": None, "notebook_path": paths.get(kernel_id or "")}
        else:
            notebook = paths.get(kernel_id or "") or s.metadata.get("notebook_path")
            node = {
                "status": s.status,
                "created_at": s.created_at,
                "from_snapshot": s.from_snapshot,
            }
            node |= {"forked_from": s.fork_parent_id, "notebook_path": notebook}
        nodes.append({"id": sid, **node, "kernel_id": kernel_id})
    return {"snapshots": [snapshot_entry(s) for s in snapshots], "sandboxes": nodes}


def snapshot_entry(snap: SnapshotInfo) -> dict[str, Any]:
    """A snapshot as the front end shows it: the API's fields it needs, the notebook, and
    what a per-cell checkpoint says of its cell."""
    checkpoint = CELL_CHECKPOINT.items() <= snap.metadata.items()
    count = snap.metadata.get("execution_count", "")
    return {
        "id": snap.id,
        "name": snap.name,
        "created_at": snap.created_at,
        "size_bytes": snap.size_bytes,
        "paused_ms": snap.paused_ms,
        "memory_mb": snap.memory_mb,
        "sandbox_id": snap.sandbox_id,
        "parent_id": snap.parent_id,
        "notebook_path": snap.metadata.get("notebook_path"),
        "kernel_id": snap.metadata.get("kernel_id"),
        "has_notebook": NOTEBOOK in snap.attachments,
        "kind": "checkpoint" if checkpoint else "snapshot",
        "cell_id": snap.metadata.get(CELL_ID) or None,
        "execution_count": int(count) if count.isdigit() else None,
        "lineage": snap.metadata.get(LINEAGE),
        "previous": snap.metadata.get(PREVIOUS) or None,
        "has_inventory": INVENTORY in snap.attachments,
    }


def inventory_entry(inventory: Inventory) -> dict[str, Any]:
    """An inventory as the API answers it."""
    return inventory.to_api()


def diff_entry(before: Inventory, after: Inventory, from_id: str, to_id: str) -> dict[str, Any]:
    """The difference of two inventories as the API answers it."""
    return diff(before, after, from_id, to_id).to_api()
