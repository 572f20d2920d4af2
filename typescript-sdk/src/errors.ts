/** Errors of the Sandfork SDK; each carries the engine's message. */

/** Base of every SDK error. `status` is the engine's HTTP status, when there was one. */
export class SandforkError extends Error {
  readonly status?: number;

  constructor(message: string, status?: number) {
    super(message);
    this.name = new.target.name;
    this.status = status;
  }
}

/** The engine refused the API key (401). */
export class AuthError extends SandforkError {}

/** The engine rejected the request: a bad field, count or name (400 and other 4xx). */
export class BadRequestError extends SandforkError {}

/** The engine is at one of its limits: sandboxes, memory, scratch RAM, snapshot quota (429). */
export class LimitExceeded extends BadRequestError {}

/** The sandbox, snapshot, checkpoint, context or file does not exist (404). */
export class NotFoundError extends SandforkError {}

/** The sandbox cannot do this now, e.g. it is dead (409). */
export class ConflictError extends SandforkError {}

/** A command or cell ran past its timeout and was stopped (504, or a stream's timeout). */
export class TimeoutError extends SandforkError {}

/** The engine failed (5xx). */
export class ServerError extends SandforkError {}

/** `exec(..., {check: true})` (or a workflow step) saw a non-zero exit code. */
export class CommandFailed extends SandforkError {
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;

  constructor(cmd: string, result: { exitCode: number; stdout: string; stderr: string }) {
    super(`command exited with code ${result.exitCode}: ${cmd}`);
    this.exitCode = result.exitCode;
    this.stdout = result.stdout;
    this.stderr = result.stderr;
  }
}

/**
 * A resumed sandbox was asked, at a sequence number its replay cache covers, for a call
 * other than the one the original sandbox made there.
 */
export class ReplayMismatch extends SandforkError {
  readonly seq: number;
  readonly expected: Record<string, unknown>;
  readonly got: Record<string, unknown>;

  constructor(seq: number, expected: Record<string, unknown>, got: Record<string, unknown>) {
    super(
      `call #${seq} differs from the ledger: it recorded ${JSON.stringify(expected)}, ` +
        `this call is ${JSON.stringify(got)}`,
    );
    this.seq = seq;
    this.expected = expected;
    this.got = got;
  }
}

const BY_STATUS: Record<number, new (message: string, status?: number) => SandforkError> = {
  401: AuthError,
  404: NotFoundError,
  409: ConflictError,
  429: LimitExceeded,
  504: TimeoutError,
};

/** The error of an engine's failure answer with this HTTP status, as the Python SDK maps it. */
export function errorForStatus(status: number, message: string): SandforkError {
  const kind = BY_STATUS[status] ?? (status >= 500 ? ServerError : BadRequestError);
  return new kind(message, status);
}
