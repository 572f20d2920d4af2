/** Files of a sandbox. */

import type { Http } from "./http.js";
import type { FileEntry } from "./models.js";
import * as routes from "./routes.js";

/** Files inside the sandbox `sandboxId` of the engine `client` talks to. */
export class Files {
  constructor(
    private readonly client: Http,
    private readonly sandboxId: string,
  ) {}

  /** The text of `path` (UTF-8). */
  async read(path: string): Promise<string> {
    return new TextDecoder().decode(await this.readBytes(path));
  }

  /** The bytes of `path`. */
  async readBytes(path: string): Promise<Uint8Array> {
    const response = await this.client.raw("GET", routes.sandbox(this.sandboxId, "fs"), {
      query: { path },
    });
    return new Uint8Array(await response.arrayBuffer());
  }

  /** Write `content` to `path`, creating parent directories. */
  async write(path: string, content: string | Uint8Array): Promise<void> {
    await this.client.request("PUT", routes.sandbox(this.sandboxId, "fs"), {
      query: { path },
      body: content,
    });
  }

  /** The entries of a directory. */
  async list(path = "/"): Promise<FileEntry[]> {
    const data = await this.client.request<{ entries: FileEntry[] }>(
      "GET",
      routes.sandbox(this.sandboxId, "fs/dir"),
      { query: { path } },
    );
    return data.entries;
  }
}
