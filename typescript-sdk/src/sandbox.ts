/**
 * `Sandbox`: the SDK's handle on one sandbox (document 000's surface, plus the ledger), and
 * its code contexts.
 */

import { CommandFailed } from "./errors.js";
import { type ClientOption, type Http, httpOf } from "./http.js";
import { Files } from "./files.js";
import {
  type ApiExecResult,
  type ExecResult,
  Execution,
  type WireObject,
  execResult,
} from "./models.js";
import { type LedgerEntry, ReplayCache } from "./replay.js";
import { type Candidate, type ExploreOptions, type ExploreResult, explore } from "./explore.js";
import * as routes from "./routes.js";
import { Snapshot } from "./snapshot.js";
import { DEFAULT_TEMPLATE, type SandboxInfo } from "./wire.js";
import { SandboxView } from "./sandbox-view.js";
import {
  type CheckpointInfo,
  type CreateOptions,
  type ExecOptions,
  type ExecStreamOptions,
  type ForkOptions,
  type PromoteResult,
  type SnapshotOptions,
  execBody,
  relayStream,
} from "./sandbox-calls.js";

export type {
  CheckpointInfo,
  CreateOptions,
  ExecOptions,
  ExecStreamOptions,
  ForkOptions,
  PromoteResult,
  SnapshotOptions,
} from "./sandbox-calls.js";
export { execBody } from "./sandbox-calls.js";

/**
 * A sandbox: a VM or a container with a guest agent and Jupyter kernels inside.
 *
 * `info` is the engine's JSON object of it as last seen (created, fetched, refreshed,
 * hibernated…): every field the engine sent, those this SDK does not know yet too. The
 * camelCase fields read from it.
 */
export class Sandbox extends SandboxView {
  readonly files: Files;
  replay = new ReplayCache();

  private constructor(
    readonly client: Http,
    info: SandboxInfo,
  ) {
    super(info);
    this.files = new Files(client, info.id);
  }

  /** A `Sandbox` from the engine's JSON. */
  static fromApi(client: Http, data: unknown): Sandbox {
    return new Sandbox(client, data as SandboxInfo);
  }

  /**
   * Create a sandbox from `template` (default `code-interpreter`) and wait until it answers;
   * with `fromSnapshot`, it resumes that snapshot: kernels, variables, files, packages.
   */
  static async create(options: CreateOptions = {}): Promise<Sandbox> {
    const client = httpOf(options);
    const body: Record<string, unknown> = {
      template: options.template ?? DEFAULT_TEMPLATE,
      persistent: options.persistent ?? false,
    };
    if (options.fromSnapshot !== undefined) body.from_snapshot = options.fromSnapshot;
    if (options.memoryMb !== undefined) body.memory_mb = options.memoryMb;
    if (options.cpu !== undefined) body.cpu = options.cpu;
    if (options.backend !== undefined) body.backend = options.backend;
    if (options.metadata && Object.keys(options.metadata).length) body.metadata = options.metadata;
    return Sandbox.fromApi(client, await client.request("POST", routes.SANDBOXES, { json: body }));
  }

  /** The sandbox with this id. */
  static async get(sandboxId: string, options: ClientOption = {}): Promise<Sandbox> {
    const client = httpOf(options);
    return Sandbox.fromApi(client, await client.request("GET", routes.sandbox(sandboxId)));
  }

  /** Every sandbox of the engine. */
  static async list(options: ClientOption = {}): Promise<Sandbox[]> {
    const client = httpOf(options);
    const data = await client.request<{ items: SandboxInfo[] }>("GET", routes.SANDBOXES);
    return data.items.map((item) => Sandbox.fromApi(client, item));
  }

  /**
   * A new sandbox from the latest (or named) checkpoint of `sandboxId`, alive or killed.
   * Its calls before the checkpoint are answered from the ledger by sequence number
   * (`ReplayMismatch` when a call differs); later calls run live.
   */
  static async resume(
    sandboxId: string,
    options: ClientOption & { name?: string } = {},
  ): Promise<Sandbox> {
    const client = httpOf(options);
    const body = options.name !== undefined ? { name: options.name } : {};
    const data = await client.request<{ sandbox: SandboxInfo; replay: LedgerEntry[] }>(
      "POST",
      routes.sandbox(sandboxId, "resume"),
      { json: body },
    );
    const sandbox = Sandbox.fromApi(client, data.sandbox);
    sandbox.replay = new ReplayCache(data.replay);
    return sandbox;
  }

