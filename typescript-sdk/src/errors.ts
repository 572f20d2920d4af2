/**
 * Errors of the Sandfork SDK; each carries the engine's message, its HTTP `status` (when
 * there was one) and its `kind`, as the wire names it (`sandfork.protocol.errors`).
 *
 * A failure answer of the engine is `{"error": message, "kind": kind}`, an exec stream's
 * `error` event too: the SDK raises the class of that kind (`errorFor`). The kind is never
 * guessed from the message; an answer without one (an older engine, a proxy in between) is
 * classed by its HTTP status.
 */

import type { ErrorKind } from "./wire.js";

/**
 * Base of every SDK error. `status` is the engine's HTTP status, when there was one (none
 * for a stream's error event, whose answer was a 200); `kind` is the error's `ErrorKind`
 * (`"server_error"` for the SDK's own errors, as in the Python SDK).
 */
export class SandforkError extends Error {
  readonly status?: number;
  readonly kind: ErrorKind;

  constructor(message: string, status?: number, kind?: ErrorKind) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.kind = kind ?? KIND_OF_CLASS.get(new.target) ?? "server_error";
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

/**
 * A command or cell ran past its timeout and was stopped, or the sandbox did not answer in
 * time (504, or a stream's error event of kind `timeout`).
 */
export class TimeoutError extends SandforkError {}

/** The engine failed (5xx). */
export class ServerError extends SandforkError {}

/** No engine answered: none is configured or running, or the connection failed. */
export class EngineUnreachable extends SandforkError {}

type ErrorClass = new (message: string, status?: number, kind?: ErrorKind) => SandforkError;

/** The SDK's error class of each kind of the wire (every `ErrorKind`: tsc checks it). */
export const ERROR_CLASSES: Readonly<Record<ErrorKind, ErrorClass>> = {
  auth: AuthError,
  bad_request: BadRequestError,
  not_found: NotFoundError,
  conflict: ConflictError,
  limit_exceeded: LimitExceeded,
  timeout: TimeoutError,
  server_error: ServerError,
  unreachable: EngineUnreachable,
};

const KIND_OF_CLASS = new Map<Function, ErrorKind>(
  Object.entries(ERROR_CLASSES).map(([kind, cls]) => [cls, kind as ErrorKind]),
);

/**
 * The kind an answer of this HTTP status has when it names none (others: a 4xx is a bad
 * request, a 5xx a server error), as `sandfork.protocol.errors.STATUS_KINDS`.
 */
export const STATUS_KINDS: Readonly<Record<number, ErrorKind>> = {
  400: "bad_request",
  401: "auth",
  404: "not_found",
  409: "conflict",
  429: "limit_exceeded",
  500: "server_error",
  502: "unreachable",
  504: "timeout",
};

function isKind(kind: unknown): kind is ErrorKind {
  return typeof kind === "string" && Object.hasOwn(ERROR_CLASSES, kind);
}

/**
 * The error kind of a failure: the one it names, else the one of its HTTP status, else (a
 * kind this SDK does not know, and no status) `"server_error"`.
 */
export function kindOf(status: number | undefined, kind?: unknown): ErrorKind {
  if (isKind(kind)) return kind;
  if (status === undefined) return "server_error";
  return STATUS_KINDS[status] ?? (status >= 500 ? "server_error" : "bad_request");
}

/**
 * The error for an engine's failure: its message, its HTTP status (none for a stream's
 * error event) and the kind it names (when it names one).
 */
export function errorFor(
  status: number | undefined,
  message: string,
  kind?: unknown,
): SandforkError {
  const known = kindOf(status, kind);
  return new ERROR_CLASSES[known](message, status, known);
}

/** The error of an engine's failure answer with this HTTP status and no kind. */
export function errorForStatus(status: number, message: string): SandforkError {
  return errorFor(status, message);
}

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
