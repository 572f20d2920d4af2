// The variable inventory of a snapshot and the diff of two, without an engine.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  diffInventories,
  inventoryDiff,
  inventoryFromApi,
  sameVariable,
  snapshotInventory,
} from "@sandfork/sdk";

const variable = (name, fields = {}) => ({
  name,
  type: "int",
  shape: null,
  length: null,
  bytes: null,
  fingerprint: null,
  ...fields,
});

const inventory = (...variables) => ({
  status: "ok",
  reason: null,
  truncated: false,
  elapsedMs: 0,
  variables,
});

const f = (digit) => "f:" + digit.repeat(32);

test("diff names added, removed, changed and unchanged variables, each sorted", () => {
  const before = inventory(
    variable("gone"),
    variable("same", { fingerprint: f("0") }),
    variable("refilled", { shape: [2, 2], fingerprint: f("1") }),
    variable("resized", { length: 3 }),
    variable("retyped"),
    variable("reshaped", { shape: [2, 2] }),
    variable("grown", { bytes: 28 }),
    variable("unhashed", { bytes: 28 }),
  );
  const after = inventory(
    variable("new"),
    variable("same", { fingerprint: f("0") }),
    variable("refilled", { shape: [2, 2], fingerprint: f("2") }),
    variable("resized", { length: 4 }),
    variable("retyped", { type: "str" }),
    variable("reshaped", { shape: [4] }),
    variable("grown", { bytes: 32 }),
    variable("unhashed", { bytes: 28, fingerprint: f("3") }),
    variable("another"),
  );
  const d = diffInventories(before, after, "snap_a", "snap_b");
  assert.equal(d.from, "snap_a");
  assert.equal(d.to, "snap_b");
  assert.deepEqual(
    d.added.map((v) => v.name),
    ["another", "new"],
  );
  assert.deepEqual(d.removed, [variable("gone")]);
  assert.deepEqual(
    d.changed.map((c) => c.name),
    ["grown", "refilled", "reshaped", "resized", "retyped"],
  );
  assert.deepEqual(d.unchanged, ["same", "unhashed"]); // a missing fingerprint is no change
  const refilled = d.changed[1];
  assert.deepEqual(refilled.before.shape, [2, 2]);
  assert.equal(refilled.after.fingerprint, f("2"));
  // Its JSON is the wire contract's diff.
  const json = JSON.parse(JSON.stringify(d));
  assert.deepEqual(Object.keys(json).sort(), [
    "added",
    "changed",
    "from",
    "removed",
    "to",
    "unchanged",
  ]);
  assert.deepEqual(Object.keys(json.changed[0]), ["name", "before", "after"]);
  assert.deepEqual(diffInventories(after, after, "x", "x").changed, []);
});

test("the fingerprint rule: differing fingerprints change a variable, a missing one does not", () => {
  const a = variable("x", { shape: [3], bytes: 24, fingerprint: "s:" + "a".repeat(32) });
  assert.ok(sameVariable(a, { ...a }));
  assert.ok(!sameVariable(a, { ...a, fingerprint: "s:" + "b".repeat(32) }));
  assert.ok(sameVariable(a, { ...a, fingerprint: null }));
  assert.ok(sameVariable({ ...a, fingerprint: null }, a));
  assert.ok(!sameVariable(a, { ...a, shape: [3, 1] }));
  assert.ok(!sameVariable(a, { ...a, shape: null }));
  assert.ok(!sameVariable(a, { ...a, length: 3 }));
});

test("names sort by code point, as Python's sorted does", () => {
  const names = ["b", "\u{20000}", "\uFF21", "A", "_a"];
  const d = diffInventories(inventory(), inventory(...names.map((n) => variable(n))), "a", "b");
  assert.deepEqual(
    d.added.map((v) => v.name),
    ["A", "_a", "b", "\uFF21", "\u{20000}"],
  );
});

test("an inventory from the JSON of inventory.json", () => {
  const inv = inventoryFromApi({
    status: "ok",
    reason: null,
    truncated: true,
    elapsed_ms: 12,
    variables: [
      {
        name: "df",
        type: "pandas.DataFrame",
        shape: [10, 2],
        length: null,
        bytes: 160,
        fingerprint: f("a"),
      },
      { name: "s", type: "str", shape: null, length: 5, bytes: 54, fingerprint: null },
    ],
  });
  assert.deepEqual(inv, {
    status: "ok",
    reason: null,
    truncated: true,
    elapsedMs: 12,
    variables: [
      variable("df", { type: "pandas.DataFrame", shape: [10, 2], bytes: 160, fingerprint: f("a") }),
      variable("s", { type: "str", length: 5, bytes: 54 }),
    ],
  });
  assert.deepEqual(inventoryFromApi({ status: "unavailable", reason: "busy" }), {
    status: "unavailable",
    reason: "busy",
    truncated: false,
    elapsedMs: 0,
    variables: [],
  });
});

test("a snapshot without inventory.json (from before inventories) reads as unavailable", async () => {
  const noClient = {
    request: (...args) => assert.fail(`unexpected request ${JSON.stringify(args)}`),
  };
  const old = {
    id: "snap_" + "0".repeat(16),
    name: null,
    sizeBytes: 1,
    createdAt: new Date(0),
    sandboxId: "sbx_" + "0".repeat(16),
    template: "t",
    parentId: null,
    contexts: [],
    metadata: {},
    attachments: [],
  };
  const inv = await snapshotInventory(old, { client: noClient });
  assert.deepEqual(inv, {
    status: "unavailable",
    reason: "the snapshot was taken before inventories existed",
    truncated: false,
    elapsedMs: 0,
    variables: [],
  });
  const d = await inventoryDiff(old, old, { client: noClient });
  assert.deepEqual(d, {
    from: old.id,
    to: old.id,
    added: [],
    removed: [],
    changed: [],
    unchanged: [],
  });
});