  /** Run a shell command and wait for it; `check` throws `CommandFailed` on a non-zero exit. */
  async exec(cmd: string, options: ExecOptions = {}): Promise<ExecResult> {
    const path = routes.sandbox(this.id, "exec");
    const { data, replayed } = await this.ledgered("exec", path, execBody(cmd, options));
    const result = execResult(data as ApiExecResult, replayed);
    if (options.check && result.exitCode !== 0) throw new CommandFailed(cmd, result);
    return result;
  }

  /**
   * Run a command, calling back with output as it arrives; resolve to the exit code.
   * Like the Python SDK's `exec_stream`, this is not a ledgered call.
   */
  async execStream(cmd: string, options: ExecStreamOptions = {}): Promise<number> {
    const response = await this.client.raw("POST", routes.sandbox(this.id, "exec/stream"), {
      json: execBody(cmd, options),
    });
    const exit = await relayStream(response, options.onStdout, options.onStderr);
    return Number(exit.exit_code);
  }

  /**
   * A ledgered exec whose output streams to the callbacks: the same call as `exec` for the
   * ledger and the replay cache (a replayed call sends its recorded output to them).
   */
  async execLedgeredStream(cmd: string, options: ExecStreamOptions = {}): Promise<ExecResult> {
    const body = execBody(cmd, options);
    const cached = this.replay.next("exec", body);
    if (cached !== undefined) {
      const result = execResult(cached as ApiExecResult, true);
      if (result.stdout) options.onStdout?.(result.stdout);
      if (result.stderr) options.onStderr?.(result.stderr);
      return result;
    }
    let stdout = "";
    let stderr = "";
    const response = await this.client.raw(
      "POST",
      routes.sandbox(this.id, "exec/stream/ledgered"),
      { json: body },
    );
    const exit = await relayStream(
      response,
      (chunk) => ((stdout += chunk), options.onStdout?.(chunk)),
      (chunk) => ((stderr += chunk), options.onStderr?.(chunk)),
    );
    return execResult({ ...exit, stdout, stderr });
  }

  /** The sandbox's default code context, or (`isolated`) a new kernel of its own. */
  async createCodeContext(options: { isolated?: boolean } = {}): Promise<CodeContext> {
    const body = { language: "python", isolated: options.isolated ?? false };
    const data = await this.post<{ id: string; language?: string }>("repl/sessions", body);
    return new CodeContext(this, data.id, data.language ?? "python");
  }

  /**
   * Freeze kernels, memory and disk into an immutable snapshot (named `name`, or with
   * `{name, metadata}`); the sandbox runs on.
   */
  async snapshot(options?: string | SnapshotOptions): Promise<Snapshot> {
    const { name, metadata } = typeof options === "string" ? { name: options } : (options ?? {});
    const body: Record<string, unknown> = {};
    if (name !== undefined) body.name = name;
    if (metadata && Object.keys(metadata).length) body.metadata = metadata;
    return Snapshot.fromApi(this.client, await this.post("snapshots", body));
  }

  /** This sandbox's snapshots, newest first (those with `metadata`, if given). */
  snapshots(options: { metadata?: Record<string, string> } = {}): Promise<Snapshot[]> {
    return Snapshot.list({ client: this.client, sandboxId: this.id, metadata: options.metadata });
  }

  /** A copy-on-write copy of this running sandbox that then diverges; this one runs on. */
  async fork(options: ForkOptions = {}): Promise<Sandbox> {
    const body = { metadata: options.metadata ?? {}, reseed_python: options.reseedPython ?? false };
    const data = await this.post<{ sandbox: SandboxInfo }>("fork", body);
    return Sandbox.fromApi(this.client, data.sandbox);
  }

  /** `count` (1-16) copies of this sandbox from one capture. */
  async forkTree(options: ForkOptions & { count: number }): Promise<Sandbox[]> {
    const body = {
      count: options.count,
      metadata: options.metadata ?? {},
      reseed_python: options.reseedPython ?? false,
    };
    const data = await this.post<{ children: SandboxInfo[] }>("fork-tree", body);
    return data.children.map((child) => Sandbox.fromApi(this.client, child));
  }

  /** Snapshot the sandbox and mark the point in its ledger (`Sandbox.resume` restores it). */
  async checkpoint(name?: string): Promise<CheckpointInfo> {
    const body = name !== undefined ? { name } : {};
    const event = await this.post<Record<string, any>>("checkpoints", body);
    return {
      snapshotId: event.snapshot_id,
      seq: event.seq,
      name: event.name ?? null,
      createdAt: new Date(event.created_at),
    };
  }

  /** The sandbox's recorded calls and checkpoint events, in order. */
  async ledger(): Promise<Record<string, any>[]> {
    const data = await this.client.request<{ events: Record<string, any>[] }>(
      "GET",
      routes.sandbox(this.id, "ledger"),
    );
    return data.events;
  }

