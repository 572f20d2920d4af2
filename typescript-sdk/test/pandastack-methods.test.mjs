// Every method of the published @pandastack/sdk against the engine: one row per method. A row
// runs here, or names the test of pandastack.test.mjs that asserts it, or says why it is not
// run; what the engine does not serve asserts its 501 ("not served by Sandfork", listed in the
// README; a hosted service's methods with made-up arguments). The first test fails when the
// SDK has a method no row names.
import assert from "node:assert/strict";
import { mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Client, CodeContext, NotFoundError, Sandbox, ServerError } from "@pandastack/sdk";

const { SANDFORK_API, SANDFORK_API_KEY } = process.env;
assert.ok(SANDFORK_API && SANDFORK_API_KEY, "run with SANDFORK_API and SANDFORK_API_KEY");
const TEMPLATE = "code-interpreter";
const client = new Client({ apiUrl: SANDFORK_API, apiKey: SANDFORK_API_KEY, timeoutMs: 300_000 });
const COMPAT = "pandastack.test.mjs: ";
const SERVICES = ["apps", "databases", "functions", "schedules", "volumes", "tokens"];

/** The own methods of a prototype (or a class's statics), private ones left out. */
function methodsOf(object, prefix, skip = []) {
  return Object.getOwnPropertyNames(object)
    .filter((name) => !["constructor", "length", "name", "prototype", ...skip].includes(name))
    .filter((name) => !name.startsWith("_"))
    .filter((name) => typeof Object.getOwnPropertyDescriptor(object, name).value === "function")
    .map((name) => `${prefix}.${name}`);
}

/** A row expecting the engine's 501 for what `call` sends. The SDK's few calls that fetch
 * by themselves throw a plain Error with the status (getCode) or the body (deployBundle). */
function notServed(call) {
  return async (h) => {
    await assert.rejects(
      async () => {
        const result = await call(h);
        if (result && typeof result[Symbol.asyncIterator] === "function") {
          for await (const _ of result) break;
        }
      },
      (e) =>
        (e instanceof ServerError && /not served by Sandfork/.test(e.message)) ||
        /(: 501$|\(501\): .*not served by Sandfork)/.test(e.message),
    );
  };
}

/** A 501 row for a method of a hosted service, its arguments made up. */
function serviceCall(service, method) {
  const special = { "functions.deploy": [{ name: "x1", runtime: "python", code: "print(1)" }] };
  return notServed(() => {
    const api = client[service];
    const args = special[`${service}.${method}`] ?? Array.from({ length: api[method].length }, () => "x1");
    return api[method](...args);
  });
}

let here; // { sandbox, tmp }

const files = async ({ sandbox, tmp }) => {
  const fs = sandbox.filesystem;
  await fs.write("/tmp/rows/a.txt", "alpha");
  assert.equal(String(await fs.read("/tmp/rows/a.txt")), "alpha");
  assert.ok(await fs.exists("/tmp/rows/a.txt"));
  assert.ok(!(await fs.exists("/tmp/rows/none")));
  assert.equal((await fs.stat("/tmp/rows/a.txt")).size, 5);
  assert.deepEqual((await fs.list("/tmp/rows")).map((e) => e.name), ["a.txt"]);
  const walked = [];
  for await (const { dir, files: found } of fs.walk("/tmp/rows")) {
    walked.push([dir, found.map((f) => f.name)]);
  }
  assert.deepEqual(walked, [["/tmp/rows", ["a.txt"]]]);
  await writeFile(join(tmp, "up.txt"), "uploaded");
  await fs.upload(join(tmp, "up.txt"), "/tmp/rows/up.txt");
  await fs.download("/tmp/rows/up.txt", join(tmp, "down.txt"));
  assert.equal(await readFile(join(tmp, "down.txt"), "utf8"), "uploaded");
};

const context = async ({ sandbox }) => {
  const ctx = await sandbox.createCodeContext();
  assert.ok(ctx instanceof CodeContext);
  await ctx.runCode("kept = 5");
  assert.equal((await ctx.runCode("kept + 1")).text, "6");
  await ctx.close();
};

