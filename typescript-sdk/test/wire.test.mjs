// The SDK's types against the wire schema: src/wire.ts is what the schema gives, a schema the
// SDK disagrees with fails tsc, a field added to the schema needs no TS change, and a parsed
// sandbox or snapshot keeps every field the engine sent. No engine needed.

import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, test } from "node:test";

import {
  ConflictError,
  Http,
  NotFoundError,
  Sandbox,
  SandforkError,
  ServerError,
  Snapshot,
  TimeoutError,
  errorFor,
  routes,
} from "@sandfork/sdk";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const SCHEMA = JSON.parse(readFileSync(join(ROOT, "src", "wire-schema.json"), "utf8"));
const scratch = mkdtempSync(join(tmpdir(), "sandfork-wire-"));
after(() => rmSync(scratch, { recursive: true, force: true }));

/** tsc --noEmit over a copy of src/ whose wire.ts is generated from `schema`. */
function typeCheckWith(schema, name) {
  const dir = join(scratch, name);
  cpSync(join(ROOT, "src"), join(dir, "src"), { recursive: true });
  writeFileSync(join(dir, "schema.json"), JSON.stringify(schema));
  execFileSync(process.execPath, [
    join(ROOT, "scripts", "wire-types.mjs"),
    "--schema",
    join(dir, "schema.json"),
    "--out",
    join(dir, "src", "wire.ts"),
  ]);
  writeFileSync(
    join(dir, "tsconfig.json"),
    JSON.stringify({
      extends: join(ROOT, "tsconfig.esm.json"),
      compilerOptions: {
        noEmit: true,
        rootDir: "src",
        typeRoots: [join(ROOT, "node_modules", "@types")],
      },
      include: ["src"],
    }),
  );
  const tsc = join(ROOT, "node_modules", "typescript", "bin", "tsc");
  return spawnSync(process.execPath, [tsc, "-p", join(dir, "tsconfig.json")], { encoding: "utf8" });
}

function withSandboxProperties(edit) {
  const schema = structuredClone(SCHEMA);
  edit(schema.$defs.SandboxInfo.properties, schema);
  return schema;
}

test("src/wire.ts is what wire-schema.json gives (npm run wire)", () => {
  const check = spawnSync(process.execPath, [join(ROOT, "scripts", "wire-types.mjs"), "--check"], {
    encoding: "utf8",
  });
  assert.equal(check.status, 0, check.stderr);
});

test("tsc fails when the schema and the SDK disagree", () => {
  const renamed = withSandboxProperties((props, schema) => {
    props.vcpus = props.cpu; // the SDK reads `cpu`
    delete props.cpu;
    schema.$defs.SandboxInfo.required = schema.$defs.SandboxInfo.required.map((k) =>
      k === "cpu" ? "vcpus" : k,
    );
  });
  const result = typeCheckWith(renamed, "renamed");
  assert.notEqual(result.status, 0, "tsc passed with `cpu` renamed in the schema");
  assert.match(result.stdout, /src\/sandbox-view\.ts/); // where a Sandbox declares its fields

  const retyped = structuredClone(SCHEMA);
  retyped.$defs.SnapshotInfo.properties.size_bytes = { type: "string" };
  const second = typeCheckWith(retyped, "retyped");
  assert.notEqual(second.status, 0, "tsc passed with `size_bytes` a string in the schema");
  assert.match(second.stdout, /src\/snapshot\.ts/);

  const kinds = structuredClone(SCHEMA);
  kinds.$defs.ErrorKind.enum.push("gone_fishing");
  const third = typeCheckWith(kinds, "kinds");
  assert.notEqual(third.status, 0, "tsc passed with an error kind the SDK has no class for");
  assert.match(third.stdout, /src\/errors\.ts/);
});

test("a field added to the schema needs no TS change", () => {
  const added = withSandboxProperties((props) => {
    props.nickname = { anyOf: [{ type: "string" }, { type: "null" }] };
  });
  const result = typeCheckWith(added, "added");
  assert.equal(result.status, 0, result.stdout + result.stderr);
  const wire = readFileSync(join(scratch, "added", "src", "wire.ts"), "utf8");
  assert.match(wire, /nickname\?: string \| null;/);
});

test("a parsed sandbox and snapshot keep every field the engine sent", () => {
  const http = new Http({ baseUrl: "http://127.0.0.1:9", apiKey: "k" });
  const sandbox = Sandbox.fromApi(http, {
    id: "sbx_1",
    template: "t",
    status: "running",
    cpu: 2,
    memory_mb: 512,
    metadata: { a: "b" },
    from_the_future: { nested: [1] },
  });
  assert.deepEqual(sandbox.info.from_the_future, { nested: [1] });
  assert.deepEqual(
    [sandbox.cpu, sandbox.memoryMb, sandbox.status, sandbox.metadata.a],
    [2, 512, "running", "b"],
  );
  const snapshot = Snapshot.fromApi(http, {
    id: "snap_1",
    name: null,
    created_at: "2026-01-01T00:00:00Z",
    sandbox_id: "sbx_1",
    template: "t",
    parent_id: null,
    size_bytes: 10,
    newer: true,
  });
  assert.equal(snapshot.info.newer, true);
  assert.equal(JSON.parse(JSON.stringify(snapshot)).newer, true);
  assert.equal(snapshot.createdAt.toISOString(), "2026-01-01T00:00:00.000Z");
  assert.deepEqual([snapshot.sizeBytes, snapshot.attachments, snapshot.parentId], [10, [], null]);
});

test("errors take their kind from the wire, else from the status; never from the message", () => {
  const timeout = errorFor(undefined, "no timeout here", "timeout");
  assert.ok(timeout instanceof TimeoutError);
  assert.deepEqual([timeout.kind, timeout.status], ["timeout", undefined]);
  const conflict = errorFor(500, "the sandbox timed out", "conflict");
  assert.ok(conflict instanceof ConflictError);
  assert.deepEqual([conflict.kind, conflict.status], ["conflict", 500]);
  // An older engine names no kind: the status decides; a stream's error without one is a
  // server error, whatever its message says.
  assert.ok(errorFor(404, "x") instanceof NotFoundError);
  assert.ok(errorFor(504, "x") instanceof TimeoutError);
  const stream = errorFor(undefined, "command timeout after 1 s");
  assert.ok(stream instanceof ServerError && !(stream instanceof TimeoutError));
  // A kind this SDK does not know (a newer engine): the status decides.
  assert.ok(errorFor(404, "x", "gone_fishing") instanceof NotFoundError);
  assert.equal(new NotFoundError("x").kind, "not_found");
  assert.equal(new SandforkError("x").kind, "server_error");
});

test("routes are the Python protocol's", () => {
  assert.equal(routes.sandbox("sbx 1", "exec/stream"), "/sandboxes/sbx%201/exec/stream");
  assert.equal(routes.context("s", "c", "run"), "/sandboxes/s/repl/sessions/c/run");
  assert.equal(routes.port("s", 8080), "/sandboxes/s/ports/8080/");
  assert.equal(
    routes.attachment("snap", "inventory.json"),
    "/snapshots/snap/attachments/inventory.json",
  );
  assert.throws(() => routes.sandbox("s", "nope"), TypeError);
});
