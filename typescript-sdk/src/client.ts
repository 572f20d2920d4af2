/** `Client` and `SandboxHandle`: document 003's surface (checkpoints, resume, piped exec). */

import { NotFoundError } from "./errors.js";
import { type ConnectionOptions, Http } from "./http.js";
import type { Inventory, InventoryDiff } from "./inventory.js";
import type { ExecResult, Execution } from "./models.js";
import { type CheckpointInfo, type ExecOptions, Sandbox } from "./sandbox.js";
import { type SnapshotRef, inventoryDiff, snapshotInventory } from "./snapshot.js";

/** Resources of a sandbox: `cpu` ("1", 2) and `memory` ("512Mi", "1Gi", or megabytes). */
export interface Resources {
  cpu?: string | number;
  memory?: string | number;
}

/** What `client.sandbox()` creates. `image` is another word for `template`. */
export interface SandboxSpec {
  template?: string;
  image?: string;
  resources?: Resources;
  /** A tag kept in the sandbox's metadata (`name`). */
  name?: string;
  metadata?: Record<string, string>;
  fromSnapshot?: string;
}

/** A writable that output is piped into (`process.stdout`, a file, a `Writable`). */
export interface Sink {
  write(chunk: string): unknown;
}

/** Megabytes of a Kubernetes-style quantity: "512Mi", "1Gi", "2G", or a number of MB. */
export function memoryMb(memory: string | number): number {
  if (typeof memory === "number") return memory;
  const m = /^\s*(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|K|M|G)?B?\s*$/.exec(memory);
  if (!m) {
    throw new TypeError(`memory must look like "512Mi" or "1Gi", got ${JSON.stringify(memory)}`);
  }
  const factor: Record<string, number> = {
    Ki: 1 / 1024,
    Mi: 1,
    Gi: 1024,
    K: 1000 / 2 ** 20,
    M: 1e6 / 2 ** 20,
    G: 1e9 / 2 ** 20,
  };
  return Math.round(Number(m[1]) * factor[m[2] ?? "Mi"]);
}

/**
 * A pending exec: `await` it for `{stdout, stderr, exitCode}`, or `.pipe(process.stdout)`
 * to stream its output as it comes (and still get the result). Either way it is one
 * ledgered call, replayed by a resume like any other.
 */
export class ExecCall implements PromiseLike<ExecResult> {
  private started?: Promise<ExecResult>;

  constructor(
    private readonly sandbox: Sandbox,
    private readonly cmd: string,
    private readonly options: ExecOptions,
  ) {}

  /** Stream stdout (and stderr, to `stderr` if given) into writables; resolve to the result. */
  pipe(stdout: Sink, stderr?: Sink): Promise<ExecResult> {
    if (this.started) throw new TypeError("pipe() must come before the exec is awaited");
    this.started = this.sandbox.execLedgeredStream(this.cmd, {
      ...this.options,
      onStdout: (chunk) => stdout.write(chunk),
      onStderr: stderr ? (chunk) => stderr.write(chunk) : undefined,
    });
    return this.started;
  }

  then<A = ExecResult, B = never>(
    onFulfilled?: ((value: ExecResult) => A | PromiseLike<A>) | null,
    onRejected?: ((reason: unknown) => B | PromiseLike<B>) | null,
  ): Promise<A | B> {
    this.started ??= this.sandbox.exec(this.cmd, this.options);
    return this.started.then(onFulfilled, onRejected);
  }

  catch<B = never>(
    onRejected?: ((reason: unknown) => B | PromiseLike<B>) | null,
  ): Promise<ExecResult | B> {
    return this.then(undefined, onRejected);
  }

  finally(onFinally?: (() => void) | null): Promise<ExecResult> {
    return this.then().finally(onFinally);
  }
}

