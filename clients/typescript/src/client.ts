/**
 * HutchClient: a typed client over hutch's HTTP API. Request and response
 * types come from src/generated/api.ts, which openapi-typescript makes from
 * api/openapi.yaml (the contract), so a change to the spec shows up here as
 * a type error rather than a runtime surprise.
 */
import { join } from "node:path";
import type WebSocket from "ws";
import type { components, operations } from "./generated/api.js";
import { HutchError } from "./errors.js";
import { AsyncQueue } from "./queue.js";
import { type Body, type Query, Transport, ndjson, parseHost, readAll } from "./transport.js";

type Schemas = components["schemas"];
export type Sandbox = Schemas["Sandbox"];
export type SandboxState = Sandbox["state"];
export type CreateSandboxRequest = Schemas["CreateSandboxRequest"];
export type UpdateSandboxRequest = Schemas["UpdateSandboxRequest"];
export type SandboxList = Schemas["SandboxList"];
export type ExecRequest = Schemas["ExecRequest"];
export type ExecResult = Schemas["ExecResult"];
export type ExecEvent = Schemas["ExecEvent"];
export type StreamInput = Schemas["StreamInput"];
export type StartProcessRequest = Schemas["StartProcessRequest"];
export type OpenTerminalRequest = Schemas["OpenTerminalRequest"];
export type Process = Schemas["Process"];
export type ExitStatus = Schemas["ExitStatus"];
export type FileInfo = Schemas["FileInfo"];
export type Template = Schemas["Template"];
export type TemplateDefinition = Schemas["TemplateDefinition"];
export type TemplateFile = Schemas["TemplateFile"];
export type TemplateBuildEvent = Schemas["TemplateBuildEvent"];
export type ForkRequest = Schemas["ForkRequest"];
export type Key = Schemas["Key"];
export type CreatedKey = Schemas["CreatedKey"];
export type CreateKeyRequest = Schemas["CreateKeyRequest"];
export type Health = Schemas["Health"];
export type NetworkPolicy = Schemas["NetworkPolicy"];
export type NetworkRule = Schemas["NetworkRule"];
export type NetworkCredential = Schemas["NetworkCredential"];
export type NetworkEvent = Schemas["NetworkEvent"];
export type ExposePortRequest = Schemas["ExposePortRequest"];
export type ExposedPort = Schemas["ExposedPort"];
export type ListSandboxesQuery = NonNullable<operations["listSandboxes"]["parameters"]["query"]>;

/** How a command ended: an exit code, or null with the signal or timeout that ended it. */
export interface ExitInfo {
  exitCode: number | null;
  signal?: string;
  timedOut: boolean;
  killed: boolean;
}

export interface HutchClientOptions {
  /**
   * `unix:///path/hutch.sock` (trusted, no key) or `http(s)://host:port`
   * (needs apiKey). Default: $HUTCH_HOST, else the socket in $HUTCH_DATA
   * or ./.hutch, as the CLI does.
   */
  host?: string;
  /** The bearer key for TCP. Default: $HUTCH_API_KEY. */
  apiKey?: string;
}

export interface OutputChunk {
  stream: "stdout" | "stderr";
  data: Buffer;
  seq: number;
}

function sandboxPath(id: string, rest = ""): string {
  return `/sandboxes/${encodeURIComponent(id)}${rest}`;
}

function processPath(id: string, proc: string, rest = ""): string {
  return sandboxPath(id, `/processes/${encodeURIComponent(proc)}${rest}`);
}

/** The exit of an ExecEvent or Process, in one shape. */
export function exitInfo(ev: { exit_code?: number | null; signal?: string; timed_out?: boolean; killed?: boolean }): ExitInfo {
  const info: ExitInfo = { exitCode: ev.exit_code ?? null, timedOut: ev.timed_out ?? false, killed: ev.killed ?? false };
  if (ev.signal) info.signal = ev.signal;
  return info;
}

/** The error an ExecEvent of type error carries, as a HutchError. */
function eventError(ev: ExecEvent): HutchError {
  return new HutchError(ev.error?.code ?? "internal", ev.error?.message ?? "the stream failed", {
    requestId: ev.error?.request_id,
  });
}

