// The workflow builder: a failed run, re-run, resumes after its last checkpoint.
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { after, test } from "node:test";

import { Client, CommandFailed, WorkflowFailed, workflow } from "@sandfork/sdk";

import { TEMPLATE, assertGone, assertNoneLeft } from "./support/engine.mjs";

after(assertNoneLeft);

function sink() {
  const chunks = [];
  return {
    chunks,
    stream: new Writable({
      write(chunk, _encoding, done) {
        chunks.push(chunk.toString());
        done();
      },
    }),
  };
}

test("a workflow whose third step fails resumes after its checkpoint when run again", async () => {
  const client = new Client();
  let attempt = 0;
  const flow = workflow(client).sandbox({ template: TEMPLATE, name: "wf" }, (sb) => {
    attempt += 1;
    sb.exec("echo setup-ran >> /root/step1.log; echo setup-output");
    sb.checkpoint("after-setup");
    // Fails on the first run (the "bug"); fixed for the second.
    const fixed = "wc -l < /root/step1.log; cat /root/step1.log";
    sb.exec(attempt === 1 ? "echo failing; exit 7" : fixed);
  });

  const first = sink();
  const failure = await flow.pipe(first.stream).then(
    () => assert.fail("the first run must fail"),
    (e) => e,
  );
  assert.ok(failure instanceof WorkflowFailed, String(failure));
  assert.equal(failure.step, 2);
  assert.ok(failure.cause instanceof CommandFailed);
  assert.equal(failure.cause.exitCode, 7);
  assert.equal(first.chunks.join(""), "setup-output\nfailing\n");
  await assertGone(failure.sandboxId); // the failed run closed its sandbox

  const second = sink();
  const result = await flow.pipe(second.stream);
  const [run] = result.sandboxes;
  assert.equal(run.resumedFrom, failure.sandboxId);
  assert.notEqual(run.sandboxId, failure.sandboxId);
  assert.deepEqual(
    run.steps.map((s) => [s.kind, s.replayed]),
    [
      ["exec", true], // served from the ledger, not run again
      ["checkpoint", true],
      ["exec", false],
    ],
  );
  // Step 1 ran exactly once: the sandbox shows one line written by it.
  assert.equal(run.steps[2].result.stdout, "1\nsetup-ran\n");
  assert.equal(second.chunks.join(""), "setup-output\n1\nsetup-ran\n");
  await assertGone(run.sandboxId);
});

test("sequence() and parallel() groups run every sandbox and close each", async () => {
  const client = new Client();
  const order = [];
  const result = await workflow(client)
    .sequence((w) =>
      w.sandbox({ template: TEMPLATE, name: "first" }, (sb) => {
        sb.writeFile("/root/in.txt", "data");
        sb.exec("cat /root/in.txt");
      }),
    )
    .parallel((w) => {
      for (const name of ["left", "right"]) {
        w.sandbox({ template: TEMPLATE, name }, (sb) => {
          order.push(name);
          sb.runCode(`print(${JSON.stringify(name)})`);
        });
      }
    })
    .result();
  assert.deepEqual(
    result.sandboxes.map((s) => s.name),
    ["first", "left", "right"],
  );
  assert.equal(result.sandboxes[0].steps[1].result.stdout, "data");
  assert.equal(result.sandboxes[1].steps[0].result.stdout, "left\n");
  assert.equal(result.sandboxes[2].steps[0].result.stdout, "right\n");
  assert.deepEqual(order.sort(), ["left", "right"]);
  for (const run of result.sandboxes) await assertGone(run.sandboxId);
});
