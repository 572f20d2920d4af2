/**
 * Results returned by the SDK: exec results, code executions with rich outputs; and the
 * types that tie the SDK's handles to the wire models of `wire.ts`.
 */

/**
 * A wire model's JSON object as the engine sent it: the fields `wire.ts` knows, typed, and
 * every other one it carried (an engine newer than this SDK), kept as they came.
 */
export type WireObject<T> = T & Record<string, unknown>;

/** `memory_mb` → `memoryMb`: a wire key as the SDK's handles name it. */
export type CamelCase<S extends string> = S extends `${infer Head}_${infer Tail}`
  ? `${Head}${Capitalize<CamelCase<Tail>>}`
  : S;

/** The fields of wire model `W` under their camelCase names, each present (a default fills
 * an optional one). */
export type CamelFields<W> = {
  [K in keyof W & string as CamelCase<K>]-?: Exclude<W[K], undefined>;
};

/**
 * What a handle that `implements WireFields<W, K, Override>` promises: the fields `K` of the
 * wire model `W` (camelCase), each of the wire's type unless `Override` gives another (a
 * `Date` for a time). tsc fails when `K` names a field the schema does not have, or when the
 * handle's type of one is not the schema's: the compile-time check of the SDK against
 * `wire-schema.json`. A field the SDK does not name is still in the handle's `info`.
 */
export type WireFields<
  W,
  K extends keyof CamelFields<W>,
  Override extends { [P in K]?: unknown } = {},
> = {
  readonly [P in K]: P extends keyof Override ? Override[P] : CamelFields<W>[P];
};

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

/** A directory entry of `files.list`. */
export interface FileEntry {
  name: string;
  path?: string;
  type?: string;
  size?: number;
  [key: string]: unknown;
}
