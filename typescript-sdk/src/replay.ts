/** The client side of the execution ledger: call numbering and the replay cache of a resume. */

import { ReplayMismatch, errorFor } from "./errors.js";

/** One call of the ledger, as `POST /resume` hands it over. */
export interface LedgerEntry {
  seq: number;
  kind: string;
  request: Record<string, unknown>;
  result: Record<string, unknown>;
  [key: string]: unknown;
}

/**
 * Numbers a handle's ledgered calls (`exec`, `run_code`) 1, 2, 3… like the engine does, and
 * answers those a resume's cache covers: the recorded result when the call is the same (a
 * call that failed fails again with the recorded error), `ReplayMismatch` when it differs
 * (the entry is used up either way), live past the cache.
 */
export class ReplayCache {
  private calls = 0;
  private readonly entries = new Map<number, LedgerEntry>();

  constructor(entries: LedgerEntry[] = []) {
    for (const entry of entries) this.entries.set(entry.seq, entry);
  }

  /** Calls still to be answered from the cache. */
  get pending(): number {
    return this.entries.size;
  }

  /**
   * Number the next call; return its recorded result (with its `seq`) when the cache has one.
   * `request` is the call's body plus, for `run_code`, its `context`.
   */
  next(kind: string, request: Record<string, unknown>): Record<string, unknown> | undefined {
    this.calls += 1;
    const entry = this.entries.get(this.calls);
    if (entry === undefined) return undefined;
    this.entries.delete(this.calls);
    if (entry.kind !== kind || !sameJson(entry.request, request)) {
      throw new ReplayMismatch(
        this.calls,
        { kind: entry.kind, ...entry.request },
        { kind, ...request },
      );
    }
    const failed = entry.result.failed as
      | { status: number; error: string; kind?: string }
      | undefined;
    if (failed) throw errorFor(failed.status, failed.error, failed.kind); // it fails the same way
    return { ...entry.result, seq: entry.seq };
  }
}

/** Equality of two JSON values, object keys in any order. */
export function sameJson(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  if (ka.length !== kb.length) return false;
  const ra = a as Record<string, unknown>;
  const rb = b as Record<string, unknown>;
  return ka.every((k) => Object.hasOwn(rb, k) && sameJson(ra[k], rb[k]));
}
