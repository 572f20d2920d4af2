/**
 * `Snapshot`: list, inspect, rename and delete snapshots; read and compare what is inside
 * them (a snapshot's variable inventory, and two compared).
 */

import { type ClientOption, type Http, httpOf } from "./http.js";
import {
  INVENTORY_ATTACHMENT,
  type Inventory,
  type InventoryDiff,
  diffInventories,
  inventoryFromApi,
  missingInventory,
} from "./inventory.js";
import type { WireFields, WireObject } from "./models.js";
import * as routes from "./routes.js";
import type { SnapshotInfo } from "./wire.js";

/** A snapshot, as the functions that read one take it: its id, a `Snapshot`, or its JSON. */
export type SnapshotRef =
  | string
  | { readonly id: string; readonly attachments?: readonly string[] };

/** Options of `Snapshot.list`. */
export interface ListSnapshotsOptions extends ClientOption {
  /** Only the snapshots of this sandbox. */
  sandboxId?: string;
  /**
   * Only the snapshots whose metadata has every one of these keys with this value
   * (`GET /v1/snapshots?metadata.<key>=<value>`, one parameter per key).
   */
  metadata?: Record<string, string>;
}

/** The camelCase fields a `Snapshot` shows, checked against the wire's `SnapshotInfo`. */
type SnapshotFields = WireFields<
  SnapshotInfo,
  | "id"
  | "name"
  | "createdAt"
  | "sandboxId"
  | "template"
  | "parentId"
  | "sizeBytes"
  | "pausedMs"
  | "memoryMb"
  | "cpu"
  | "contexts"
  | "metadata"
  | "attachments",
  { createdAt: Date }
>;

/**
 * An immutable capture of a sandbox; restore it with `Sandbox.create({fromSnapshot: id})`.
 *
 * `info` is the engine's JSON object of it, every field it sent (those this SDK does not
 * know yet too); the camelCase fields read from it.
 */
export class Snapshot implements SnapshotFields {
  private data: WireObject<SnapshotInfo>;

  constructor(
    readonly client: Http,
    info: SnapshotInfo,
  ) {
    this.data = { ...info } as WireObject<SnapshotInfo>;
  }

  /** A `Snapshot` from the engine's JSON. */
  static fromApi(client: Http, data: unknown): Snapshot {
    return new Snapshot(client, data as SnapshotInfo);
  }

  /** Snapshots, newest first: those of `sandboxId`, with `metadata`, if given. */
  static async list(options: ListSnapshotsOptions = {}): Promise<Snapshot[]> {
    const client = httpOf(options);
    const query: Record<string, string> = {};
    if (options.sandboxId !== undefined) query.sandbox_id = options.sandboxId;
    const wanted = Object.entries(options.metadata ?? {});
    for (const [key, value] of wanted) query[`metadata.${key}`] = value;
    const data = await client.request<{ snapshots: SnapshotInfo[] }>("GET", routes.SNAPSHOTS, {
      query,
    });
    return (
      data.snapshots
        // The engine filters; so does the SDK, for an engine from before the filter.
        .filter((s) => wanted.every(([key, value]) => s.metadata?.[key] === value))
        .map((s) => Snapshot.fromApi(client, s))
    );
  }

  /** The snapshot with this id. */
  static async get(snapshotId: string, options: ClientOption = {}): Promise<Snapshot> {
    const client = httpOf(options);
    return Snapshot.fromApi(client, await client.request("GET", routes.snapshot(snapshotId)));
  }

  /** The engine's JSON object of the snapshot: every field it sent, known or not. */
  get info(): WireObject<SnapshotInfo> {
    return this.data;
  }

  get id(): string {
    return this.data.id;
  }

  get name(): string | null {
    return this.data.name ?? null;
  }

  get createdAt(): Date {
    return new Date(this.data.created_at);
  }

  get sandboxId(): string {
    return this.data.sandbox_id;
  }

  get template(): string {
    return this.data.template;
  }

  get parentId(): string | null {
    return this.data.parent_id ?? null;
  }

  get sizeBytes(): number {
    return Number(this.data.size_bytes ?? 0);
  }

  /** How long the sandbox was paused while it was captured. */
  get pausedMs(): number {
    return Number(this.data.paused_ms ?? 0);
  }

  /** The sandbox's memory when captured (null: not recorded). */
  get memoryMb(): number | null {
    return this.data.memory_mb ?? null;
  }

  /** The sandbox's vCPUs when captured (null: not recorded). */
  get cpu(): number | null {
    return this.data.cpu ?? null;
  }

  /** The code contexts captured with it. */
  get contexts(): string[] {
    return [...(this.data.contexts ?? [])];
  }

  get metadata(): Record<string, string> {
    return { ...(this.data.metadata ?? {}) };
  }

  /** Names of the files stored with the snapshot (`inventory.json`: its variable inventory). */
  get attachments(): string[] {
    return [...(this.data.attachments ?? [])];
  }

  /** Give the snapshot a new name. */
  async rename(name: string): Promise<void> {
    const data = await this.client.request<SnapshotInfo>("PATCH", routes.snapshot(this.id), {
      json: { name },
    });
    this.data = { ...this.data, ...data, name };
  }

  /**
   * The variables of the sandbox's default kernel when the snapshot was taken; unavailable,
   * with the reason, when the kernel could not tell or the snapshot predates inventories.
   */
  inventory(): Promise<Inventory> {
    return snapshotInventory(this, { client: this.client });
  }

  /** What changed in the default kernel's variables from this snapshot to `other`. */
  diff(other: SnapshotRef): Promise<InventoryDiff> {
    return inventoryDiff(this, other, { client: this.client });
  }

  /** Delete the snapshot; sandboxes and snapshots made from it keep working. */
  async delete(): Promise<void> {
    await this.client.request("DELETE", routes.snapshot(this.id));
  }

  /** The engine's JSON object (`JSON.stringify(snapshot)`). */
  toJSON(): WireObject<SnapshotInfo> {
    return this.data;
  }
}

/**
 * The variables of the sandbox's default kernel when the snapshot (its id, a `Snapshot`
 * such as `sandbox.snapshot()` resolves to, or its JSON) was taken; `status:
 * "unavailable"`, with the reason, when the kernel could not tell or the snapshot predates
 * inventories.
 */
export async function snapshotInventory(
  snapshot: SnapshotRef,
  options: ClientOption = {},
): Promise<Inventory> {
  const client = httpOf(options);
  const info = typeof snapshot === "string" ? await Snapshot.get(snapshot, { client }) : snapshot;
  if (!(info.attachments ?? []).includes(INVENTORY_ATTACHMENT)) return missingInventory();
  const path = routes.attachment(info.id, INVENTORY_ATTACHMENT);
  return inventoryFromApi(await client.request<Record<string, any>>("GET", path));
}

/**
 * What changed in the default kernel's variables from snapshot `from` to snapshot `to` (ids,
 * `Snapshot`s or their JSON): variables added, removed, changed (type, shape, length, size
 * or fingerprint) and unchanged. See `diffInventories`.
 */
export async function inventoryDiff(
  from: SnapshotRef,
  to: SnapshotRef,
  options: ClientOption = {},
): Promise<InventoryDiff> {
  const before = await snapshotInventory(from, options);
  const after = await snapshotInventory(to, options);
  return diffInventories(before, after, idOf(from), idOf(to));
}

function idOf(snapshot: SnapshotRef): string {
  return typeof snapshot === "string" ? snapshot : snapshot.id;
}
