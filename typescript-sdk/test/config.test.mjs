// Finding the engine: SANDFORK_API*, then PANDASTACK_API*, then the runtime files.
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import {
  SandforkError,
  fromEnvironment,
  localEngine,
  resolveConnection,
  stateDir,
} from "@sandfork/sdk";

test("the environment: SANDFORK_API* first, then PANDASTACK_API*", () => {
  const both = {
    SANDFORK_API: "http://a:1/",
    SANDFORK_API_KEY: "ka",
    PANDASTACK_API: "http://b:2",
    PANDASTACK_API_KEY: "kb",
  };
  assert.deepEqual(fromEnvironment(both), { baseUrl: "http://a:1", apiKey: "ka" });
  const pandastack = {
    SANDFORK_API: "http://a:1", // without its key: not used
    PANDASTACK_API: "http://b:2",
    PANDASTACK_API_KEY: "kb",
  };
  assert.deepEqual(fromEnvironment(pandastack), { baseUrl: "http://b:2", apiKey: "kb" });
  assert.equal(fromEnvironment({}), undefined);
});

test("the local engine's runtime files, used only while its process lives", async () => {
  const home = mkdtempSync(join(tmpdir(), "sandfork-sdk-"));
  const saved = { ...process.env };
  try {
    assert.equal(stateDir({ SANDFORK_HOME: home }), home);
    assert.equal(stateDir({ SANDFORK_STATE_DIR: "/s", XDG_STATE_HOME: "/x" }), "/s");
    assert.equal(stateDir({ XDG_STATE_HOME: "/x" }), "/x/sandfork");
    const run = join(home, "run");
    mkdirSync(run);
    writeFileSync(join(run, "api_key"), "sfk_local\n");
    const engineJson = (pid) => JSON.stringify({ url: "http://127.0.0.1:9", pid });
    const local = { baseUrl: "http://127.0.0.1:9", apiKey: "sfk_local" };
    writeFileSync(join(run, "engine.json"), engineJson(process.pid));
    assert.deepEqual(localEngine(run), local);

    for (const prefix of ["SANDFORK", "PANDASTACK"]) {
      delete process.env[`${prefix}_API`];
      delete process.env[`${prefix}_API_KEY`];
    }
    process.env.SANDFORK_HOME = home;
    assert.deepEqual(await resolveConnection(), local);
    writeFileSync(join(run, "engine.json"), engineJson(2 ** 22 + 1)); // above any pid_max
    assert.equal(localEngine(run), undefined);
    await assert.rejects(resolveConnection({ autoStart: false }), SandforkError);
  } finally {
    process.env = saved;
    rmSync(home, { recursive: true, force: true });
  }
});
