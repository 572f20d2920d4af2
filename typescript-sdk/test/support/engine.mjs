// Shared by the tests: the engine under test (SANDFORK_API/SANDFORK_API_KEY) and cleanup.
import assert from "node:assert/strict";

import { Http, NotFoundError, Sandbox } from "@sandfork/sdk";

assert.ok(process.env.SANDFORK_API && process.env.SANDFORK_API_KEY, "run with SANDFORK_API*");

/** The template every test uses (built once by the test session). */
export const TEMPLATE = "code-interpreter";

/** An `Http` session of the engine under test. */
export const http = new Http();

/** Kill each sandbox still alive; a test calls it in `finally` so nothing is left behind. */
export async function killAll(...sandboxes) {
  for (const sandbox of sandboxes.flat()) {
    if (!sandbox) continue;
    try {
      await sandbox.kill();
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
  }
}

/** Assert that the engine knows no sandbox with this id any more. */
export async function assertGone(sandboxId) {
  await assert.rejects(Sandbox.get(sandboxId, { client: http }), NotFoundError);
}

/** The sandboxes of the engine that are not from this test file. */
const preexisting = new Set((await Sandbox.list({ client: http })).map((s) => s.id));

/** The ids of the sandboxes this test file made that the engine still has. */
export async function ourSandboxes() {
  const all = await Sandbox.list({ client: http });
  return all.map((s) => s.id).filter((id) => !preexisting.has(id));
}

/** Assert that every sandbox this test file made is gone (each test cleans up after itself). */
export async function assertNoneLeft() {
  assert.deepEqual(await ourSandboxes(), [], "sandboxes left running");
}
