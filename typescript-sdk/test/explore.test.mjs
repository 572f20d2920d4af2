// explore(): best-of-N over forks; promote(): the chosen fork takes over.
import assert from "node:assert/strict";
import { after, test } from "node:test";

import { BadRequestError, Sandbox, explore } from "@sandfork/sdk";

import {
  TEMPLATE,
  assertGone,
  assertNoneLeft,
  http,
  killAll,
  ourSandboxes,
} from "./support/engine.mjs";

after(assertNoneLeft);

test("explore runs three candidates in forks, keeps the best and kills the rest", async () => {
  const base = await Sandbox.create({ template: TEMPLATE });
  let winner;
  try {
    await base.files.write("/root/n.txt", "10");
    const candidates = [
      "expr $(cat /root/n.txt) + 1", // 11
      "expr $(cat /root/n.txt) \\* 3", // 30: the best
      "echo broken >&2; exit 1", // disqualified
    ];
    const result = await explore(base, candidates, {
      scoreFn: (outcome) => (outcome.exitCode === 0 ? Number(outcome.stdout) : null),
    });
    winner = result.winner.sandbox;
    assert.equal(result.winner.index, 1);
    assert.equal(result.winner.candidate, candidates[1]);
    assert.equal(result.winner.score, 30);
    assert.equal(result.winner.outcome.stdout, "30\n");
    assert.match(result.reason, /#1 scored 30, beating #0 \(11\), #2 \(disqualified/);
    assert.deepEqual(
      result.candidates.map((c) => [c.index, c.score, c.killed]),
      [
        [0, 11, true],
        [1, 30, false],
        [2, null, true],
      ],
    );
    for (const loser of result.candidates.filter((c) => c.killed)) {
      await assertGone(loser.sandboxId);
    }
    assert.deepEqual((await ourSandboxes()).sort(), [base.id, winner.id].sort());
    // The winning fork is a live copy of the base, state included.
    assert.equal(await winner.files.read("/root/n.txt"), "10");
    assert.equal(winner.metadata.fork_parent_id, base.id);

    // promote(): the winner takes over, its parent is killed.
    const promoted = await winner.promote();
    assert.deepEqual(promoted.killed, [base.id]);
    await assertGone(base.id);
    assert.equal(winner.metadata.promoted_from, base.id);
    assert.equal(winner.metadata.fork_parent_id, undefined);
    assert.equal((await Sandbox.get(winner.id, { client: http })).metadata.promoted_from, base.id);
    await assert.rejects(
      winner.promote(),
      (e) => e instanceof BadRequestError && /not a fork child/.test(e.message),
    );
  } finally {
    await killAll(winner, base);
  }
});

test("explore with code candidates, and with no candidate, on the method form", async () => {
  const base = await Sandbox.create({ template: TEMPLATE });
  let winner;
  try {
    await (await base.createCodeContext()).runCode("data = [3, 1, 2]");
    const result = await base.explore(
      [{ code: "sorted(data)" }, { code: "list(reversed(sorted(data)))" }],
      { scoreFn: (outcome) => (outcome.text === "[3, 2, 1]" ? 1 : 0) },
    );
    winner = result.winner.sandbox;
    assert.equal(result.winner.index, 1);
    await assertGone(result.candidates[0].sandboxId);
    await assert.rejects(
      base.explore([], { scoreFn: () => 1 }),
      (e) => e instanceof BadRequestError && /count must be/.test(e.message),
    );
  } finally {
    await killAll(winner, base);
  }
});
