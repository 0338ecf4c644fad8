/**
 * runCommand: a streamed exec collected to its end. The adapters use it
 * rather than the buffered exec endpoint because that one caps output
 * (64 KiB by default) and an agent's tool wants all of it.
 */
import type { ExecRequest, ExitInfo, HutchClient, OutputChunk } from "./client.js";
import { exitInfo } from "./client.js";
import { HutchError } from "./errors.js";

export interface RunResult extends ExitInfo {
  stdout: Buffer;
  stderr: Buffer;
}

export interface RunOptions {
  /** Aborting hangs up, which makes the daemon kill the command; runCommand then rejects with the signal's reason. */
  signal?: AbortSignal;
  onOutput?: (chunk: OutputChunk) => void;
}

export async function runCommand(client: HutchClient, id: string, req: ExecRequest, opts: RunOptions = {}): Promise<RunResult> {
  const stdout: Buffer[] = [];
  const stderr: Buffer[] = [];
  opts.signal?.throwIfAborted();
  try {
    for await (const ev of client.execStream(id, req, { signal: opts.signal })) {
      if (ev.type === "output") {
        const chunk: OutputChunk = { stream: ev.stream ?? "stdout", data: Buffer.from(ev.data ?? "", "base64"), seq: ev.seq };
        (chunk.stream === "stderr" ? stderr : stdout).push(chunk.data);
        opts.onOutput?.(chunk);
      } else if (ev.type === "exit") {
        return { ...exitInfo(ev), stdout: Buffer.concat(stdout), stderr: Buffer.concat(stderr) };
      }
    }
  } catch (err) {
    if (opts.signal?.aborted) throw opts.signal.reason;
    throw err;
  }
  if (opts.signal?.aborted) throw opts.signal.reason;
  throw new HutchError("unavailable", "the command's stream ended without an exit");
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
