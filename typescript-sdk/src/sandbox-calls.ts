/**
 * What the calls of a `Sandbox` take and give besides the sandbox itself: their options, the
 * exec body every SDK builds the same way, and the streamed exec's events.
 */

import { SandforkError, errorFor } from "./errors.js";
import { type ClientOption, serverSentEvents } from "./http.js";
import type { ApiExecResult } from "./models.js";

/** Options of `Sandbox.create`. */
export interface CreateOptions extends ClientOption {
  template?: string;
  fromSnapshot?: string;
  memoryMb?: number;
  cpu?: number;
  metadata?: Record<string, string>;
  persistent?: boolean;
  /** What runs it: "vm" or "container" (default: the engine's choice). */
  backend?: "vm" | "container";
}

/** Options of `exec`. */
export interface ExecOptions {
  timeoutSeconds?: number;
  /** Throw `CommandFailed` on a non-zero exit code. */
  check?: boolean;
  env?: Record<string, string>;
  cwd?: string;
}

/** Options of `execStream`: `exec`'s, plus callbacks for output as it arrives. */
export interface ExecStreamOptions extends Omit<ExecOptions, "check"> {
  onStdout?: (chunk: string) => void;
  onStderr?: (chunk: string) => void;
}

/** Options of `fork` and `forkTree`. */
export interface ForkOptions {
  metadata?: Record<string, string>;
  /** Reseed `random` and NumPy's global generator in each copy. */
  reseedPython?: boolean;
}

/** A checkpoint: a snapshot marked in the sandbox's ledger after call `seq`. */
export interface CheckpointInfo {
  snapshotId: string;
  seq: number;
  name: string | null;
  createdAt: Date;
}

/** What `promote` did. */
export interface PromoteResult {
  /** The sandboxes it killed: the parent (unless kept) and, if asked, the siblings. */
  killed: string[];
}

/** The request body of an exec, the same from every SDK (the ledger compares bodies). */
export function execBody(cmd: string, options: ExecOptions = {}): Record<string, unknown> {
  const body: Record<string, unknown> = { cmd };
  if (options.timeoutSeconds !== undefined) body.timeout_seconds = options.timeoutSeconds;
  if (options.env && Object.keys(options.env).length) body.env = options.env;
  if (options.cwd) body.cwd = options.cwd;
  return body;
}

/** Options of `snapshot`. */
export interface SnapshotOptions {
  name?: string;
  /** Tags of the snapshot (`Snapshot.list({metadata})` finds it by them). */
  metadata?: Record<string, string>;
}

/** Relay a streamed exec's output to the callbacks; resolve to its `exit` event. */
export async function relayStream(
  response: Response,
  onStdout?: (chunk: string) => void,
  onStderr?: (chunk: string) => void,
): Promise<ApiExecResult> {
  for await (const { event, data } of serverSentEvents(response)) {
    if (event === "stdout") onStdout?.(String(data.chunk));
    else if (event === "stderr") onStderr?.(String(data.chunk));
    else if (event === "exit") return data as ApiExecResult;
    else if (event === "error") {
      // The kind is on the wire; a stream has no HTTP status of a failure (its answer was a
      // 200): an older engine's event without a kind is a server error.
      throw errorFor(undefined, String(data.error), data.kind);
    }
  }
  throw new SandforkError("the exec stream ended without an exit code; the outcome is unknown");
}