/** A sandbox as document 003 handles it: exec, files, checkpoint, fork, close. */
export class SandboxHandle {
  constructor(
    /** The sandbox underneath (document 000's API). */
    readonly sandbox: Sandbox,
    /** The `name` tag; a resumed handle keeps the original's when the engine still has it. */
    readonly name?: string,
  ) {}

  /** The sandbox's id; a resumed sandbox has a new one. */
  get sandboxId(): string {
    return this.sandbox.id;
  }

  /** Run a shell command: await the result, or `.pipe()` its output. */
  exec(cmd: string, options: ExecOptions = {}): ExecCall {
    return new ExecCall(this.sandbox, cmd, options);
  }

  /** Run Python code in the sandbox's default code context (a ledgered call too). */
  async runCode(code: string): Promise<Execution> {
    return (await this.sandbox.createCodeContext()).runCode(code);
  }

  /** Write a file, creating parent directories. */
  writeFile(path: string, content: string | Uint8Array): Promise<void> {
    return this.sandbox.files.write(path, content);
  }

  /** The text of a file. */
  readFile(path: string): Promise<string> {
    return this.sandbox.files.read(path);
  }

  /** Snapshot the sandbox and write a `sandbox.checkpoint_created` event (with `name`). */
  checkpoint(name?: string): Promise<CheckpointInfo> {
    return this.sandbox.checkpoint(name);
  }

  /** An independent live copy of this sandbox; this one runs on. */
  async fork(): Promise<SandboxHandle> {
    return new SandboxHandle(await this.sandbox.fork(), this.name);
  }

  /** Kill the sandbox; its ledger and checkpoints stay, so `client.resume` still works. */
  async close(): Promise<void> {
    try {
      await this.sandbox.kill();
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** A session with the engine: `new Client()` reads `SANDFORK_API`/`SANDFORK_API_KEY` & co. */
export class Client {
  readonly http: Http;

  constructor(options: ConnectionOptions = {}) {
    this.http = new Http(options);
  }

  /** Create a sandbox and wait until it answers. */
  async sandbox(spec: SandboxSpec = {}): Promise<SandboxHandle> {
    const metadata = { ...(spec.metadata ?? {}) };
    if (spec.name !== undefined) metadata.name = spec.name;
    const cpu = spec.resources?.cpu;
    const memory = spec.resources?.memory;
    const sandbox = await Sandbox.create({
      client: this.http,
      template: spec.template ?? spec.image,
      fromSnapshot: spec.fromSnapshot,
      cpu: cpu === undefined ? undefined : Number(cpu),
      memoryMb: memory === undefined ? undefined : memoryMb(memory),
      metadata,
    });
    return new SandboxHandle(sandbox, spec.name);
  }

  /**
   * A new sandbox from the last (or the named) checkpoint of `sandboxId`, alive or closed.
   * Its execs before the checkpoint are answered from the ledger by sequence number;
   * `ReplayMismatch` if one differs; later ones run live. Throws `NotFoundError` when the
   * sandbox has no such checkpoint.
   */
  async resume(sandboxId: string, options: { name?: string } = {}): Promise<SandboxHandle> {
    let name: string | undefined;
    try {
      name = (await Sandbox.get(sandboxId, { client: this.http })).metadata.name;
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
    const sandbox = await Sandbox.resume(sandboxId, { client: this.http, name: options.name });
    return new SandboxHandle(sandbox, name);
  }

  /**
   * The variable inventory of a snapshot (an id, e.g. a checkpoint's `snapshotId`, or a
   * `Snapshot`): see `snapshotInventory`.
   */
  snapshotInventory(snapshot: SnapshotRef): Promise<Inventory> {
    return snapshotInventory(snapshot, { client: this.http });
  }

  /** What changed in the variables from snapshot `from` to snapshot `to`: see `inventoryDiff`. */
  inventoryDiff(from: SnapshotRef, to: SnapshotRef): Promise<InventoryDiff> {
    return inventoryDiff(from, to, { client: this.http });
  }
}