const lookups = async ({ sandbox }) => {
  assert.equal((await Sandbox.get(sandbox.id, client)).id, sandbox.id);
  assert.ok((await Sandbox.list(client)).some((s) => s.id === sandbox.id));
  assert.equal(Sandbox.fromInfo({ id: sandbox.id, status: "running" }, client).id, sandbox.id);
};

const copies = async ({ sandbox }) => {
  await sandbox.exec("echo copied > /tmp/copied.txt");
  const snapshot = await sandbox.snapshot();
  assert.match(snapshot.id, /^snap_/);
  const fork = await sandbox.fork();
  const tree = await sandbox.forkTree({ count: 2 });
  try {
    assert.equal(tree.length, 2);
    for (const copy of [fork, ...tree]) {
      assert.equal((await copy.exec("cat /tmp/copied.txt")).stdout, "copied\n");
    }
    await fork.hibernate();
    await fork.wake();
    assert.equal((await fork.exec("cat /tmp/copied.txt")).stdout, "copied\n");
  } finally {
    for (const copy of [fork, ...tree]) await copy.kill();
    await client.snapshots.delete(snapshot.id);
  }
};

const sandboxesApi = async () => {
  const made = await client.sandboxes.create({ template: TEMPLATE });
  assert.equal((await client.sandboxes.get(made.id)).id, made.id);
  assert.ok((await client.sandboxes.list()).some((s) => s.id === made.id));
  await client.sandboxes.delete(made.id);
  await assert.rejects(client.sandboxes.get(made.id), NotFoundError);
};

const snapshotsApi = async ({ sandbox }) => {
  const { id } = await sandbox.snapshot();
  assert.equal((await client.snapshots.get(id)).id, id);
  assert.ok((await client.snapshots.list()).some((s) => s.id === id));
  await client.snapshots.delete(id);
  assert.ok(!(await client.snapshots.list()).some((s) => s.id === id));
};

const templatesRead = async () => {
  assert.ok((await client.templates.list()).some((t) => t.name === TEMPLATE));
  assert.equal((await client.templates.get(TEMPLATE)).name, TEMPLATE);
};