export class HutchClient {
  private readonly t: Transport;

  constructor(opts: HutchClientOptions = {}) {
    // An empty variable counts as unset, as for the CLI.
    const host =
      opts.host ||
      process.env["HUTCH_HOST"] ||
      `unix://${join(process.env["HUTCH_DATA"] || ".hutch", "hutch.sock")}`;
    this.t = new Transport(parseHost(host), opts.apiKey ?? process.env["HUTCH_API_KEY"]);
  }

  /** Where this client sends requests. */
  get host(): string {
    return this.t.describe();
  }

  health(): Promise<Health> {
    return this.t.json("GET", "/health");
  }

  // Sandboxes and their lifecycle.

  createSandbox(req: CreateSandboxRequest = {}): Promise<Sandbox> {
    return this.t.json("POST", "/sandboxes", req);
  }

  getSandbox(id: string): Promise<Sandbox> {
    return this.t.json("GET", sandboxPath(id));
  }

  listSandboxes(query: ListSandboxesQuery = {}): Promise<SandboxList> {
    return this.t.json("GET", "/sandboxes", undefined, { query: query as Query });
  }

  updateSandbox(id: string, req: UpdateSandboxRequest): Promise<Sandbox> {
    return this.t.json("PATCH", sandboxPath(id), req);
  }

  /**
   * Destroys a sandbox; destroying a destroyed one succeeds. A reason (at
   * most 200 printable characters) is kept: the sandbox's reason becomes
   * "deleted: REASON".
   */
  async deleteSandbox(id: string, reason?: string): Promise<void> {
    const q = reason ? `?reason=${encodeURIComponent(reason)}` : "";
    await this.t.bytes("DELETE", sandboxPath(id) + q);
  }

  pauseSandbox(id: string): Promise<Sandbox> {
    return this.t.json("POST", sandboxPath(id, "/pause"));
  }

  suspendSandbox(id: string): Promise<Sandbox> {
    return this.t.json("POST", sandboxPath(id, "/suspend"));
  }

  resumeSandbox(id: string): Promise<Sandbox> {
    return this.t.json("POST", sandboxPath(id, "/resume"));
  }

  snapshotSandbox(id: string, template: string): Promise<Template> {
    return this.t.json("POST", sandboxPath(id, "/snapshot"), { template });
  }

  forkSandbox(id: string, req: ForkRequest = {}): Promise<SandboxList> {
    return this.t.json("POST", sandboxPath(id, "/fork"), req);
  }

  // Network and ports.

  /** Replaces a sandbox's network policy live; answers the policy in force (credential values redacted). */
  setNetworkPolicy(id: string, policy: NetworkPolicy): Promise<NetworkPolicy> {
    return this.t.json("PUT", sandboxPath(id, "/network"), policy);
  }

  getNetworkPolicy(id: string): Promise<NetworkPolicy> {
    return this.t.json("GET", sandboxPath(id, "/network"));
  }

  /** The sandbox's most recent egress decisions, oldest first. */
  async networkEvents(id: string): Promise<NetworkEvent[]> {
    return (await this.t.json<Schemas["NetworkEventList"]>("GET", sandboxPath(id, "/network/events"))).events;
  }

  /** Exposes a port of the sandbox through the daemon (HTTP and WebSocket). */
  exposePort(id: string, req: ExposePortRequest): Promise<ExposedPort> {
    return this.t.json("POST", sandboxPath(id, "/ports"), req);
  }

  async listPorts(id: string): Promise<ExposedPort[]> {
    return (await this.t.json<Schemas["ExposedPortList"]>("GET", sandboxPath(id, "/ports"))).ports;
  }

  async unexposePort(id: string, port: number): Promise<void> {
    await this.t.bytes("DELETE", sandboxPath(id, `/ports/${port}`));
  }

