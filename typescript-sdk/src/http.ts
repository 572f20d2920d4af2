/** The HTTP transport of the engine's `/v1` API: JSON in, JSON out, typed errors. */

import { type Connection, resolveConnection } from "./config.js";
import { EngineUnreachable, SandforkError, errorFor } from "./errors.js";
import { API } from "./routes.js";

/** Options of one request. */
export interface RequestOptions {
  json?: unknown;
  body?: Uint8Array | string;
  query?: Record<string, string>;
  signal?: AbortSignal;
}

/** Options of a connection to the engine; anything left out comes from the environment. */
export interface ConnectionOptions {
  baseUrl?: string;
  apiKey?: string;
  /** Start a local engine when none is configured or running (default true). */
  autoStart?: boolean;
}

/** A session with one engine. The connection is resolved on the first request. */
export class Http {
  private connection?: Promise<Connection>;

  constructor(private readonly options: ConnectionOptions = {}) {}

  /** The engine's URL and key, resolved once (tried again after a failure). */
  connect(): Promise<Connection> {
    this.connection ??= resolveConnection(this.options).catch((e: unknown) => {
      this.connection = undefined;
      throw e;
    });
    return this.connection;
  }

  /**
   * Send a request to `/v1{path}` (a path of `routes.ts`) and decode its JSON answer
   * (`undefined` for 204).
   */
  async request<T = unknown>(
    method: string,
    path: string,
    options: RequestOptions = {},
  ): Promise<T> {
    const response = await this.raw(method, path, options);
    const text = await response.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }

  /** Send a request; return the response, or throw the SDK error of a failure. */
  async raw(method: string, path: string, options: RequestOptions = {}): Promise<Response> {
    const { baseUrl, apiKey } = await this.connect();
    const url = new URL(`${baseUrl}${API}${path}`);
    for (const [k, v] of Object.entries(options.query ?? {})) url.searchParams.set(k, v);
    const headers: Record<string, string> = { Authorization: `Bearer ${apiKey}` };
    let body: string | Uint8Array | undefined = options.body;
    if (options.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.json);
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/octet-stream";
    }
    let response: Response;
    try {
      response = await fetch(url, { method, headers, body, signal: options.signal });
    } catch (e) {
      throw new EngineUnreachable(
        `could not reach the engine at ${baseUrl}: ${(e as Error).message}`,
      );
    }
    if (response.status >= 400) throw errorOfAnswer(response.status, await response.text());
    return response;
  }
}

/**
 * The SDK error of a failure answer: `{"error": message, "kind": kind}` (the kind names the
 * class); an answer that names no kind (an older engine, a proxy) is classed by its status.
 */
export function errorOfAnswer(status: number, text: string): SandforkError {
  let message = text || `HTTP ${status}`;
  let kind: unknown;
  try {
    const answer = JSON.parse(text) as Record<string, unknown>;
    if (answer && typeof answer === "object") {
      if (answer.error !== undefined) message = String(answer.error);
      kind = answer.kind;
    }
  } catch {
    // not JSON: keep the body as the message
  }
  return errorFor(status, message, kind);
}

let shared: Http | undefined;

/** The session used when none is given: the configured or local engine. */
export function defaultHttp(): Http {
  shared ??= new Http();
  return shared;
}

/** How to reach the engine: a shared `Http` session, or connection options. */
export interface ClientOption {
  client?: Http;
  connection?: ConnectionOptions;
}

/** The `Http` session of `options`: the one given, a new one, or the shared default. */
export function httpOf(options: ClientOption): Http {
  if (options.client) return options.client;
  return options.connection ? new Http(options.connection) : defaultHttp();
}

/** One server-sent event of a streamed exec. */
export interface StreamEvent {
  event: string;
  data: Record<string, unknown>;
}

/** The events of a `text/event-stream` response, parsed as they arrive. */
export async function* serverSentEvents(response: Response): AsyncGenerator<StreamEvent> {
  if (!response.body) return;
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "message";
  let data = "";
  for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true });
    let newline: number;
    while ((newline = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, newline).replace(/\r$/, "");
      buffer = buffer.slice(newline + 1);
      if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) data += line.slice(5).trim();
      else if (line === "" && data) {
        yield { event, data: JSON.parse(data) as Record<string, unknown> };
        event = "message";
        data = "";
      }
    }
  }
}
