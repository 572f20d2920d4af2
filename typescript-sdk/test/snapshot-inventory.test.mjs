// Every snapshot carries the variable inventory of its default kernel; two snapshots compare.
import assert from "node:assert/strict";
import { after, test } from "node:test";

import { Client, Sandbox, inventoryDiff, snapshotInventory } from "@sandfork/sdk";

import { TEMPLATE, assertNoneLeft, http, killAll } from "./support/engine.mjs";

after(assertNoneLeft);

test("a snapshot's inventory lists its variables; the diff of two names what changed", async () => {
  const sandbox = await Sandbox.create({ template: TEMPLATE, client: http });
  try {
    const ctx = await sandbox.createCodeContext();
    const setup = await ctx.runCode(
      "import pandas as pd\ndf = pd.DataFrame({'a': range(100), 'b': ['x'] * 100})\nn = 1",
    );
    assert.equal(setup.error, null);
    const first = await sandbox.snapshot();
    assert.ok(first.attachments.includes("inventory.json"), first.attachments.join());

    const client = new Client();
    const inv = await client.snapshotInventory(first.id);
    assert.equal(inv.status, "ok", inv.reason ?? "");
    assert.equal(inv.reason, null);
    assert.equal(inv.truncated, false);
    assert.ok(inv.elapsedMs >= 0 && inv.elapsedMs < 2000, String(inv.elapsedMs));
    const df = inv.variables.find((v) => v.name === "df");
    assert.equal(df?.type, "pandas.DataFrame");
    assert.deepEqual(df.shape, [100, 2]);
    assert.ok(df.bytes > 0);
    assert.match(df.fingerprint ?? "", /^[fs]:[0-9a-f]{32}$/);
    const n = inv.variables.find((v) => v.name === "n");
    assert.deepEqual([n?.type, n.shape, n.length], ["int", null, null]);
    assert.ok(!inv.variables.some((v) => ["pd", "In", "Out"].includes(v.name)));
    const names = inv.variables.map((v) => v.name);
    assert.deepEqual(names, [...names].sort());
    // The SnapshotInfo reads the same without asking for the snapshot again.
    assert.deepEqual(await snapshotInventory(first, { client: http }), inv);

    const change = await ctx.runCode("df['c'] = df['a'] * 2\nm = 2");
    assert.equal(change.error, null);
    const second = await sandbox.snapshot();

    const d = await client.inventoryDiff(first.id, second.id);
    assert.equal(d.from, first.id);
    assert.equal(d.to, second.id);
    assert.deepEqual(
      d.changed.map((c) => c.name),
      ["df"],
    );
    assert.deepEqual(d.changed[0].before.shape, [100, 2]);
    assert.deepEqual(d.changed[0].after.shape, [100, 3]);
    assert.deepEqual(
      d.added.map((v) => v.name),
      ["m"],
    );
    assert.equal(d.added[0].type, "int");
    assert.deepEqual(d.removed, []);
    assert.deepEqual(d.unchanged, ["n"]);
    assert.deepEqual(await inventoryDiff(first, second.id, { client: http }), d);
  } finally {
    await killAll(sandbox);
  }
});