  /**
   * An HTTP request to an exposed port, through the daemon with this
   * client's credentials (so it works over the unix socket too). Every
   * status comes back as is: the app's, and the daemon's refusals (a port
   * not exposed) with hutch's error body.
   */
  async portRequest(
    id: string,
    port: number,
    path = "/",
    opts: { method?: string; body?: Body; headers?: Record<string, string>; signal?: AbortSignal } = {},
  ): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: Buffer }> {
    const rel = path.startsWith("/") ? path.slice(1) : path;
    const res = await this.t.send(opts.method ?? "GET", sandboxPath(id, `/ports/${port}/${rel}`), {
      body: opts.body,
      headers: opts.headers,
      signal: opts.signal,
      anyStatus: true,
    });
    const body = await readAll(res);
    return { status: res.statusCode ?? 0, headers: res.headers, body };
  }

  // Commands.

  /** Runs a command to its end with buffered (capped) output. A non-zero exit is a result. */
  exec(id: string, req: ExecRequest, opts: { signal?: AbortSignal } = {}): Promise<ExecResult> {
    return this.t.json("POST", sandboxPath(id, "/exec"), req, opts);
  }

  /**
   * Runs a command and yields its events (start, output…, exit) as they
   * come. Aborting the signal hangs up, which kills a foreground command.
   */
  async *execStream(id: string, req: ExecRequest, opts: { signal?: AbortSignal } = {}): AsyncGenerator<ExecEvent> {
    const res = await this.t.send("POST", sandboxPath(id, "/exec/stream"), {
      body: JSON.stringify(req),
      contentType: "application/json",
      headers: { Accept: "application/x-ndjson" },
      signal: opts.signal,
    });
    try {
      for await (const ev of ndjson<ExecEvent>(res)) {
        if (ev.type === "error") throw eventError(ev);
        yield ev;
      }
    } finally {
      res.destroy();
    }
  }

  /**
   * Runs a command over a WebSocket, with stdin both ways. The command dies
   * when the session is closed before it exits.
   */
  async execInteractive(id: string, req: ExecRequest): Promise<ExecSession> {
    const { ws, opened } = this.t.websocket(sandboxPath(id, "/exec/ws"));
    const session = new ExecSession(ws);
    await opened;
    ws.send(JSON.stringify(req));
    await session.started;
    return session;
  }

  // Background processes.

  startProcess(id: string, req: StartProcessRequest): Promise<Process> {
    return this.t.json("POST", sandboxPath(id, "/processes"), req);
  }

  async listProcesses(id: string): Promise<Process[]> {
    return (await this.t.json<Schemas["ProcessList"]>("GET", sandboxPath(id, "/processes"))).processes;
  }

  getProcess(id: string, proc: string): Promise<Process> {
    return this.t.json("GET", processPath(id, proc));
  }

  /** A process's output from sequence number fromSeq; with follow, live until it exits. */
  async *processOutput(
    id: string,
    proc: string,
    opts: { fromSeq?: number; follow?: boolean; signal?: AbortSignal } = {},
  ): AsyncGenerator<ExecEvent> {
    const res = await this.t.send("GET", processPath(id, proc, "/output"), {
      query: { from_seq: opts.fromSeq, follow: opts.follow },
      signal: opts.signal,
    });
    try {
      for await (const ev of ndjson<ExecEvent>(res)) {
        if (ev.type === "error") throw eventError(ev);
        yield ev;
      }
    } finally {
      res.destroy();
    }
  }

  async writeStdin(id: string, proc: string, data: string | Uint8Array, opts: { close?: boolean } = {}): Promise<void> {
    await this.t.bytes("POST", processPath(id, proc, "/stdin"), {
      body: data,
      contentType: "application/octet-stream",
      query: { close: opts.close },
    });
  }

  async signalProcess(id: string, proc: string, signal: string): Promise<void> {
    await this.t.bytes("POST", processPath(id, proc, "/signal"), {
      body: JSON.stringify({ signal }),
      contentType: "application/json",
    });
  }

  /** Waits for a process's exit, at most timeoutSeconds (then deadline_exceeded; it runs on). */
  waitProcess(id: string, proc: string, timeoutSeconds?: number): Promise<Process> {
    return this.t.json("POST", processPath(id, proc, "/wait"), undefined, { query: { timeout: timeoutSeconds } });
  }

  // Terminals.

  openTerminal(id: string, req: OpenTerminalRequest = {}): Promise<Process> {
    return this.t.json("POST", sandboxPath(id, "/terminals"), req);
  }

  /** Attaches to a terminal; the first output replays up to scrollback bytes. Detach with close(). */
  async attachTerminal(id: string, proc: string, opts: { scrollback?: number } = {}): Promise<TerminalConnection> {
    const { ws, opened } = this.t.websocket(sandboxPath(id, `/terminals/${encodeURIComponent(proc)}/ws`), {
      scrollback: opts.scrollback,
    });
    const conn = new TerminalConnection(ws);
    await opened;
    await conn.started;
    return conn;
  }

  async resizeTerminal(id: string, proc: string, rows: number, cols: number): Promise<void> {
    await this.t.bytes("POST", sandboxPath(id, `/terminals/${encodeURIComponent(proc)}/resize`), {
      body: JSON.stringify({ rows, cols }),
      contentType: "application/json",
    });
  }

  // Files. Relative paths are under /workspace.

  async readFile(id: string, path: string, opts: { signal?: AbortSignal } = {}): Promise<Buffer> {
    return this.t.bytes("GET", sandboxPath(id, "/files"), { query: { path }, signal: opts.signal });
  }

  /** A file's bytes, or null when it does not exist (a missing sandbox still throws). */
  async readFileIfExists(id: string, path: string, opts: { signal?: AbortSignal } = {}): Promise<Buffer | null> {
    try {
      return await this.readFile(id, path, opts);
    } catch (err) {
      if (err instanceof HutchError && err.code === "not_found" && (await this.exists(id, path)) === false) {
        return null;
      }
      throw err;
    }
  }

  /** Opens a file's bytes as a stream. */
  async openFile(id: string, path: string, opts: { signal?: AbortSignal } = {}): Promise<NodeJS.ReadableStream> {
    return this.t.send("GET", sandboxPath(id, "/files"), { query: { path }, signal: opts.signal });
  }

  /** Writes a file atomically, creating parent directories. */
  writeFile(id: string, path: string, data: Body, opts: { mode?: string; signal?: AbortSignal } = {}): Promise<FileInfo> {
    return this.t
      .bytes("PUT", sandboxPath(id, "/files"), {
        query: { path, mode: opts.mode },
        body: data ?? "",
        contentType: "application/octet-stream",
        signal: opts.signal,
      })
      .then((b) => JSON.parse(b.toString("utf8")) as FileInfo);
  }

  async removeFile(id: string, path: string, opts: { recursive?: boolean; force?: boolean } = {}): Promise<void> {
    await this.t.bytes("DELETE", sandboxPath(id, "/files"), {
      query: { path, recursive: opts.recursive, force: opts.force },
    });
  }

  stat(id: string, path: string): Promise<FileInfo> {
    return this.t.json("GET", sandboxPath(id, "/files/stat"), undefined, { query: { path } });
  }

  async exists(id: string, path: string): Promise<boolean> {
    return (await this.t.json<Schemas["Exists"]>("GET", sandboxPath(id, "/files/exists"), undefined, { query: { path } }))
      .exists;
  }

  async listFiles(id: string, path: string, opts: { depth?: number; glob?: string } = {}): Promise<FileInfo[]> {
    const list = await this.t.json<Schemas["FileList"]>("GET", sandboxPath(id, "/files/list"), undefined, {
      query: { path, depth: opts.depth, glob: opts.glob },
    });
    return list.files;
  }

  mkdir(id: string, path: string, mode?: string): Promise<FileInfo> {
    return this.t.json("POST", sandboxPath(id, "/files/mkdir"), mode === undefined ? { path } : { path, mode });
  }

  rename(id: string, from: string, to: string): Promise<FileInfo> {
    return this.t.json("POST", sandboxPath(id, "/files/rename"), { from, to });
  }

  /** A tar of the directory at path. */
  downloadArchive(id: string, path: string): Promise<Buffer> {
    return this.t.bytes("GET", sandboxPath(id, "/files/archive"), { query: { path } });
  }

  async uploadArchive(id: string, path: string, tar: Body): Promise<void> {
    await this.t.bytes("PUT", sandboxPath(id, "/files/archive"), {
      query: { path },
      body: tar,
      contentType: "application/x-tar",
    });
  }

  // Templates.

  async listTemplates(): Promise<Template[]> {
    return (await this.t.json<Schemas["TemplateList"]>("GET", "/templates")).templates;
  }

  getTemplate(name: string): Promise<Template> {
    return this.t.json("GET", `/templates/${encodeURIComponent(name)}`);
  }

  putTemplate(name: string, def: TemplateDefinition): Promise<Template> {
    return this.t.json("PUT", `/templates/${encodeURIComponent(name)}`, def);
  }

  async deleteTemplate(name: string): Promise<void> {
    await this.t.bytes("DELETE", `/templates/${encodeURIComponent(name)}`);
  }

  /** Streams a template build's events; the last is done or error. */
  async *buildTemplateEvents(name: string, opts: { signal?: AbortSignal } = {}): AsyncGenerator<TemplateBuildEvent> {
    const res = await this.t.send("POST", `/templates/${encodeURIComponent(name)}/build`, { signal: opts.signal });
    try {
      yield* ndjson<TemplateBuildEvent>(res);
    } finally {
      res.destroy();
    }
  }

  /**
   * Builds a template (or joins the build under way) and resolves with the
   * template once its generation is ready; a failed build rejects with the
   * setup output's tail in the message. onOutput gets the setup commands' output.
   */
  async buildTemplate(name: string, opts: { onOutput?: (data: Buffer) => void; signal?: AbortSignal } = {}): Promise<Template> {
    for await (const ev of this.buildTemplateEvents(name, opts)) {
      if (ev.type === "output" && ev.data) opts.onOutput?.(Buffer.from(ev.data, "base64"));
      if (ev.type === "error") throw eventError(ev as unknown as ExecEvent);
      if (ev.type === "done") return ev.template ?? (await this.getTemplate(name));
    }
    throw new HutchError("unavailable", `the build of template ${name} ended without a result`);
  }

  setTemplatePool(name: string, size: number): Promise<Template> {
    return this.t.json("PUT", `/templates/${encodeURIComponent(name)}/pool`, { size });
  }

  // Keys (local socket only).

  createKey(req: CreateKeyRequest): Promise<CreatedKey> {
    return this.t.json("POST", "/keys", req);
  }

  async listKeys(): Promise<Key[]> {
    return (await this.t.json<Schemas["KeyList"]>("GET", "/keys")).keys;
  }

  revokeKey(key: string): Promise<Key> {
    return this.t.json("DELETE", `/keys/${encodeURIComponent(key)}`);
  }
}

