"""What the side panel draws, from the engine's listings: snapshots (checkpoints among them)
and the sandboxes they relate to, each sandbox with the notebook and kernel of this server
attached to it; and what is inside a snapshot (its variable inventory) and between two."""

from __future__ import annotations

from typing import Any

from sandfork.protocol import INVENTORY_ATTACHMENT as INVENTORY
from sandfork.protocol import SnapshotInfo
from sandfork.proxy_kernel.checkpoints import CELL_ID, KIND, LINEAGE, PREVIOUS
from sandfork.sdk.inventory import Inventory, diff

NOTEBOOK = "notebook.ipynb"  # the attachment holding the notebook document of a snapshot


def listing(
    snapshots: list[dict[str, Any]],
    sandboxes: list[dict[str, Any]],
    kernels: dict[str, str],
    sessions: list[dict[str, Any]],
) -> dict[str, Any]:
    """The panel's listing: every snapshot, and the sandboxes that belong in the graph (those
    snapshotted, restored, forked or running a kernel of this server, and a branch's parents).
    ``kernels`` maps sandbox ids to this server's kernels attached to them."""
    known = {s["id"]: s for s in sandboxes}
    paths = {s["kernel"]["id"]: s["path"] for s in sessions if s.get("kernel")}
    wanted = {s["sandbox_id"] for s in snapshots} | set(kernels)
    wanted |= {
        sid
        for sid, s in known.items()
        if s.get("from_snapshot") or s["metadata"].get("fork_parent_id")
    }
    pending = list(wanted)
    while pending:  # a branch's parent belongs in the graph too
        parent = known.get(pending.pop(), {}).get("metadata", {}).get("fork_parent_id")
        if parent and parent not in wanted:
            wanted.add(parent)
            pending.append(parent)
    nodes = []
    for sid in sorted(wanted):
        s = known.get(sid, {"id": sid, "status": "gone", "metadata": {}})
        kernel_id = kernels.get(sid)
        nodes.append(
            {
                "id": sid,
                "status": s["status"],
                "created_at": s.get("created_at"),
                "from_snapshot": s.get("from_snapshot"),
                "forked_from": s["metadata"].get("fork_parent_id"),
                "notebook_path": paths.get(kernel_id or "") or s["metadata"].get("notebook_path"),
                "kernel_id": kernel_id,
            }
        )
    return {"snapshots": [snapshot_entry(s) for s in snapshots], "sandboxes": nodes}


def snapshot_entry(data: dict[str, Any]) -> dict[str, Any]:
    """A snapshot as the front end shows it: the API's fields it needs, the notebook, and
    what a per-cell checkpoint says of its cell."""
    snap = SnapshotInfo.from_api(data)
    checkpoint = snap.metadata.get(KIND) == "cell"
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
