/**
 * The shapes of Rivet's `@rivet-dev/sandbox-adapter` (SandboxProvider,
 * Sandbox, their options and results), declared here because that package
 * cannot be installed from the npm registry this project builds from. They
 * are written from the package's source (github.com/rivet-dev/agents,
 * packages/sandbox-adapter) so that a hutch provider is assignable to the
 * real interface; the adapter is type-checked against these declarations.
 */

/** What a provider receives from the owning Rivet Actor. */
export interface SandboxActorContext {
  readonly actorId: string;
  client(): unknown;
}

export interface SandboxExecOptions {
  /** Absolute working directory inside the sandbox. */
  cwd: string;
  env?: Record<string, string>;
  /** Kill the process after this many milliseconds; undefined or 0: no timeout. */
  timeoutMs?: number;
  /** Aborting kills the process and rejects exec with Error("aborted"). */
  signal?: AbortSignal;
  /** stdout and stderr chunks as they arrive. */
  onData?: (chunk: Uint8Array) => void;
}

export interface SandboxExecResult {
  /** null when the process was killed by a signal or timed out. */
  exitCode: number | null;
  timedOut: boolean;
  stdout: string;
  stderr: string;
}

/** The file and shell operations an agent's tools run against; paths are absolute. */
export interface Sandbox {
  readonly cwd: string;
  exec(command: string, options: SandboxExecOptions): Promise<SandboxExecResult>;
  readFile(path: string): Promise<Uint8Array>;
  writeFile(path: string, content: string): Promise<void>;
  mkdir(path: string): Promise<void>;
  stat(path: string): Promise<{ isDirectory: boolean }>;
  readdir(path: string): Promise<string[]>;
  exists(path: string): Promise<boolean>;
}

/** Creates, reconnects, suspends and destroys an actor's one sandbox; the caller stores its id. */
export interface SandboxProvider {
  readonly name: string;
  create(c: SandboxActorContext): Promise<string>;
  /** undefined when the sandbox no longer exists. */
  connect(c: SandboxActorContext, id: string): Promise<Sandbox | undefined>;
  suspend?(c: SandboxActorContext, id: string): Promise<void>;
  destroy?(c: SandboxActorContext, id: string): Promise<void>;
}
