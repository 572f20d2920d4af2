/** Finding the engine: the environment, then the local engine's runtime files. */

import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { setTimeout as delay } from "node:timers/promises";

import { EngineUnreachable } from "./errors.js";

/** Where the engine is and the key it wants. */
export interface Connection {
  baseUrl: string;
  apiKey: string;
}

/** `SANDFORK_API`/`SANDFORK_API_KEY`, else `PANDASTACK_API`/`PANDASTACK_API_KEY`. */
export function fromEnvironment(env: NodeJS.ProcessEnv = process.env): Connection | undefined {
  for (const prefix of ["SANDFORK", "PANDASTACK"]) {
    const url = env[`${prefix}_API`];
    const key = env[`${prefix}_API_KEY`];
    if (url && key) return { baseUrl: url.replace(/\/+$/, ""), apiKey: key };
  }
  return undefined;
}

/** The engine's state directory, computed like `sandfork.paths.state_dir`. */
export function stateDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.SANDFORK_HOME && !env.SANDFORK_STATE_DIR) return env.SANDFORK_HOME;
  if (env.SANDFORK_STATE_DIR) return env.SANDFORK_STATE_DIR;
  return join(env.XDG_STATE_HOME || join(homedir(), ".local", "state"), "sandfork");
}

/** The local engine published in `<state dir>/run`, if its process is alive. */
export function localEngine(runtime: string = join(stateDir(), "run")): Connection | undefined {
  let info: { url?: string; pid?: number };
  let key: string;
  try {
    info = JSON.parse(readFileSync(join(runtime, "engine.json"), "utf8"));
    key = readFileSync(join(runtime, "api_key"), "utf8").trim();
  } catch {
    return undefined;
  }
  if (!info.url || !pidAlive(Number(info.pid ?? 0))) return undefined;
  return { baseUrl: info.url, apiKey: key };
}

function pidAlive(pid: number): boolean {
  if (pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * Start `sandfork serve --port 0` in the background (the `sandfork` command on PATH, or
 * `SANDFORK_BIN`) and wait until its runtime files name a live engine.
 */
export async function startLocalEngine(timeoutMs = 30_000): Promise<Connection> {
  const bin = process.env.SANDFORK_BIN || "sandfork";
  const child = spawn(bin, ["serve", "--port", "0"], { detached: true, stdio: "ignore" });
  let failure: Error | undefined;
  child.on("error", (e) => (failure = e));
  child.unref();
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (failure) {
      throw new EngineUnreachable(`could not start the local engine: ${failure.message}`);
    }
    const conn = localEngine();
    if (conn) return conn;
    await delay(100);
  }
  throw new EngineUnreachable(`the local engine did not start within ${timeoutMs / 1000} s`);
}

/** The engine to talk to: explicit options, the environment, the local engine (started). */
export async function resolveConnection(
  options: { baseUrl?: string; apiKey?: string; autoStart?: boolean } = {},
): Promise<Connection> {
  const found = fromEnvironment() ?? localEngine();
  const baseUrl = options.baseUrl?.replace(/\/+$/, "") ?? found?.baseUrl;
  const apiKey = options.apiKey ?? found?.apiKey;
  if (baseUrl && apiKey) return { baseUrl, apiKey };
  if (options.autoStart === false || options.baseUrl) {
    throw new EngineUnreachable(
      "no engine configured: set SANDFORK_API and SANDFORK_API_KEY, or run `sandfork serve`",
    );
  }
  return startLocalEngine();
}
