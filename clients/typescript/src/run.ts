/**
 * runCommand: a command run to its end with all of its output. It runs as a
 * background process (see ProcessSession) rather than through the exec
 * endpoints, because those cap buffered output and always impose a
 * deadline, while the adapters' interfaces promise "no timeout" when none
 * is given.
 */
import type { ExitInfo, HutchClient, OutputChunk } from "./client.js";
import { ProcessSession } from "./process.js";

export interface RunResult extends ExitInfo {
  stdout: Buffer;
  stderr: Buffer;
}

export interface RunRequest {
  cmd: string;
  cwd?: string;
  env?: Record<string, string>;
  /** Seconds until the daemon kills it (then timedOut); undefined or 0: it runs until it exits. */
  timeoutSeconds?: number;
  /** Given to the command on stdin, then closed; without it stdin is empty. */
  stdin?: string | Uint8Array;
}

export interface RunOptions {
  /** Aborting kills the command; runCommand then rejects with the signal's reason. */
  signal?: AbortSignal;
  onOutput?: (chunk: OutputChunk) => void;
}

export async function runCommand(client: HutchClient, id: string, req: RunRequest, opts: RunOptions = {}): Promise<RunResult> {
  opts.signal?.throwIfAborted();
  const session = await ProcessSession.start(client, id, {
    cmd: req.cmd,
    cwd: req.cwd,
    env: req.env,
    timeout: req.timeoutSeconds,
    stdin: req.stdin !== undefined,
  });
  const onAbort = () => void session.kill().catch(() => {});
  opts.signal?.addEventListener("abort", onAbort, { once: true });
  if (opts.signal?.aborted) onAbort();
  try {
    if (req.stdin !== undefined) {
      await session.write(req.stdin);
      await session.closeStdin();
    }
    const stdout: Buffer[] = [];
    const stderr: Buffer[] = [];
    for await (const chunk of session.output) {
      (chunk.stream === "stderr" ? stderr : stdout).push(chunk.data);
      opts.onOutput?.(chunk);
    }
    const exit = await session.exited;
    opts.signal?.throwIfAborted();
    return { ...exit, stdout: Buffer.concat(stdout), stderr: Buffer.concat(stderr) };
  } catch (err) {
    opts.signal?.throwIfAborted();
    await session.kill().catch(() => {});
    throw err;
  } finally {
    opts.signal?.removeEventListener("abort", onAbort);
    session.detach();
  }
}

/** Seconds for the API from milliseconds; undefined or 0 means the daemon's default. */
export function seconds(ms: number | undefined): number | undefined {
  return ms ? ms / 1000 : undefined;
}

/** Signal numbers of the names the agent reports, for a shell-style 128+N exit code. */
const signalNumbers: Record<string, number> = {
  SIGHUP: 1, SIGINT: 2, SIGQUIT: 3, SIGILL: 4, SIGTRAP: 5, SIGABRT: 6, SIGBUS: 7, SIGFPE: 8, SIGKILL: 9,
  SIGUSR1: 10, SIGSEGV: 11, SIGUSR2: 12, SIGPIPE: 13, SIGALRM: 14, SIGTERM: 15,
};

/**
 * A number for interfaces whose exit code cannot be null: the code, else
 * 128+N for signal N (as a shell reports it), else 124 for a timeout (as
 * timeout(1) does), else -1.
 */
export function numericExitCode(e: ExitInfo): number {
  if (e.exitCode !== null) return e.exitCode;
  const n = e.signal ? signalNumbers[e.signal.startsWith("SIG") ? e.signal : `SIG${e.signal}`] : undefined;
  if (n !== undefined) return 128 + n;
  if (e.timedOut) return 124;
  return -1;
}
