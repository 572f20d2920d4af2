/** Results returned by the SDK: exec results, code executions with rich outputs, snapshots. */

/** The outcome of a shell command. `seq` is its number in the sandbox's ledger. */
export interface ExecResult {
  stdout: string;
  stderr: string;
  exitCode: number;
  durationMs: number;
  truncated: boolean;
  seq?: number;
  /** True when a resumed sandbox answered the call from its replay cache. */
  replayed: boolean;
}

/** The engine's JSON result of an exec. */
export interface ApiExecResult {
  stdout?: string;
  stderr?: string;
  exit_code?: number;
  duration_ms?: number;
  truncated?: boolean;
  seq?: number;
}

/** An `ExecResult` from the engine's JSON. */
export function execResult(data: ApiExecResult, replayed = false): ExecResult {
  return {
    stdout: data.stdout ?? "",
    stderr: data.stderr ?? "",
    exitCode: Number(data.exit_code ?? 0),
    durationMs: Number(data.duration_ms ?? 0),
    truncated: Boolean(data.truncated),
    seq: data.seq,
    replayed,
  };
}

/** One MIME representation of an output (`type` is the MIME type). */
export interface Result {
  type: string;
  data: string;
  isMainResult: boolean;
}

/** The exception a cell raised. */
export interface ExecutionError {
  name: string;
  value: string;
  traceback: string[];
}

/** What running a cell produced: its results (text, png, html, json…), streams and error. */
export class Execution {
  constructor(
    readonly results: Result[],
    readonly stdout: string,
    readonly stderr: string,
    readonly error: ExecutionError | null,
    readonly executionCount: number | null,
    readonly durationMs: number,
    readonly seq?: number,
    readonly replayed = false,
  ) {}

  /** An `Execution` from the engine's JSON. */
  static fromApi(data: Record<string, any>, replayed = false): Execution {
    const results = (data.results ?? []).map((r: Record<string, unknown>) => ({
      type: String(r.type),
      data: String(r.data),
      isMainResult: Boolean(r.is_main_result),
    }));
    const error = data.error
      ? { name: data.error.name, value: data.error.value, traceback: [...data.error.traceback] }
      : null;
    return new Execution(
      results,
      data.stdout ?? "",
      data.stderr ?? "",
      error,
      data.execution_count ?? null,
      Number(data.duration_ms ?? 0),
      data.seq,
      replayed,
    );
  }

  private first(mime: string): string | undefined {
    const main = this.results.find((r) => r.type === mime && r.isMainResult);
    return (main ?? this.results.find((r) => r.type === mime))?.data;
  }

  /** The plain-text form of the cell's value (or first output), if any. */
  get text(): string | undefined {
    return this.first("text/plain");
  }

  /** The first PNG image (base64), e.g. a matplotlib figure. */
  get png(): string | undefined {
    return this.first("image/png");
  }

  /** The first HTML output, e.g. a pandas table. */
  get html(): string | undefined {
    return this.first("text/html");
  }

  /** The first JSON output, parsed. */
  get json(): unknown {
    const data = this.first("application/json");
    if (data === undefined) return undefined;
    try {
      return JSON.parse(data);
    } catch {
      return data;
    }
  }
}

/** An immutable capture of a sandbox; restore it with `Sandbox.create({fromSnapshot: id})`. */
export interface SnapshotInfo {
  id: string;
  name: string | null;
  sizeBytes: number;
  createdAt: Date;
  sandboxId: string;
  template: string;
  parentId: string | null;
  contexts: string[];
  metadata: Record<string, string>;
  /** Names of the files stored with the snapshot (`inventory.json`: its variable inventory). */
  attachments: string[];
}

/** A `SnapshotInfo` from the engine's JSON. */
export function snapshotInfo(data: Record<string, any>): SnapshotInfo {
  return {
    id: data.id,
    name: data.name ?? null,
    sizeBytes: Number(data.size_bytes ?? 0),
    createdAt: new Date(data.created_at),
    sandboxId: data.sandbox_id,
    template: data.template,
    parentId: data.parent_id ?? null,
    contexts: [...(data.contexts ?? [])],
    metadata: { ...(data.metadata ?? {}) },
    attachments: [...(data.attachments ?? [])],
  };
}

/** A directory entry of `files.list`. */
export interface FileEntry {
  name: string;
  path?: string;
  type?: string;
  size?: number;
  [key: string]: unknown;
}
