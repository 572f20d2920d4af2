// PandaStack compatibility: the unmodified published PandaStack SDK (@pandastack/sdk, pinned
// in package.json) drives this engine. Checked: explore() over forks keeps the parent (its
// kernel state too) and the winner and reaps the losers; pause()/resume() freeze and thaw a
// sandbox in place; setTtl()/setPersistent() answer the lifecycle; logs() shows the console.
// Every test kills each sandbox it made, and the file ends with none of its own left.
import assert from "node:assert/strict";
import { after, test } from "node:test";

import { Client, NotFoundError, PandaStackError, Sandbox } from "@pandastack/sdk";

const { SANDFORK_API, SANDFORK_API_KEY } = process.env;
assert.ok(SANDFORK_API && SANDFORK_API_KEY, "run with SANDFORK_API and SANDFORK_API_KEY");

/** The template every test uses (built once by the test session). */
const TEMPLATE = "code-interpreter";

/** PandaStack's client, pointed at the engine under test (VM boots may outlast 30 s). */
const client = new Client({ apiUrl: SANDFORK_API, apiKey: SANDFORK_API_KEY, timeoutMs: 300_000 });

/** The ids of the sandboxes the engine lists. */
async function listedIds() {
  return (await Sandbox.list(client)).map((s) => s.id);
}

const preexisting = new Set(await listedIds());

/** Kill each sandbox still alive (one already gone is fine). */
async function killAll(...sandboxes) {
  for (const sandbox of sandboxes.flat()) {
    if (!sandbox) continue;
    try {
      await sandbox.kill();
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
  }
}

after(async () => {
  const left = (await listedIds()).filter((id) => !preexisting.has(id));
  assert.deepEqual(left, [], "sandboxes left running");
});

test("explore: the winner is promoted, the losers are reaped, the parent goes on", async () => {
  const parent = await Sandbox.create({ template: TEMPLATE }, client);
  const made = [parent];
  try {
    const context = await parent.createCodeContext();
    assert.equal((await context.runCode("x = 41")).exit_code, 0);

    const candidates = ["echo 1", "echo 22", "echo 333"];
    const result = await parent.explore(candidates, {
      scoreFn: (_sandbox, outcome) => outcome.stdoutTail.trim().length,
    });
    made.push(...result.outcomes.map((o) => o.sandbox));

    assert.deepEqual(result.errors, []);
    assert.equal(result.outcomes.length, 3);
    assert.ok(result.outcomes.every((o) => o.ok && o.exitCode === 0), "every branch ran");
    assert.ok(result.treeId, "the fork tree's children carry metadata.fork_tree_id");
    assert.equal(result.winnerOutcome.label, "echo 333");
    assert.equal(result.winnerOutcome.score, 3);
    assert.equal(result.winnerOutcome.stdoutTail, "333\n");
    assert.ok(result.winner, "the winner is promoted");
    assert.equal(result.winner.id, result.winnerOutcome.sandboxId);
    const losers = result.outcomes.filter((o) => o !== result.winnerOutcome).map((o) => o.sandboxId);
    assert.deepEqual([...result.reaped].sort(), [...losers].sort());
    assert.deepEqual(result.reapFailures, {});

    // The winner is alive and runs commands; the losers are gone; the parent is kept.
    const listed = await listedIds();
    assert.ok(listed.includes(result.winner.id), "the winner is listed");
    assert.ok(listed.includes(parent.id), "the parent is listed");
    for (const loser of losers) {
      assert.ok(!listed.includes(loser), `loser ${loser} is still listed`);
      await assert.rejects(Sandbox.get(loser, client), NotFoundError);
    }
    assert.equal((await Sandbox.get(result.winner.id, client)).status, "running");
    assert.equal((await result.winner.exec("echo winner")).stdout, "winner\n");

    // The parent still runs code, and its kernel still holds what was set before explore.
    assert.equal((await Sandbox.get(parent.id, client)).status, "running");
    assert.equal((await context.runCode("x + 1")).text, "42");
    assert.equal((await parent.exec("echo parent")).stdout, "parent\n");
  } finally {
    await killAll(made);
  }
});

test("pause freezes the sandbox in place, resume lets it go on with its state", async () => {
  const sandbox = await Sandbox.create({ template: TEMPLATE }, client);
  try {
    const context = await sandbox.createCodeContext();
    await context.runCode("kept = 6 * 7");

    await sandbox.pause();
    assert.equal((await Sandbox.get(sandbox.id, client)).status, "paused");
    await assert.rejects(
      sandbox.exec("echo hello"),
      (e) => e instanceof PandaStackError && /paused/.test(e.message),
    );

    await sandbox.resume();
    assert.equal((await Sandbox.get(sandbox.id, client)).status, "running");
    assert.equal((await context.runCode("kept")).text, "42");
    assert.equal((await sandbox.exec("echo hello")).stdout, "hello\n");
  } finally {
    await killAll(sandbox);
  }
});

test("lifecycle: setTtl and setPersistent answer the sandbox's lifecycle", async () => {
  const sandbox = await Sandbox.create({ template: TEMPLATE }, client);
  try {
    const ttl = await sandbox.setTtl(600);
    assert.equal(ttl.id, sandbox.id);
    assert.equal(ttl.ttl_seconds, 600);
    assert.equal(ttl.persistent, false);
    assert.ok(ttl.expires_in > 0 && ttl.expires_in <= 600, `expires_in ${ttl.expires_in}`);
    assert.equal(typeof ttl.expires_at, "string");

    const persistent = await sandbox.setPersistent(true);
    assert.equal(persistent.persistent, true);
    assert.equal(persistent.ttl_seconds, null);
    assert.equal(persistent.expires_in, null);
    assert.equal((await sandbox.lifecycle()).persistent, true);

    const transient = await sandbox.setPersistent(false);
    assert.equal(transient.persistent, false);
    assert.equal((await sandbox.lifecycle()).persistent, false);
  } finally {
    await killAll(sandbox);
  }
});

test("logs (not followed): the sandbox's console lines, its egress session among them", async () => {
  const sandbox = await Sandbox.create({ template: TEMPLATE }, client);
  try {
    const lines = [];
    for await (const line of sandbox.logs({ stream: "both", follow: false })) lines.push(line);
    assert.ok(
      lines.some((line) => line.includes("egress session")),
      `no "egress session" line in:\n${lines.join("\n")}`,
    );
  } finally {
    await killAll(sandbox);
  }
});

test("previewUrls: the ports a server listens on in the sandbox, one URL each", async () => {
  const sandbox = await Sandbox.create({ template: TEMPLATE }, client);
  try {
    assert.deepEqual(await sandbox.previewUrls(), {});
    await sandbox.exec("nohup python3 -m http.server 8000 >/dev/null 2>&1 &");
    let urls = {};
    for (let tries = 0; !("8000" in urls); tries++) {
      assert.ok(tries < 600, "port 8000 never listened"); // a bound for a hang
      await new Promise((resolve) => setTimeout(resolve, 200));
      urls = await sandbox.previewUrls();
    }
    assert.deepEqual(Object.keys(urls), ["8000"]);
    assert.equal(urls[8000], sandbox.previewUrl(8000));
  } finally {
    await killAll(sandbox);
  }
});
