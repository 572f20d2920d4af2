/**
 * The API's paths, under `API` (`/v1`), spelled here once for the whole SDK: the mirror of
 * Python's `sandfork.protocol.routes` (tests/test_typescript_sdk.py compares the two).
 *
 * Ids are quoted, so no value can reach another route; an action a route does not have is a
 * compile error, and a `TypeError` at the call from untyped code, not a 404 from the engine.
 */

/** Every route below is under it. */
export const API = "/v1";
export const HEALTH = "/health";
/** The change feed, long-polled. */
export const CHANGES = "/changes";
export const TEMPLATES = "/templates";
export const SANDBOXES = "/sandboxes";
export const SNAPSHOTS = "/snapshots";
export const SNAPSHOT_IMPORT = "/snapshots/import";

export const SANDBOX_ACTIONS = [
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
] as const;
export const CONTEXT_ACTIONS = ["channels", "interrupt", "restart", "run"] as const;
export const SNAPSHOT_ACTIONS = ["export"] as const;

export type SandboxAction = (typeof SANDBOX_ACTIONS)[number];
export type ContextAction = (typeof CONTEXT_ACTIONS)[number];
export type SnapshotAction = (typeof SNAPSHOT_ACTIONS)[number];

function segment(value: string | number): string {
  return encodeURIComponent(String(value));
}

function action(path: string, name: string, allowed: readonly string[]): string {
  if (!name) return path;
  if (!allowed.includes(name)) throw new TypeError(`no route ${path}/${name}`);
  return `${path}/${name}`;
}

/** `/sandboxes/{id}`, or one of its `SANDBOX_ACTIONS`. */
export function sandbox(sandboxId: string, name: SandboxAction | "" = ""): string {
  return action(`${SANDBOXES}/${segment(sandboxId)}`, name, SANDBOX_ACTIONS);
}

/** A code context, `/sandboxes/{id}/repl/sessions/{context}`, or one of its `CONTEXT_ACTIONS`. */
export function context(
  sandboxId: string,
  contextId: string,
  name: ContextAction | "" = "",
): string {
  const path = `${sandbox(sandboxId, "repl/sessions")}/${segment(contextId)}`;
  return action(path, name, CONTEXT_ACTIONS);
}

/**
 * Where a server listening on port `number` in the sandbox answers (`rest`: the path and
 * query under it).
 */
export function port(sandboxId: string, number: number | string, rest = "/"): string {
  return `${sandbox(sandboxId, "ports")}/${segment(number)}${rest}`;
}

/** `/snapshots/{id}`, or one of its `SNAPSHOT_ACTIONS`. */
export function snapshot(snapshotId: string, name: SnapshotAction | "" = ""): string {
  return action(`${SNAPSHOTS}/${segment(snapshotId)}`, name, SNAPSHOT_ACTIONS);
}

/** One attachment of a snapshot. */
export function attachment(snapshotId: string, name: string): string {
  return `${snapshot(snapshotId)}/attachments/${segment(name)}`;
}