  /**
   * Make this fork child the one that goes on: its parent is killed (unless `killParent` is
   * false), its siblings too with `killSiblings`, and it is no longer marked a fork child.
   */
  async promote(
    options: { killParent?: boolean; killSiblings?: boolean } = {},
  ): Promise<PromoteResult> {
    const body = {
      kill_parent: options.killParent ?? true,
      kill_siblings: options.killSiblings ?? false,
    };
    const data = await this.post<{ sandbox: SandboxInfo; killed: string[] }>("promote", body);
    this.data = { ...data.sandbox } as WireObject<SandboxInfo>;
    return { killed: data.killed };
  }

  /** Best-of-N over forks of this sandbox: see `explore`. */
  explore<T extends Candidate>(
    candidates: T[],
    options: ExploreOptions<T, Sandbox>,
  ): Promise<ExploreResult<T, Sandbox>> {
    return explore(this, candidates, options);
  }

  /** Reload the sandbox's fields (`info`: status, metadata, every other) from the engine. */
  async refresh(): Promise<this> {
    this.data = await this.client.request("GET", routes.sandbox(this.id));
    return this;
  }

  /** The ports a server listens on in the sandbox now. */
  async ports(): Promise<number[]> {
    const data = await this.client.request<{ ports: { port: number }[] }>(
      "GET",
      routes.sandbox(this.id, "ports"),
    );
    return data.ports.map((entry) => entry.port);
  }

  /**
   * Where the server listening on `port` in the sandbox answers: the engine's port proxy,
   * which wants the API key like every endpoint (`Authorization: Bearer`).
   */
  async previewUrl(port: number): Promise<string> {
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new RangeError(`port must be 1-65535, not ${port}`);
    }
    const { baseUrl } = await this.client.connect();
    return `${baseUrl}${routes.API}${routes.port(this.id, port)}`;
  }

  /**
   * Capture the sandbox and stop its VM, freeing its memory; the next call to it (or `wake`)
   * resumes it from the capture, under the same id.
   */
  async hibernate(): Promise<void> {
    this.seen(await this.post<SandboxInfo>("hibernate", {}));
  }

  /** Resume a hibernated sandbox now (a running one is left as it is). */
  async wake(): Promise<void> {
    this.seen(await this.post<SandboxInfo>("wake", {}));
  }

  /** Stop the sandbox and delete everything it owns. */
  async kill(): Promise<void> {
    await this.client.request("DELETE", routes.sandbox(this.id));
  }

  /** `await using sandbox = await Sandbox.create()` kills it (unless persistent) at scope end. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.persistent) await this.kill();
  }

  /** `POST` one of the sandbox's actions with a JSON body. */
  private post<T>(action: routes.SandboxAction, body: unknown): Promise<T> {
    return this.client.request<T>("POST", routes.sandbox(this.id, action), { json: body });
  }

  /** Take the engine's answer of a sandbox (or, from an older engine, just its status). */
  private seen(data: Partial<SandboxInfo>): void {
    this.data = (data.id === this.id
      ? { ...data }
      : { ...this.data, status: data.status ?? this.data.status }) as WireObject<SandboxInfo>;
  }

  /** Send a ledgered call (`exec`, `run_code`), or answer it from the replay cache. */
  async ledgered(
    kind: string,
    path: string,
    body: Record<string, unknown>,
    extra: Record<string, unknown> = {},
  ): Promise<{ data: Record<string, any>; replayed: boolean }> {
    const cached = this.replay.next(kind, { ...body, ...extra });
    if (cached !== undefined) return { data: cached, replayed: true };
    return { data: await this.client.request("POST", path, { json: body }), replayed: false };
  }
}

/** A code context: a real ipykernel inside the sandbox whose state persists across runs. */
export class CodeContext {
  constructor(
    readonly sandbox: Sandbox,
    readonly id: string,
    readonly language = "python",
  ) {}

  /** Run `code`; resolve to its `Execution` (results, streams, error). */
  async runCode(code: string, options: { timeoutSeconds?: number } = {}): Promise<Execution> {
    const body: Record<string, unknown> = { code };
    if (options.timeoutSeconds !== undefined) body.timeout_seconds = options.timeoutSeconds;
    const path = routes.context(this.sandbox.id, this.id, "run");
    const { data, replayed } = await this.sandbox.ledgered("run_code", path, body, {
      context: this.id,
    });
    return Execution.fromApi(data, replayed);
  }

  /** Shut an isolated context down (the default context stays). */
  async close(): Promise<void> {
    await this.sandbox.client.request("DELETE", routes.context(this.sandbox.id, this.id));
  }
}
