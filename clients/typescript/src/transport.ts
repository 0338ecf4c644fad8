/**
 * The HTTP and WebSocket plumbing under HutchClient. It speaks node:http
 * rather than fetch because Node's fetch cannot dial a unix socket, and the
 * daemon's local socket (trusted, no key) is the default way to reach it.
 */
import http from "node:http";
import https from "node:https";
import { Readable } from "node:stream";
import { ReadableStream as WebReadableStream } from "node:stream/web";
import WebSocket from "ws";
import { HutchError, errorFromResponse } from "./errors.js";

export type Endpoint =
  | { readonly kind: "unix"; readonly socketPath: string }
  | { readonly kind: "tcp"; readonly url: URL };

/**
 * Parses a host as the CLI takes it (`--host`, `$HUTCH_HOST`):
 * `unix:///path/hutch.sock`, a bare socket path, or `http(s)://host:port`.
 */
export function parseHost(host: string): Endpoint {
  if (host.startsWith("unix://")) {
    return { kind: "unix", socketPath: host.slice("unix://".length) };
  }
  if (host.startsWith("/")) {
    return { kind: "unix", socketPath: host };
  }
  let url: URL;
  try {
    url = new URL(host);
  } catch {
    throw new HutchError("invalid_argument", `host ${JSON.stringify(host)}: want unix:///path/hutch.sock or http(s)://host:port`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new HutchError("invalid_argument", `host ${JSON.stringify(host)}: want unix:///path/hutch.sock or http(s)://host:port`);
  }
  return { kind: "tcp", url };
}

export type Query = Record<string, string | number | boolean | readonly string[] | undefined>;

export type Body = string | Uint8Array | ReadableStream<Uint8Array> | undefined;

export interface RequestOptions {
  query?: Query;
  body?: Body;
  /** Sets Content-Type; JSON bodies are passed already serialized. */
  contentType?: string;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** Resolve with any status instead of turning ≥ 400 into a HutchError (a proxied app's own answers). */
  anyStatus?: boolean;
}

export function encodeQuery(query: Query | undefined): string {
  if (!query) return "";
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v === undefined) continue;
    if (Array.isArray(v)) {
      for (const item of v) q.append(k, item);
    } else {
      q.append(k, String(v));
    }
  }
  const s = q.toString();
  return s ? `?${s}` : "";
}

export class Transport {
  constructor(
    readonly endpoint: Endpoint,
    private readonly apiKey: string | undefined,
  ) {}

  /** Where requests go, for messages. */
  describe(): string {
    return this.endpoint.kind === "unix" ? `unix://${this.endpoint.socketPath}` : this.endpoint.url.origin;
  }

  private headers(extra?: Record<string, string>): Record<string, string> {
    const h: Record<string, string> = { "User-Agent": "hutch-typescript/0.1", ...extra };
    if (this.apiKey) h["Authorization"] = `Bearer ${this.apiKey}`;
    return h;
  }

  /**
   * Sends one request and resolves with the response once its headers are
   * in. A status ≥ 400 rejects with the server's HutchError; so does a
   * failure to reach the daemon (code unavailable).
   */
  send(method: string, path: string, opts: RequestOptions = {}): Promise<http.IncomingMessage> {
    const fullPath = `/v1${path}${encodeQuery(opts.query)}`;
    const headers = this.headers(opts.headers);
    if (opts.contentType) headers["Content-Type"] = opts.contentType;
    const body = opts.body;
    if (typeof body === "string" || body instanceof Uint8Array) {
      headers["Content-Length"] = String(Buffer.byteLength(body));
    }
    return new Promise((resolve, reject) => {
      let req: http.ClientRequest;
      const onResponse = (res: http.IncomingMessage) => {
        const status = res.statusCode ?? 0;
        if (status < 400 || opts.anyStatus) {
          resolve(res);
          return;
        }
        readAll(res).then(
          (buf) => reject(errorFromResponse(status, buf.toString("utf8"))),
          (err: unknown) => reject(transportError(this.describe(), err)),
        );
      };
      const common = { method, headers, signal: opts.signal };
      if (this.endpoint.kind === "unix") {
        req = http.request({ ...common, socketPath: this.endpoint.socketPath, path: fullPath, host: "hutch" }, onResponse);
      } else {
        const url = new URL(fullPath, this.endpoint.url);
        req = (url.protocol === "https:" ? https : http).request(url, common, onResponse);
      }
      req.on("error", (err) => reject(transportError(this.describe(), err)));
      if (body === undefined) {
        req.end();
      } else if (typeof body === "string" || body instanceof Uint8Array) {
        req.end(body);
      } else {
        Readable.fromWeb(body as WebReadableStream<Uint8Array>).on("error", (err) => req.destroy(err)).pipe(req);
      }
    });
  }