/**
 * A command running over a WebSocket: output in (a queue that keeps what
 * arrives before anyone reads), stdin, signals and resizes out.
 */
export class ExecSession {
  /** The process id and pid, once the daemon has started the command. */
  readonly started: Promise<{ processId: string; pid: number }>;
  /** How the command ended. Rejects when the connection drops first. */
  readonly exited: Promise<ExitInfo>;
  /** Output chunks as they arrive, ending when the command exits. */
  readonly output = new AsyncQueue<OutputChunk>();
  private listeners: Array<(chunk: OutputChunk) => void> = [];

  constructor(private readonly ws: WebSocket) {
    let resolveStart!: (v: { processId: string; pid: number }) => void;
    let rejectStart!: (e: unknown) => void;
    let resolveExit!: (v: ExitInfo) => void;
    let rejectExit!: (e: unknown) => void;
    this.started = new Promise((res, rej) => ((resolveStart = res), (rejectStart = rej)));
    this.exited = new Promise((res, rej) => ((resolveExit = res), (rejectExit = rej)));
    // Callers that only await started must not see an unhandled rejection of exited.
    this.exited.catch(() => {});
    this.started.catch(() => {});
    let ended = false;
    ws.on("message", (data: Buffer, isBinary: boolean) => {
      if (isBinary) return;
      const ev = JSON.parse(data.toString("utf8")) as ExecEvent;
      switch (ev.type) {
        case "start":
          resolveStart({ processId: ev.process_id ?? "", pid: ev.pid ?? 0 });
          break;
        case "output": {
          const chunk: OutputChunk = { stream: ev.stream ?? "stdout", data: Buffer.from(ev.data ?? "", "base64"), seq: ev.seq };
          for (const l of this.listeners) l(chunk);
          this.output.push(chunk);
          break;
        }
        case "exit":
          ended = true;
          this.output.end();
          resolveExit(exitInfo(ev));
          break;
        case "error": {
          ended = true;
          const err = eventError(ev);
          rejectStart(err);
          this.output.end(err);
          rejectExit(err);
          break;
        }
      }
    });
    ws.on("close", () => {
      if (ended) return;
      const err = new HutchError("unavailable", "the connection closed before the command exited");
      rejectStart(err);
      this.output.end(err);
      rejectExit(err);
    });
    ws.on("error", () => {
      // close follows; it settles the promises
    });
  }

