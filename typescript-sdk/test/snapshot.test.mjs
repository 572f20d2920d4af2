// snapshot() gives a Snapshot; Snapshot.list filters by metadata; parsed objects keep every
// field the engine sent; a stream's error takes its kind from the wire.
import assert from "node:assert/strict";
import { after, test } from "node:test";

import {
  NotFoundError,
  SANDBOX_STATUSES,
  Sandbox,
  SandforkError,
  Snapshot,
  TimeoutError,
  routes,
} from "@sandfork/sdk";

import { TEMPLATE, assertNoneLeft, http } from "./support/engine.mjs";

after(assertNoneLeft);

/** The engine's JSON answer to `GET path`, as it came (no SDK in between). */
async function rawJson(path) {
  const { baseUrl, apiKey } = await http.connect();
  const response = await fetch(`${baseUrl}${routes.API}${path}`, {
    headers: { Authorization: `Bearer ${apiKey}` },
  });
  return response.json();
}

test("snapshot() is a Snapshot: listed by metadata, got, renamed, deleted", async () => {
  const sandbox = await Sandbox.create({ template: TEMPLATE, client: http });
  const tag = `t${process.pid}${Date.now()}`;
  try {
    // Every field the engine sent is in `info`, known to this SDK or not.
    assert.deepEqual(sandbox.info, await rawJson(routes.sandbox(sandbox.id)));
    assert.ok(SANDBOX_STATUSES.includes(sandbox.status));
    assert.equal(sandbox.memoryMb, sandbox.info.memory_mb);

    const first = await sandbox.snapshot({ name: "one", metadata: { tag, step: "1" } });
    const second = await sandbox.snapshot({ metadata: { tag, step: "2" } });
    assert.ok(first instanceof Snapshot);
    assert.match(first.id, /^snap_/);
    assert.deepEqual([first.name, first.sandboxId, first.metadata.step], ["one", sandbox.id, "1"]);
    assert.ok(first.createdAt instanceof Date && !Number.isNaN(first.createdAt.getTime()));
    assert.deepEqual(first.info, await rawJson(routes.snapshot(first.id)));

    const ids = (s) => s.map((x) => x.id).sort();
    const tagged = await Snapshot.list({ client: http, metadata: { tag } });
    assert.deepEqual(ids(tagged), ids([first, second]));
    const stepTwo = await Snapshot.list({ client: http, metadata: { tag, step: "2" } });
    assert.deepEqual(ids(stepTwo), [second.id]);
    assert.deepEqual(await Snapshot.list({ client: http, metadata: { tag, step: "3" } }), []);
    assert.deepEqual(ids(await sandbox.snapshots({ metadata: { tag } })), ids([first, second]));

    const got = await Snapshot.get(first.id, { client: http });
    assert.deepEqual(got.toJSON(), first.toJSON());
    await got.rename("renamed");
    assert.equal(got.name, "renamed");
    assert.equal((await Snapshot.get(first.id, { client: http })).name, "renamed");
    assert.equal((await got.inventory()).status, "ok");

    await second.delete();
    await assert.rejects(Snapshot.get(second.id, { client: http }), NotFoundError);
    await first.delete();
  } finally {
    await sandbox.kill();
  }
});

test("a stream's error has the kind the engine names, not one read from its message", async () => {
  const sandbox = await Sandbox.create({ template: TEMPLATE, client: http });
  try {
    const named = "kind" in (await rawJson(routes.sandbox("sbx_00000000deadbeef")));
    await assert.rejects(sandbox.execStream("sleep 30", { timeoutSeconds: 1 }), (e) => {
      assert.ok(e instanceof SandforkError);
      assert.equal(e.status, undefined);
      // An engine that names kinds says timeout; an older one names none: a server error.
      assert.equal(e instanceof TimeoutError, named, `${e.name} (${e.kind}): ${e.message}`);
      assert.equal(e.kind, named ? "timeout" : "server_error");
      return true;
    });
  } finally {
    await sandbox.kill();
  }
});
