/** Reading what is inside snapshots: a snapshot's variable inventory, and two compared. */

import {
  INVENTORY_ATTACHMENT,
  type Inventory,
  type InventoryDiff,
  diffInventories,
  inventoryFromApi,
  missingInventory,
} from "./inventory.js";
import { type SnapshotInfo, snapshotInfo } from "./models.js";
import { type ClientOption, httpOf } from "./sandbox.js";

/**
 * The variables of the sandbox's default kernel when the snapshot (its id, or the
 * `SnapshotInfo` that `sandbox.snapshot()` resolves to) was taken; `status: "unavailable"`,
 * with the reason, when the kernel could not tell or the snapshot predates inventories.
 */
export async function snapshotInventory(
  snapshot: string | SnapshotInfo,
  options: ClientOption = {},
): Promise<Inventory> {
  const client = httpOf(options);
  const info =
    typeof snapshot === "string"
      ? snapshotInfo(await client.request<Record<string, any>>("GET", `/snapshots/${snapshot}`))
      : snapshot;
  if (!(info.attachments ?? []).includes(INVENTORY_ATTACHMENT)) return missingInventory();
  const path = `/snapshots/${info.id}/attachments/${INVENTORY_ATTACHMENT}`;
  return inventoryFromApi(await client.request<Record<string, any>>("GET", path));
}

/**
 * What changed in the default kernel's variables from snapshot `from` to snapshot `to` (ids
 * or `SnapshotInfo`s): variables added, removed, changed (type, shape, length, size or
 * fingerprint) and unchanged. See `diffInventories`.
 */
export async function inventoryDiff(
  from: string | SnapshotInfo,
  to: string | SnapshotInfo,
  options: ClientOption = {},
): Promise<InventoryDiff> {
  const before = await snapshotInventory(from, options);
  const after = await snapshotInventory(to, options);
  return diffInventories(before, after, idOf(from), idOf(to));
}

function idOf(snapshot: string | SnapshotInfo): string {
  return typeof snapshot === "string" ? snapshot : snapshot.id;
}