  /** Calls fn with every output chunk from now on (the queue gets them too). */
  onOutput(fn: (chunk: OutputChunk) => void): void {
    this.listeners.push(fn);
  }

  private input(msg: StreamInput): void {
    if (this.ws.readyState === this.ws.OPEN) this.ws.send(JSON.stringify(msg));
  }

  write(data: string | Uint8Array): void {
    this.input({ type: "stdin", data: Buffer.from(data).toString("base64") });
  }

  closeStdin(): void {
    this.input({ type: "stdin_close" });
  }

  /** Sends a signal (a name such as "TERM" or "SIGKILL", or a number) to the command's process group. */
  signal(sig: string): void {
    this.input({ type: "signal", signal: sig });
  }

  resize(rows: number, cols: number): void {
    this.input({ type: "resize", rows, cols });
  }

  /** Hangs up; a command still running is killed by the daemon. */
  close(): void {
    this.ws.close();
  }
}

/**
 * An attachment to a terminal: its output as raw bytes, keystrokes and
 * resizes in. Closing detaches; the terminal runs on and can be attached
 * again with its scrollback.
 */
export class TerminalConnection {
  readonly started: Promise<{ processId: string; pid: number }>;
  /** The exit, if the terminal's command ends while attached; undefined when detached first. */
  readonly exited: Promise<ExitInfo | undefined>;
  readonly output = new AsyncQueue<Buffer>();
  private listeners: Array<(data: Buffer) => void> = [];

