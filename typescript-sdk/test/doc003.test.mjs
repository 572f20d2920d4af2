// Document 003: Client, piped exec, checkpoint, close, resume with replay, ReplayMismatch.
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { after, test } from "node:test";

import { Client, NotFoundError, ReplayMismatch, TimeoutError } from "@sandfork/sdk";

import { TEMPLATE, assertGone, assertNoneLeft, killAll } from "./support/engine.mjs";

after(assertNoneLeft);

/** A writable that keeps every chunk written to it. */
function collector() {
  const chunks = [];
  const stream = new Writable({
    write(chunk, _encoding, done) {
      chunks.push(chunk.toString());
      done();
    },
  });
  return { stream, chunks, text: () => chunks.join("") };
}

const INSTALL = "for i in 1 2 3; do echo step-$i; sleep 0.4; done; echo ran >> /root/install.log";

test("exec(...).pipe() streams output into a writable as it comes", async () => {
  const client = new Client();
  const sb = await client.sandbox({ template: TEMPLATE, name: "pipe-demo" });
  try {
    const out = collector();
    const err = collector();
    const result = await sb
      .exec("for i in 1 2 3; do echo line-$i; echo warn-$i >&2; sleep 0.4; done")
      .pipe(out.stream, err.stream);
    assert.equal(out.text(), "line-1\nline-2\nline-3\n");
    assert.equal(err.text(), "warn-1\nwarn-2\nwarn-3\n");
    assert.ok(out.chunks.length >= 2, `output came in pieces, got ${JSON.stringify(out.chunks)}`);
    assert.equal(result.exitCode, 0);
    assert.equal(result.stdout, out.text());
    assert.equal(result.seq, 1); // a piped exec is a ledgered call like any other
    const plain = await sb.exec("echo plain");
    assert.deepEqual(
      [plain.stdout, plain.stderr, plain.exitCode, plain.seq],
      ["plain\n", "", 0, 2],
    );
  } finally {
    await sb.close();
  }
});

test("checkpoint, close, resume: replayed exec, ReplayMismatch, then live", async () => {
  const client = new Client({
    baseUrl: process.env.SANDFORK_API,
    apiKey: process.env.SANDFORK_API_KEY,
  });
  const sb = await client.sandbox({
    image: TEMPLATE,
    resources: { cpu: "2", memory: "1Gi" },
    name: "snapshot-demo",
  });
  let resumed;
  try {
    assert.equal(sb.sandbox.cpu, 2);
    assert.equal(sb.sandbox.memoryMb, 1024);
    assert.equal(sb.sandbox.metadata.name, "snapshot-demo");
    const first = collector();
    await sb.exec(INSTALL).pipe(first.stream);
    assert.equal(first.text(), "step-1\nstep-2\nstep-3\n");
    const second = await sb.exec("echo second >> /root/install.log && wc -l < /root/install.log");
    assert.equal(second.stdout.trim(), "2");
    const checkpoint = await sb.checkpoint("after-install");
    assert.equal(checkpoint.seq, 2);
    assert.match(checkpoint.snapshotId, /^snap_/);
    await sb.writeFile("/tmp/script.py", "import sys; print(sys.version_info[0])");
    assert.equal((await sb.exec("python3 /tmp/script.py")).stdout, "3\n");
    const originalId = sb.sandboxId;
    await sb.close();
    await assertGone(originalId);

    resumed = await client.resume(originalId);
    assert.notEqual(resumed.sandboxId, originalId);
    // Call #1 is served from the ledger: its recorded output, nothing runs.
    const replay = collector();
    const cached = await resumed.exec(INSTALL).pipe(replay.stream);
    assert.equal(cached.replayed, true);
    assert.equal(cached.seq, 1);
    assert.equal(replay.text(), "step-1\nstep-2\nstep-3\n");
    // Call #2 differs from what the ledger recorded there.
    await assert.rejects(
      async () => await resumed.exec("echo something else"),
      (e) => e instanceof ReplayMismatch && e.seq === 2 && e.expected.cmd.startsWith("echo second"),
    );
    // Past the cache, calls run live on the restored checkpoint.
    const live = await resumed.exec(
      "wc -l < /root/install.log; test -e /tmp/script.py || echo no-script",
    );
    assert.equal(live.replayed, false);
    assert.equal(live.seq, 3);
    assert.equal(live.stdout, "2\nno-script\n"); // state of the checkpoint, nothing re-ran
    await resumed.writeFile("/tmp/script.py", "print('resumed')");
    assert.equal(await resumed.readFile("/tmp/script.py"), "print('resumed')");
    const ledger = await resumed.sandbox.ledger();
    assert.deepEqual(
      ledger.map((e) => e.seq),
      [1, 2, 3],
    );
  } finally {
    await killAll(sb.sandbox, resumed?.sandbox);
  }
});

test("resume: no checkpoint is NotFoundError; a failed call replays its error", async () => {
  const client = new Client();
  const sb = await client.sandbox({ template: TEMPLATE });
  let resumed;
  try {
    await sb.exec("true"); // #1
    await assert.rejects(
      client.resume(sb.sandboxId),
      (e) => e instanceof NotFoundError && /has no checkpoint/.test(e.message),
    );
    await assert.rejects(
      async () => await sb.exec("sleep 30", { timeoutSeconds: 1 }),
      TimeoutError,
    );
    await sb.checkpoint("one"); // after #2, the failed call
    await assert.rejects(
      client.resume(sb.sandboxId, { name: "two" }),
      (e) => e instanceof NotFoundError && /'two'/.test(e.message),
    );
    resumed = await client.resume(sb.sandboxId, { name: "one" });
    assert.equal((await resumed.exec("true")).replayed, true);
    await assert.rejects(
      async () => await resumed.exec("sleep 30", { timeoutSeconds: 1 }),
      (e) => e instanceof TimeoutError && /timeout/.test(e.message),
    );
    const live = await resumed.exec("echo live");
    assert.deepEqual([live.stdout, live.seq, live.replayed], ["live\n", 3, false]);
    // The failed call was not run again: the new ledger holds the two copied calls, then #3.
    const events = await resumed.sandbox.ledger();
    const calls = events.filter((e) => e.type !== "sandbox.checkpoint_created");
    assert.deepEqual(
      calls.map((e) => [e.seq, e.request.cmd]),
      [
        [1, "true"],
        [2, "sleep 30"],
        [3, "echo live"],
      ],
    );
  } finally {
    await sb.close();
    await resumed?.close();
  }
});
