/**
 * What a `Sandbox` shows of the engine's record of it: `info`, the JSON object as last seen
 * (every field the engine sent, those this SDK does not know yet too), and the camelCase
 * fields read from it, checked against the wire's `SandboxInfo`.
 */

import type { WireFields, WireObject } from "./models.js";
import type { SandboxInfo, SandboxStatus } from "./wire.js";

/** The camelCase fields a `Sandbox` shows, checked against the wire's `SandboxInfo`. */
export type SandboxFields = WireFields<
  SandboxInfo,
  | "id"
  | "template"
  | "status"
  | "cpu"
  | "memoryMb"
  | "metadata"
  | "createdAt"
  | "persistent"
  | "isolation"
  | "backend"
  | "fromSnapshot"
  | "forkParentId"
  | "promotedFrom"
  | "resumedFrom"
>;

/** The fields of a sandbox, read from the engine's JSON object of it. */
export abstract class SandboxView implements SandboxFields {
  protected data: WireObject<SandboxInfo>;

  protected constructor(info: SandboxInfo) {
    this.data = { ...info } as WireObject<SandboxInfo>;
  }

  /** The engine's JSON object of the sandbox: every field it sent, known or not. */
  get info(): WireObject<SandboxInfo> {
    return this.data;
  }

  get id(): string {
    return this.data.id;
  }

  get template(): string {
    return this.data.template;
  }

  /** As last seen; `refresh()` asks again. */
  get status(): SandboxStatus {
    return this.data.status;
  }

  get cpu(): number {
    return this.data.cpu;
  }

  get memoryMb(): number {
    return this.data.memory_mb;
  }

  get metadata(): Record<string, string> {
    this.data.metadata ??= {};
    return this.data.metadata;
  }

  get createdAt(): string {
    return this.data.created_at ?? "";
  }

  get persistent(): boolean {
    return Boolean(this.data.persistent);
  }

  /** What separates it from the host: "vm" or "container". */
  get isolation(): string {
    return this.data.isolation ?? "";
  }

  /** What runs it (the engine's backend). */
  get backend(): string {
    return this.data.backend ?? "";
  }

  /** The snapshot it was restored from, if any. */
  get fromSnapshot(): string | null {
    return this.data.from_snapshot ?? null;
  }

  /** The sandbox it was forked from, while it is a fork child. */
  get forkParentId(): string | null {
    return this.data.fork_parent_id ?? null;
  }

  /** The sandbox it replaced when promoted. */
  get promotedFrom(): string | null {
    return this.data.promoted_from ?? null;
  }

  /** The sandbox whose checkpoint it resumed. */
  get resumedFrom(): string | null {
    return this.data.resumed_from ?? null;
  }
}
