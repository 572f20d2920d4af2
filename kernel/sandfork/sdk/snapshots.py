"""``Snapshot``: list, inspect, rename and delete snapshots; read and compare what is inside."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfork.protocol import INVENTORY_ATTACHMENT, SnapshotInfo
from sandfork.sdk.client import Client, default_client
from sandfork.sdk.inventory import Inventory, InventoryDiff, diff


@dataclass
class Snapshot(SnapshotInfo):
    """An immutable capture of a sandbox; restore it with ``Sandbox.create(from_snapshot=id)``.

    Its fields are the API's (:class:`sandfork.protocol.SnapshotInfo`).
    """

    client: Client = field(default_factory=default_client, repr=False, compare=False)

    @classmethod
    def _from_api(cls, data: dict[str, Any], client: Client) -> Snapshot:
        return cls(**cls.api_fields(data), client=client)

    @classmethod
    def list(cls, sandbox_id: str | None = None, client: Client | None = None) -> list[Snapshot]:
        """Snapshots, newest first; only those of ``sandbox_id`` if given."""
        client = client or default_client()
        params = {"sandbox_id": sandbox_id} if sandbox_id else None
        data = client.request("GET", "/snapshots", params=params)
        return [cls._from_api(s, client) for s in data["snapshots"]]

    @classmethod
    def get(cls, snapshot_id: str, client: Client | None = None) -> Snapshot:
        """The snapshot with this id."""
        client = client or default_client()
        return cls._from_api(client.request("GET", f"/snapshots/{snapshot_id}"), client)

    def rename(self, name: str) -> None:
        """Give the snapshot a new name."""
        self.client.request("PATCH", f"/snapshots/{self.id}", json={"name": name})
        self.name = name

    def inventory(self) -> Inventory:
        """The variables of the sandbox's default kernel when the snapshot was taken (see
        :mod:`sandfork.sdk.inventory`); unavailable, with the reason, when the kernel could
        not tell or the snapshot predates inventories."""
        if INVENTORY_ATTACHMENT not in self.attachments:
            return Inventory.missing()
        path = f"/snapshots/{self.id}/attachments/{INVENTORY_ATTACHMENT}"
        return Inventory.from_api(self.client.request("GET", path))

    def diff(self, other: Snapshot) -> InventoryDiff:
        """What changed in the default kernel's variables from this snapshot to ``other``:
        variables added, removed, changed (type, shape, length, size or fingerprint) and
        unchanged."""
        return diff(self.inventory(), other.inventory(), self.id, other.id)

    def export(self, path: str | Path) -> None:
        """Write the snapshot to one file that ``Snapshot.import_file`` takes elsewhere."""
        self.client.download(f"/snapshots/{self.id}/export", path)

    @classmethod
    def import_file(cls, path: str | Path, client: Client | None = None) -> Snapshot:
        """Add the snapshot exported to ``path`` (under a new id); a damaged or hostile file
        is refused."""
        client = client or default_client()
        with Path(path).open("rb") as f:
            data = client.request("POST", "/snapshots/import", data=f)
        return cls._from_api(data, client)

    def delete(self) -> None:
        """Delete the snapshot; sandboxes and snapshots made from it keep working."""
        self.client.request("DELETE", f"/snapshots/{self.id}")
