// hibernate() stops the VM and keeps the sandbox; the next call wakes it with its state.
import assert from "node:assert/strict";
import { after, test } from "node:test";

import { Sandbox } from "@sandfork/sdk";

import { TEMPLATE, assertNoneLeft, http } from "./support/engine.mjs";

after(assertNoneLeft);

test("a hibernated sandbox wakes on its next call, its kernel's variables kept", async () => {
  const sandbox = await Sandbox.create({ template: TEMPLATE, client: http });
  try {
    const context = await sandbox.createCodeContext();
    await context.runCode("kept = 6 * 7");
    await sandbox.hibernate();
    assert.equal(sandbox.status, "hibernated");
    assert.equal((await Sandbox.get(sandbox.id, { client: http })).status, "hibernated");
    const result = await context.runCode("kept");
    assert.equal(result.text, "42");
    assert.equal((await sandbox.refresh()).status, "running");
    await sandbox.hibernate();
    await sandbox.wake();
    assert.equal(sandbox.status, "running");
    await sandbox.wake(); // idempotent
    assert.equal((await context.runCode("kept + 1")).text, "43");
  } finally {
    await sandbox.kill();
  }
});
