"""``Snapshot``: list, inspect, rename and delete snapshots; read and compare what is inside.

As in :mod:`sandfork.sdk.sandbox`, every call is written once, asynchronously, and its
blocking twin made from it.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from pathlib import Path

from sandfork.client import blocking
from sandfork.protocol import INVENTORY_ATTACHMENT, SnapshotInfo, routes
from sandfork.sdk.client import Client, default_client
from sandfork.sdk.inventory import Inventory, InventoryDiff, diff


def snapshot_id(snapshot: str | SnapshotInfo) -> str:
    """The id of a snapshot given as itself or as its id."""
    return snapshot.id if isinstance(snapshot, SnapshotInfo) else str(snapshot)


@dataclass
class Snapshot(SnapshotInfo):
    """An immutable capture of a sandbox; restore it with
    ``Sandbox.create(from_snapshot=snapshot)``.

    Its fields are the API's (:class:`sandfork.protocol.SnapshotInfo`).
    """

    client: Client = field(default_factory=default_client, repr=False, compare=False)

    @classmethod
    async def async_list(
        cls,
        sandbox_id: str | None = None,
        client: Client | None = None,
        *,
        metadata: dict[str, str] | None = None,
    ) -> builtins.list[Snapshot]:
        """Snapshots, newest first; only those of ``sandbox_id`` if given, and only those
        whose metadata has every key and value of ``metadata``."""
        client = client or default_client()
        params = {f"metadata.{key}": value for key, value in (metadata or {}).items()}
        if sandbox_id:
            params["sandbox_id"] = sandbox_id
        data = await client.aio.request("GET", routes.SNAPSHOTS, params=params or None)
        return [cls.from_api(s, client=client) for s in data["snapshots"]]

    @classmethod
    async def async_get(
        cls, snapshot: str | SnapshotInfo, client: Client | None = None
    ) -> Snapshot:
        """The snapshot with this id."""
        client = client or default_client()
        data = await client.aio.request("GET", routes.snapshot(snapshot_id(snapshot)))
        return cls.from_api(data, client=client)

    async def async_rename(self, name: str) -> None:
        """Give the snapshot a new name."""
        await self.client.aio.request("PATCH", routes.snapshot(self.id), json={"name": name})
        self.name = name

    async def async_attachment(self, name: str) -> bytes:
        """The attachment ``name`` stored with the snapshot (``NotFoundError`` if none)."""
        return (await self.client.aio.fetch("GET", routes.attachment(self.id, name))).content

    async def async_inventory(self) -> Inventory:
        """The variables of the sandbox's default kernel when the snapshot was taken (see
        :mod:`sandfork.sdk.inventory`); unavailable, with the reason, when the kernel could
        not tell or the snapshot predates inventories."""
        if INVENTORY_ATTACHMENT not in self.attachments:
            return Inventory.missing()
        path = routes.attachment(self.id, INVENTORY_ATTACHMENT)
        return Inventory.from_api(await self.client.aio.request("GET", path))

    async def async_diff(self, other: Snapshot) -> InventoryDiff:
        """What changed in the default kernel's variables from this snapshot to ``other``:
        variables added, removed, changed (type, shape, length, size or fingerprint) and
        unchanged."""
        mine, theirs = await self.async_inventory(), await other.async_inventory()
        return diff(mine, theirs, self.id, other.id)

    async def async_export(self, path: str | Path) -> None:
        """Write the snapshot to one file that ``Snapshot.import_file`` takes elsewhere."""
        with Path(path).open("wb") as f:
            await self.client.aio.fetch(
                "GET", routes.snapshot(self.id, "export"), streaming_callback=f.write
            )

    @classmethod
    async def async_import_file(cls, path: str | Path, client: Client | None = None) -> Snapshot:
        """Add the snapshot exported to ``path`` (under a new id); a damaged or hostile file
        is refused."""
        client = client or default_client()
        with Path(path).open("rb") as f:
            data = await client.aio.request("POST", routes.SNAPSHOT_IMPORT, data=f)
        return cls.from_api(data, client=client)

    async def async_delete(self) -> None:
        """Delete the snapshot; sandboxes and snapshots made from it keep working."""
        await self.client.aio.request("DELETE", routes.snapshot(self.id))

    list = classmethod(blocking(async_list))
    get = classmethod(blocking(async_get))
    import_file = classmethod(blocking(async_import_file))
    rename = blocking(async_rename)
    attachment = blocking(async_attachment)
    inventory = blocking(async_inventory)
    diff = blocking(async_diff)
    export = blocking(async_export)
    delete = blocking(async_delete)
