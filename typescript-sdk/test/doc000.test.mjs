// Document 000: Sandbox.create, exec, code contexts, snapshot/restore across processes, forks.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { after, test } from "node:test";
import { promisify } from "node:util";

import {
  AuthError,
  BadRequestError,
  CommandFailed,
  NotFoundError,
  Sandbox,
  TimeoutError,
} from "@sandfork/sdk";

import { TEMPLATE, assertGone, assertNoneLeft, http, killAll } from "./support/engine.mjs";

const run = promisify(execFile);
const support = new URL("./support/", import.meta.url);

async function node(script, ...args) {
  const { stdout } = await run(process.execPath, [new URL(script, support).pathname, ...args]);
  return JSON.parse(stdout.trim().split("\n").at(-1));
}

after(assertNoneLeft);

test("turns 1 and 2 run in two Node processes; turn 2 restores turn 1's state", async () => {
  const turn1 = await node("turn1.mjs");
  assert.match(turn1.snapshotId, /^snap_/);
  assert.equal(turn1.name, "turn-1");
  assert.ok(turn1.sizeBytes > 0);
  assert.ok(Math.abs(Date.parse(turn1.createdAt) - Date.now()) < 10 * 60_000);
  await assertGone(turn1.sandboxId); // turn 1 killed its sandbox

  const turn2 = await node("turn2.mjs", turn1.snapshotId);
  assert.equal(turn2.text, "10");
  assert.equal(turn2.stdout.trim(), "4.5");
  assert.equal(turn2.setup, "installed\n");
  assert.notEqual(turn2.sandboxId, turn1.sandboxId);
  await assertGone(turn2.sandboxId); // disposed
});

test("forkTree({count: 3}) gives three isolated copies of a live sandbox", async () => {
  const parent = await Sandbox.create({ template: TEMPLATE, metadata: { test: "fork-tree" } });
  let children = [];
  try {
    const ctx = await parent.createCodeContext();
    await ctx.runCode("x = 'parent'");
    await parent.files.write("/root/who.txt", "parent");
    children = await parent.forkTree({ count: 3 });
    assert.equal(children.length, 3);
    assert.equal(new Set(children.map((c) => c.id)).size, 3);
    await Promise.all(
      children.map(async (child, i) => {
        assert.equal(child.metadata.fork_parent_id, parent.id);
        const cctx = await child.createCodeContext();
        assert.equal((await cctx.runCode("x")).text, "'parent'"); // inherited
        await cctx.runCode(`x = 'child-${i}'`);
        await child.files.write("/root/who.txt", `child-${i}`);
      }),
    );
    for (const [i, child] of children.entries()) {
      const cctx = await child.createCodeContext();
      assert.equal((await cctx.runCode("x")).text, `'child-${i}'`);
      assert.equal(await child.files.read("/root/who.txt"), `child-${i}`);
    }
    assert.equal((await ctx.runCode("x")).text, "'parent'");
    assert.equal(await parent.files.read("/root/who.txt"), "parent");
    const names = (await parent.files.list("/root")).map((e) => e.name);
    assert.ok(names.includes("who.txt"));
  } finally {
    await killAll(children, parent);
  }
});

test("bad input gives typed errors carrying the engine's message", async () => {
  await assert.rejects(
    Sandbox.create({ template: TEMPLATE, fromSnapshot: "snap_00000000deadbeef" }),
    (e) =>
      e instanceof NotFoundError && e.status === 404 && e.message.includes("snap_00000000deadbeef"),
  );
  await assert.rejects(
    Sandbox.list({ connection: { baseUrl: process.env.SANDFORK_API, apiKey: "sfk_wrong" } }),
    (e) => e instanceof AuthError && /API key/.test(e.message),
  );
  const sandbox = await Sandbox.create({ template: TEMPLATE });
  try {
    await assert.rejects(
      sandbox.forkTree({ count: 0 }),
      (e) => e instanceof BadRequestError && /count must be an integer from 1 to/.test(e.message),
    );
    await assert.rejects(
      sandbox.exec("echo out; echo err >&2; exit 3", { check: true }),
      (e) =>
        e instanceof CommandFailed &&
        e.exitCode === 3 &&
        e.stdout === "out\n" &&
        e.stderr === "err\n",
    );
    await assert.rejects(
      sandbox.exec("sleep 30", { timeoutSeconds: 1 }),
      (e) => e instanceof TimeoutError && /timeout/.test(e.message),
    );
    await assert.rejects(sandbox.files.read("/root/missing.txt"), NotFoundError);
    const plain = await sandbox.exec("pwd", { cwd: "/tmp", env: { GREETING: "hi" } });
    assert.equal(plain.stdout, "/tmp\n");
    const chunks = [];
    const code = await sandbox.execStream("echo $GREETING; echo e >&2; exit 4", {
      env: { GREETING: "streamed" },
      onStdout: (c) => chunks.push(["out", c]),
      onStderr: (c) => chunks.push(["err", c]),
    });
    assert.equal(code, 4);
    assert.deepEqual(chunks.map(([k]) => k).sort(), ["err", "out"]);
  } finally {
    await killAll(sandbox);
  }
});

test("runCode returns rich results: text, html, png, json, stdout, stderr and error", async () => {
  const sandbox = await Sandbox.create({ template: TEMPLATE });
  try {
    const ctx = await sandbox.createCodeContext();
    const html = await ctx.runCode("import pandas as pd; pd.DataFrame({'a': [1, 2]})");
    assert.match(html.html ?? "", /<table/);
    const png = await ctx.runCode(
      "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
    );
    assert.ok((png.png ?? "").length > 100, "a base64 PNG");
    const json = await ctx.runCode(
      "from IPython.display import JSON, display; display(JSON({'k': [1, 2]}))",
    );
    assert.deepEqual(json.json, { k: [1, 2] });
    const streams = await ctx.runCode("import sys; print('o'); print('e', file=sys.stderr)");
    assert.equal(streams.stdout, "o\n");
    assert.equal(streams.stderr, "e\n");
    const failed = await ctx.runCode("1 / 0");
    assert.equal(failed.error?.name, "ZeroDivisionError");
    assert.ok(failed.error.traceback.length > 0);
  } finally {
    await killAll(sandbox);
  }
});
