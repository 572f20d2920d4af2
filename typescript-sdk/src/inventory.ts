/**
 * What is inside a snapshot: the variable inventory the engine stores with it (the
 * attachment `inventory.json`), and the difference between two inventories. Mirrors the
 * Python SDK's `sandfork.sdk.inventory`.
 */

/** The attachment in which the engine stores a snapshot's inventory (the name is the engine's). */
export const INVENTORY_ATTACHMENT = "inventory.json";

/**
 * One variable of a kernel's namespace as the inventory saw it. `type` is the qualified type
 * name (`int`, `numpy.ndarray`, `pandas.DataFrame`); `shape` is set for arrays and frames
 * (a DataFrame's `[rows, columns]`), `length` for builtin containers and strings; `bytes` is
 * approximate; `fingerprint` (`f:` over all the content, `s:` over a sample) is null where no
 * cheap one exists. Fields the inventory could not measure are null.
 */
export interface Variable {
  name: string;
  type: string;
  shape: number[] | null;
  length: number | null;
  bytes: number | null;
  fingerprint: string | null;
}

/**
 * The variables of a snapshot's default kernel, sorted by name. `status` is `"ok"`, or
 * `"unavailable"` with a `reason` (the kernel was busy with a cell, its answer was refused,
 * the snapshot predates inventories): then `variables` is empty. `truncated` says a bound
 * (time, count, size) cut the list short; `elapsedMs` is the kernel's time.
 */
export interface Inventory {
  status: "ok" | "unavailable";
  reason: string | null;
  truncated: boolean;
  elapsedMs: number;
  variables: Variable[];
}

/** A variable present in both inventories that changed. */
export interface VariableChange {
  name: string;
  before: Variable;
  after: Variable;
}

/**
 * What changed from one snapshot's inventory (`from`, its id) to another's (`to`): each
 * list by name, sorted. Its JSON is the wire contract's diff.
 */
export interface InventoryDiff {
  from: string;
  to: string;
  added: Variable[];
  removed: Variable[];
  changed: VariableChange[];
  unchanged: string[];
}

/** A `Variable` from its JSON object. */
export function variableFromApi(data: Record<string, any>): Variable {
  return {
    name: String(data.name),
    type: String(data.type),
    shape: data.shape == null ? null : (data.shape as unknown[]).map((n) => Number(n)),
    length: data.length ?? null,
    bytes: data.bytes ?? null,
    fingerprint: data.fingerprint ?? null,
  };
}

/** An `Inventory` from the JSON of `inventory.json`. */
export function inventoryFromApi(data: Record<string, any>): Inventory {
  return {
    status: String(data.status) as Inventory["status"],
    reason: data.reason ?? null,
    truncated: Boolean(data.truncated ?? false),
    elapsedMs: Number(data.elapsed_ms ?? 0),
    variables: (data.variables ?? []).map(variableFromApi),
  };
}

/** An inventory that could not be had, and why. */
export function unavailableInventory(reason: string): Inventory {
  return { status: "unavailable", reason, truncated: false, elapsedMs: 0, variables: [] };
}

/** The inventory of a snapshot stored without one (taken before inventories existed). */
export function missingInventory(): Inventory {
  return unavailableInventory("the snapshot was taken before inventories existed");
}

/**
 * True unless type, shape, length or size differ, or both have fingerprints and those differ
 * (a missing fingerprint is no evidence of a change).
 */
export function sameVariable(a: Variable, b: Variable): boolean {
  if (
    a.type !== b.type ||
    !sameShape(a.shape ?? null, b.shape ?? null) ||
    (a.length ?? null) !== (b.length ?? null) ||
    (a.bytes ?? null) !== (b.bytes ?? null)
  ) {
    return false;
  }
  return a.fingerprint == null || b.fingerprint == null || a.fingerprint === b.fingerprint;
}

/**
 * Variables added, removed, changed and unchanged from `a` to `b`, each by name, sorted.
 * Changed means a different type, shape, length or size, or fingerprints that are both
 * present and differ. An unavailable or truncated inventory lists fewer variables than the
 * kernel had: check `status` and `truncated` before reading "added" or "removed" as such.
 */
export function diffInventories(
  a: Inventory,
  b: Inventory,
  fromId: string,
  toId: string,
): InventoryDiff {
  const before = byName(a.variables);
  const after = byName(b.variables);
  const common = sortedNames([...before.keys()].filter((n) => after.has(n)));
  const only = (x: Map<string, Variable>, y: Map<string, Variable>): Variable[] =>
    sortedNames([...x.keys()].filter((n) => !y.has(n))).map((n) => x.get(n)!);
  const same = (n: string): boolean => sameVariable(before.get(n)!, after.get(n)!);
  return {
    from: fromId,
    to: toId,
    added: only(after, before),
    removed: only(before, after),
    changed: common
      .filter((n) => !same(n))
      .map((n) => ({ name: n, before: before.get(n)!, after: after.get(n)! })),
    unchanged: common.filter(same),
  };
}

function sameShape(a: number[] | null, b: number[] | null): boolean {
  if (a === null || b === null) return a === b;
  return a.length === b.length && a.every((n, i) => n === b[i]);
}

/** The variables by name (a repeated name: the last one, as in the Python SDK). */
function byName(variables: Variable[]): Map<string, Variable> {
  return new Map(variables.map((v) => [v.name, v]));
}

/** Names in code point order, as Python's `sorted` orders them. */
function sortedNames(names: string[]): string[] {
  return names.sort(compareCodePoints);
}

function compareCodePoints(a: string, b: string): number {
  const x = [...a];
  const y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = x[i].codePointAt(0)! - y[i].codePointAt(0)!;
    if (d !== 0) return d;
  }
  return x.length - y.length;
}
