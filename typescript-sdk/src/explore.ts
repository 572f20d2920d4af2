/**
 * `explore`: best-of-N over copy-on-write forks. Each candidate (a shell command, or code
 * for the default code context) runs in its own fork of the sandbox, all at once; the score
 * function rates each outcome; the best-scored fork is kept and every other one is killed.
 */

import { SandforkError } from "./errors.js";
import type { ExecResult, Execution } from "./models.js";

/**
 * What `explore` needs of a fork: a `Sandbox` is one. (The Sandbox is not imported here:
 * `sandbox.ts` imports this module for `sandbox.explore()`, and modules do not import in
 * circles.)
 */
export interface ExploreFork {
  readonly id: string;
  exec(cmd: string, options?: { timeoutSeconds?: number }): Promise<ExecResult>;
  createCodeContext(): Promise<{
    runCode(code: string, options?: { timeoutSeconds?: number }): Promise<Execution>;
  }>;
  kill(): Promise<void>;
}

/** What `explore` forks: a `Sandbox`, whose forks are `Sandbox`es. */
export interface Explorable<S extends ExploreFork> {
  forkTree(options: { count: number; metadata?: Record<string, string> }): Promise<S[]>;
}

/** A candidate: a shell command, `{cmd}`, or Python code for the default context, `{code}`. */
export type Candidate =
  | string
  | { cmd: string; timeoutSeconds?: number }
  | { code: string; timeoutSeconds?: number };

/** What a candidate produced: an `ExecResult` for a command, an `Execution` for code. */
export type Outcome = ExecResult | Execution;

/** Rates an outcome; higher wins. `null`, `undefined`, NaN or a throw disqualify it. */
export type ScoreFn<T, S extends ExploreFork = ExploreFork> = (
  outcome: Outcome,
  candidate: T,
  fork: S,
) => number | null | undefined | Promise<number | null | undefined>;

/** Options of `explore`. */
export interface ExploreOptions<T, S extends ExploreFork = ExploreFork> {
  scoreFn: ScoreFn<T, S>;
  /** Metadata for every fork. */
  metadata?: Record<string, string>;
}

/** How one candidate fared. */
export interface CandidateReport<T> {
  index: number;
  candidate: T;
  sandboxId: string;
  outcome?: Outcome;
  score: number | null;
  /** Why it was disqualified: its call failed or could not be scored. */
  error?: string;
  /** True for every loser: its fork was killed. */
  killed: boolean;
}

/** The winner of `explore` (its fork is alive) and every candidate's report. */
export interface ExploreResult<T, S extends ExploreFork = ExploreFork> {
  winner: { index: number; candidate: T; sandbox: S; outcome: Outcome; score: number };
  candidates: CandidateReport<T>[];
  /** Why the winner won, in words. */
  reason: string;
}

async function runCandidate(fork: ExploreFork, candidate: Candidate): Promise<Outcome> {
  if (typeof candidate === "string") return fork.exec(candidate);
  const timeoutSeconds = candidate.timeoutSeconds;
  if ("cmd" in candidate) return fork.exec(candidate.cmd, { timeoutSeconds });
  const ctx = await fork.createCodeContext();
  return ctx.runCode(candidate.code, { timeoutSeconds });
}

async function rate<T extends Candidate, S extends ExploreFork>(
  index: number,
  candidate: T,
  fork: S,
  scoreFn: ScoreFn<T, S>,
): Promise<CandidateReport<T>> {
  const report: CandidateReport<T> = {
    index,
    candidate,
    sandboxId: fork.id,
    score: null,
    killed: false,
  };
  try {
    report.outcome = await runCandidate(fork, candidate);
    const score = await scoreFn(report.outcome, candidate, fork);
    if (typeof score === "number" && !Number.isNaN(score)) report.score = score;
    else report.error = `the score function gave ${String(score)}`;
  } catch (e) {
    report.error = `${(e as Error).name}: ${(e as Error).message}`;
  }
  return report;
}

/** The best-scored report (ties: the lowest index), or undefined when none was scored. */
export function pickWinner<T>(reports: CandidateReport<T>[]): CandidateReport<T> | undefined {
  let best: CandidateReport<T> | undefined;
  for (const r of reports) {
    if (r.score !== null && (best === undefined || r.score > (best.score as number))) best = r;
  }
  return best;
}

/** A sentence saying why `winner` won over the others. */
export function explain<T>(winner: CandidateReport<T>, reports: CandidateReport<T>[]): string {
  const others = reports
    .filter((r) => r !== winner)
    .map((r) =>
      r.score === null ? `#${r.index} (disqualified: ${r.error})` : `#${r.index} (${r.score})`,
    );
  const beat = others.length ? `, beating ${others.join(", ")}` : ", the only candidate";
  return `candidate #${winner.index} scored ${winner.score}${beat}`;
}

/**
 * Run each candidate in its own fork of `sandbox` (forked together, from one capture), score
 * every outcome, keep the best fork and kill the others. `sandbox` runs on untouched; call
 * `result.winner.sandbox.promote()` to make the winner replace it. If no candidate can be
 * scored, every fork is killed and a `SandforkError` lists why.
 */
export async function explore<T extends Candidate, S extends ExploreFork>(
  sandbox: Explorable<S>,
  candidates: T[],
  options: ExploreOptions<T, S>,
): Promise<ExploreResult<T, S>> {
  const forks = await sandbox.forkTree({ count: candidates.length, metadata: options.metadata });
  let keep: S | undefined;
  try {
    const reports = await Promise.all(
      candidates.map((c, i) => rate(i, c, forks[i], options.scoreFn)),
    );
    const best = pickWinner(reports);
    if (best === undefined) {
      const why = reports.map((r) => `#${r.index}: ${r.error}`).join("; ");
      throw new SandforkError(`explore: no candidate could be scored (${why})`);
    }
    keep = forks[best.index];
    for (const r of reports) r.killed = r !== best;
    return {
      winner: {
        index: best.index,
        candidate: best.candidate,
        sandbox: keep,
        outcome: best.outcome as Outcome,
        score: best.score as number,
      },
      candidates: reports,
      reason: explain(best, reports),
    };
  } finally {
    await Promise.all(forks.filter((f) => f !== keep).map((f) => f.kill()));
  }
}