  constructor(private readonly ws: WebSocket) {
    let resolveStart!: (v: { processId: string; pid: number }) => void;
    let rejectStart!: (e: unknown) => void;
    let resolveExit!: (v: ExitInfo | undefined) => void;
    this.started = new Promise((res, rej) => ((resolveStart = res), (rejectStart = rej)));
    this.exited = new Promise((res) => (resolveExit = res));
    this.started.catch(() => {});
    ws.on("message", (data: Buffer, isBinary: boolean) => {
      if (isBinary) {
        for (const l of this.listeners) l(data);
        this.output.push(data);
        return;
      }
      const ev = JSON.parse(data.toString("utf8")) as ExecEvent;
      if (ev.type === "start") resolveStart({ processId: ev.process_id ?? "", pid: ev.pid ?? 0 });
      if (ev.type === "exit") resolveExit(exitInfo(ev));
      if (ev.type === "error") rejectStart(eventError(ev));
    });
    ws.on("close", () => {
      rejectStart(new HutchError("unavailable", "the terminal connection closed before it started"));
      this.output.end();
      resolveExit(undefined);
    });
    ws.on("error", () => {
      // close follows
    });
  }

  onData(fn: (data: Buffer) => void): void {
    this.listeners.push(fn);
  }

  /** Sends keystrokes. */
  write(data: string | Uint8Array): void {
    if (this.ws.readyState === this.ws.OPEN) this.ws.send(Buffer.from(data), { binary: true });
  }

  resize(rows: number, cols: number): void {
    if (this.ws.readyState === this.ws.OPEN) this.ws.send(JSON.stringify({ type: "resize", rows, cols } satisfies StreamInput));
  }

  /** Detaches; the terminal keeps running. */
  close(): Promise<void> {
    if (this.ws.readyState === this.ws.CLOSED) return Promise.resolve();
    return new Promise((resolve) => {
      this.ws.once("close", () => resolve());
      this.ws.close();
    });
  }
}
