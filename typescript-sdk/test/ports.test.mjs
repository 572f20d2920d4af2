// A server started inside a sandbox answers at previewUrl(port), with the API key only.
import assert from "node:assert/strict";
import { after, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Sandbox } from "@sandfork/sdk";

import { TEMPLATE, assertNoneLeft, http } from "./support/engine.mjs";

after(assertNoneLeft);

/** Wait until the sandbox lists `port` (its server came up). */
async function listening(sandbox, port) {
  for (let tries = 0; !(await sandbox.ports()).includes(port); tries++) {
    assert.ok(tries < 600, `port ${port} never listened`); // a bound for a hang
    await sleep(200);
  }
}

test("previewUrl reaches a server in the sandbox, with the key and only with it", async () => {
  const sandbox = await Sandbox.create({ template: TEMPLATE, client: http });
  try {
    await sandbox.files.write("/tmp/site/index.html", "served from the sandbox");
    await sandbox.exec("cd /tmp/site && nohup python3 -m http.server 8000 >/dev/null 2>&1 &");
    await listening(sandbox, 8000);
    const url = await sandbox.previewUrl(8000);
    assert.equal(url, `${(await http.connect()).baseUrl}/v1/sandboxes/${sandbox.id}/ports/8000/`);
    const { apiKey } = await http.connect();
    const page = await fetch(`${url}index.html`, { headers: { Authorization: `Bearer ${apiKey}` } });
    assert.equal(page.status, 200);
    assert.equal(await page.text(), "served from the sandbox");
    assert.equal((await fetch(`${url}index.html`)).status, 401);
    await assert.rejects(sandbox.previewUrl(0), RangeError);
  } finally {
    await sandbox.kill();
  }
});