  /** Sends a request and returns the whole response body. */
  async bytes(method: string, path: string, opts: RequestOptions = {}): Promise<Buffer> {
    const res = await this.send(method, path, opts);
    try {
      return await readAll(res);
    } catch (err) {
      throw transportError(this.describe(), err);
    }
  }

  /** Sends a request (a JSON body when `body` is an object) and decodes the JSON answer. */
  async json<T>(method: string, path: string, body?: unknown, opts: Omit<RequestOptions, "body" | "contentType"> = {}): Promise<T> {
    const res = await this.bytes(method, path, {
      ...opts,
      body: body === undefined ? undefined : JSON.stringify(body),
      contentType: body === undefined ? undefined : "application/json",
    });
    if (res.length === 0) return undefined as T;
    return JSON.parse(res.toString("utf8")) as T;
  }

  /**
   * Starts a WebSocket to path and returns it at once, with a promise for
   * its opening: the caller attaches its message listener before the
   * handshake completes, because the daemon's first message can arrive in
   * the same read as the handshake and would otherwise be emitted to no
   * one. The daemon's handshake failures (a missing sandbox, a bad key)
   * reject `opened` with HutchErrors, as for plain requests.
   */
  websocket(path: string, query?: Query): { ws: WebSocket; opened: Promise<void> } {
    const fullPath = `/v1${path}${encodeQuery(query)}`;
    const url =
      this.endpoint.kind === "unix"
        ? `ws+unix://${this.endpoint.socketPath}:${fullPath}`
        : new URL(fullPath, this.endpoint.url.href.replace(/^http/, "ws")).href;
    const ws = new WebSocket(url, { headers: this.headers() });
    ws.binaryType = "nodebuffer";
    const opened = new Promise<void>((resolve, reject) => {
      const onError = (err: Error) => {
        ws.off("open", onOpen);
        reject(transportError(this.describe(), err));
      };
      const onOpen = () => {
        ws.off("error", onError);
        ws.off("unexpected-response", onUnexpected);
        resolve();
      };
      const onUnexpected = (_req: http.ClientRequest, res: http.IncomingMessage) => {
        ws.off("error", onError);
        ws.off("open", onOpen);
        readAll(res).then(
          (buf) => reject(errorFromResponse(res.statusCode ?? 0, buf.toString("utf8"))),
          (err: unknown) => reject(transportError(this.describe(), err)),
        );
      };
      ws.once("error", onError);
      ws.once("open", onOpen);
      ws.once("unexpected-response", onUnexpected);
    });
    return { ws, opened };
  }
}

export function readAll(stream: Readable): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("end", () => resolve(Buffer.concat(chunks)));
    stream.on("error", reject);
    stream.on("aborted", () => reject(new Error("the response was cut off")));
  });
}

/** Reads a stream of newline-delimited JSON values. */
export async function* ndjson<T>(stream: Readable): AsyncGenerator<T> {
  let buf = "";
  stream.setEncoding("utf8");
  for await (const chunk of stream as AsyncIterable<string>) {
    buf += chunk;
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (line) yield JSON.parse(line) as T;
    }
  }
  if (buf.trim()) yield JSON.parse(buf) as T;
}

function transportError(where: string, err: unknown): Error {
  if (err instanceof HutchError) return err;
  if (err instanceof Error && err.name === "AbortError") return err;
  const msg = err instanceof Error ? err.message : String(err);
  return new HutchError("unavailable", `hutch at ${where}: ${msg}`, { cause: err });
}
