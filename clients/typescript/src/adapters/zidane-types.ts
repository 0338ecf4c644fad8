/**
 * The zidane sandbox-provider shape, declared by hutch: zidane's own types
 * are not installable from the npm registry this project builds from, so
 * this file states the interface the adapter implements (spawn, exec,
 * execStream with stdin both ways, listFiles with a glob, readFile,
 * writeFile, openTerminal, reconnectTerminal, destroy). A provider is
 * stateless; every call names the sandbox it acts on.
 */

export interface ZidaneSandbox {
  readonly id: string;
  /** Where relative paths resolve and commands start. */
  readonly cwd: string;
}

export interface ZidaneSpawnOptions {
  env?: Record<string, string>;
  cwd?: string;
  labels?: Record<string, string>;
  /** Seconds of running time before the sandbox is destroyed; 0 or undefined: none. */
  timeoutSeconds?: number;
}

export interface ZidaneExecOptions {
  cwd?: string;
  env?: Record<string, string>;
  timeoutMs?: number;
  /** Given to the command on stdin, then closed. */
  stdin?: string | Uint8Array;
  signal?: AbortSignal;
}

export interface ZidaneExecResult {
  exitCode: number | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  signal?: string;
}

export interface ZidaneOutputChunk {
  stream: "stdout" | "stderr";
  data: Uint8Array;
}

export interface ZidaneExit {
  exitCode: number | null;
  timedOut: boolean;
  signal?: string;
}

/** A running command: output out, stdin in, while it runs. */
export interface ZidaneExecStream extends AsyncIterable<ZidaneOutputChunk> {
  readonly pid: number;
  /** Resolves once the bytes are in the command's stdin; writes keep their order. */
  write(data: string | Uint8Array): Promise<void>;
  /** Closes stdin after what was written. */
  closeStdin(): Promise<void>;
  /** Signals the command's process group (default KILL); an exited command is no error. */
  kill(signal?: string): Promise<void>;
  /** Resolves when the command exits. */
  readonly exit: Promise<ZidaneExit>;
}

export interface ZidaneFileEntry {
  /** Absolute path in the sandbox. */
  path: string;
  name: string;
  type: "file" | "dir" | "symlink" | "other";
  size: number;
}

export interface ZidaneListOptions {
  /**
   * Only entries whose path relative to the listed directory, or whose
   * name, matches (path.Match syntax: "*.ts" finds .ts files at any depth,
   * "src/*.ts" only directly in src). A leading "**\/" is accepted and means
   * the same as without it.
   */
  glob?: string;
  /** How deep to descend; default 1 without a glob and 16 with one. */
  depth?: number;
}

export interface ZidaneTerminalOptions {
  command?: string;
  cwd?: string;
  env?: Record<string, string>;
  rows?: number;
  cols?: number;
}

/** A terminal attachment. Detaching leaves the terminal running for reconnectTerminal. */
export interface ZidaneTerminal extends AsyncIterable<Uint8Array> {
  readonly id: string;
  write(data: string | Uint8Array): void;
  resize(rows: number, cols: number): Promise<void>;
  detach(): Promise<void>;
  /** The exit, if the terminal's command ends while attached; undefined when detached first. */
  readonly exit: Promise<ZidaneExit | undefined>;
}

export interface ZidaneSandboxProvider {
  readonly name: string;
  spawn(options?: ZidaneSpawnOptions): Promise<ZidaneSandbox>;
  exec(sandbox: ZidaneSandbox | string, command: string, options?: ZidaneExecOptions): Promise<ZidaneExecResult>;
  execStream(sandbox: ZidaneSandbox | string, command: string, options?: Omit<ZidaneExecOptions, "stdin">): Promise<ZidaneExecStream>;
  listFiles(sandbox: ZidaneSandbox | string, path: string, options?: ZidaneListOptions): Promise<ZidaneFileEntry[]>;
  readFile(sandbox: ZidaneSandbox | string, path: string): Promise<Uint8Array>;
  writeFile(sandbox: ZidaneSandbox | string, path: string, content: string | Uint8Array): Promise<void>;
  openTerminal(sandbox: ZidaneSandbox | string, options?: ZidaneTerminalOptions): Promise<ZidaneTerminal>;
  /** Attaches again to a terminal opened earlier (by its id), replaying up to scrollback bytes of its recent output. */
  reconnectTerminal(sandbox: ZidaneSandbox | string, terminalId: string, options?: { scrollback?: number }): Promise<ZidaneTerminal>;
  destroy(sandbox: ZidaneSandbox | string): Promise<void>;
}
