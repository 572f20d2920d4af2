/** Code contexts and files of a sandbox. */

import { Execution, type FileEntry } from "./models.js";
import type { Sandbox } from "./sandbox.js";

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
    const path = `/sandboxes/${this.sandbox.id}/repl/sessions/${this.id}/run`;
    const { data, replayed } = await this.sandbox.ledgered("run_code", path, body, {
      context: this.id,
    });
    return Execution.fromApi(data, replayed);
  }

  /** Shut an isolated context down (the default context stays). */
  async close(): Promise<void> {
    await this.sandbox.client.request(
      "DELETE",
      `/sandboxes/${this.sandbox.id}/repl/sessions/${this.id}`,
    );
  }
}

/** Files inside a sandbox. */
export class Files {
  constructor(private readonly sandbox: Sandbox) {}

  private path(suffix = ""): string {
    return `/sandboxes/${this.sandbox.id}/fs${suffix}`;
  }

  /** The text of `path` (UTF-8). */
  async read(path: string): Promise<string> {
    return new TextDecoder().decode(await this.readBytes(path));
  }

  /** The bytes of `path`. */
  async readBytes(path: string): Promise<Uint8Array> {
    const response = await this.sandbox.client.raw("GET", this.path(), { query: { path } });
    return new Uint8Array(await response.arrayBuffer());
  }

  /** Write `content` to `path`, creating parent directories. */
  async write(path: string, content: string | Uint8Array): Promise<void> {
    await this.sandbox.client.request("PUT", this.path(), { query: { path }, body: content });
  }

  /** The entries of a directory. */
  async list(path = "/"): Promise<FileEntry[]> {
    const data = await this.sandbox.client.request<{ entries: FileEntry[] }>(
      "GET",
      this.path("/dir"),
      { query: { path } },
    );
    return data.entries;
  }
}