const ROWS = {
  "Sandbox.create": async () => {
    const made = await Sandbox.create({ template: TEMPLATE, metadata: { row: "create" } }, client);
    assert.equal(made.status, "running");
    await made.kill();
    await assert.rejects(Sandbox.get(made.id, client), NotFoundError);
  },
  "Sandbox.kill": "Sandbox.create",
  "Sandbox.list": lookups,
  "Sandbox.get": lookups,
  "Sandbox.fromInfo": lookups,
  "Sandbox.exec": async ({ sandbox }) => {
    const result = await sandbox.exec("echo out; echo err >&2; exit 3");
    assert.deepEqual([result.stdout, result.stderr, result.exit_code], ["out\n", "err\n", 3]);
  },
  "Sandbox.execStream": async ({ sandbox }) => {
    const out = [];
    const err = [];
    const code = await sandbox.execStream("echo one; echo two >&2; exit 4", {
      onStdout: (c) => out.push(c),
      onStderr: (c) => err.push(c),
    });
    assert.deepEqual([code, out.join(""), err.join("")], [4, "one\n", "two\n"]);
  },
  "Sandbox.runCode": async ({ sandbox }) => {
    assert.equal((await sandbox.runCode("print(6 * 7)", "python")).stdout, "42\n");
    assert.equal((await sandbox.runCode("echo $((6 * 7))")).stdout, "42\n");
  },
  "Sandbox.createCodeContext": context,
  "CodeContext.runCode": context,
  "CodeContext.close": context,
  "Sandbox.logs": `${COMPAT}logs (not followed): the sandbox's console lines, its egress session among them`,
  "Sandbox.pause": `${COMPAT}pause freezes the sandbox in place, resume lets it go on with its state`,
  "Sandbox.resume": "Sandbox.pause",
  "Sandbox.snapshot": copies,
  "Sandbox.fork": copies,
  "Sandbox.forkTree": copies,
  "Sandbox.hibernate": copies,
  "Sandbox.wake": copies,
  "Sandbox.promote": `${COMPAT}explore: the winner is promoted, the losers are reaped, the parent goes on`,
  "Sandbox.explore": "Sandbox.promote",
  "Sandbox.setTtl": `${COMPAT}lifecycle: setTtl and setPersistent answer the sandbox's lifecycle`,
  "Sandbox.setPersistent": "Sandbox.setTtl",
  "Sandbox.lifecycle": "Sandbox.setTtl",
  "Sandbox.previewUrl": `${COMPAT}previewUrls: the ports a server listens on in the sandbox, one URL each`,
  "Sandbox.previewUrls": "Sandbox.previewUrl",
  "Filesystem.read": files,
  "Filesystem.write": files,
  "Filesystem.upload": files,
  "Filesystem.download": files,
  "Filesystem.list": files,
  "Filesystem.stat": files,
  "Filesystem.exists": files,
  "Filesystem.walk": files,
  "Commands.run": async ({ sandbox }) => {
    assert.equal((await sandbox.commands.run("echo ran")).stdout, "ran\n");
  },
  "Client.request": lookups, // what every call above goes through
  "Client.me": notServed(() => client.me()),
  "sandboxes.create": sandboxesApi,
  "sandboxes.list": sandboxesApi,
  "sandboxes.get": sandboxesApi,
  "sandboxes.delete": sandboxesApi,
  "snapshots.list": snapshotsApi,
  "snapshots.get": snapshotsApi,
  "snapshots.delete": snapshotsApi,
  "templates.list": templatesRead,
  "templates.get": templatesRead,
  "templates.build": notServed(({ tmp }) => client.templates.build({ name: "t", rootfsTar: join(tmp, "up.txt") })),
  "templates.register": notServed(() => client.templates.register({ name: "t", imageRef: "img:1" })),
  "templates.buildFromDockerfile": notServed(() =>
    client.templates.buildFromDockerfile({ name: "t", dockerfile: "FROM scratch\n" }),
  ),
  "templates.delete": notServed(() => client.templates.delete(TEMPLATE)),
  "templates.builds": notServed(() => client.templates.builds()),
  "templates.buildStatus": notServed(() => client.templates.buildStatus("b1")),
  "templates.buildLogs": notServed(() => client.templates.buildLogs("b1")),
  "templates.waitForBuild": notServed(() => client.templates.waitForBuild("b1")),
  ...Object.fromEntries(
    SERVICES.flatMap((s) =>
      methodsOf(Object.getPrototypeOf(client[s]), s).map((name) => [
        name,
        serviceCall(s, name.split(".")[1]),
      ]),
    ),
  ),
};

test("the table has a row for every method of the SDK", () => {
  const probe = Sandbox.fromInfo({ id: "sbx_0", status: "running" }, client);
  const methods = [
    ...methodsOf(Sandbox.prototype, "Sandbox"),
    ...methodsOf(Sandbox, "Sandbox"),
    ...methodsOf(CodeContext.prototype, "CodeContext"),
    ...methodsOf(Object.getPrototypeOf(probe.filesystem), "Filesystem"),
    ...methodsOf(Object.getPrototypeOf(probe.commands), "Commands"),
    ...methodsOf(Client.prototype, "Client"),
    ...["sandboxes", "snapshots", "templates", ...SERVICES].flatMap((n) =>
      methodsOf(Object.getPrototypeOf(client[n]), n),
    ),
  ];
  assert.deepEqual(Object.keys(ROWS).toSorted(), methods.toSorted());
  for (const [name, row] of Object.entries(ROWS)) {
    if (typeof row === "string" && !row.startsWith(COMPAT)) assert.ok(row in ROWS, name);
  }
});

before(async () => {
  here = {
    sandbox: await Sandbox.create({ template: TEMPLATE }, client),
    tmp: await mkdtemp(join(tmpdir(), "pandastack-rows-")),
  };
  await writeFile(join(here.tmp, "up.txt"), "uploaded");
});

after(async () => {
  await here?.sandbox.kill();
});

const run = new Set();
for (const [name, row] of Object.entries(ROWS)) {
  if (typeof row !== "function" || run.has(row)) continue;
  run.add(row);
  test(`row ${name}`, async () => row(here));
}
