/**
 * ProcessSession: a command run as a hutch background process and followed
 * through its numbered output log. The adapters use it where a command must
 * not be cut short: the exec endpoints always have a deadline (the daemon's
 * default is 300 s), while a process runs until it exits unless given a
 * timeout, and a dropped output stream is picked up again from the next
 * sequence number instead of losing the command.
 */
import type { ExitInfo, HutchClient, OutputChunk, Process, StartProcessRequest } from "./client.js";
import { exitInfo } from "./client.js";
import { HutchError } from "./errors.js";
import { AsyncQueue } from "./queue.js";

/** How many times in a row a broken output stream is reopened before giving up. */
const maxReattach = 5;

export class ProcessSession {
  readonly output = new AsyncQueue<OutputChunk>();
  /** How the process ended; rejects only if its output can no longer be followed. */
  readonly exited: Promise<ExitInfo>;
  private readonly follow = new AbortController();
  private stdinChain: Promise<void> = Promise.resolve();
  private done = false;

  private constructor(
    private readonly client: HutchClient,
    readonly sandboxId: string,
    readonly process: Process,
  ) {
    this.exited = this.pump();
    this.exited.catch(() => {});
  }

  /** Starts req as a background process and follows its output from the start. */
  static async start(client: HutchClient, sandboxId: string, req: StartProcessRequest): Promise<ProcessSession> {
    const p = await client.startProcess(sandboxId, req);
    return new ProcessSession(client, sandboxId, p);
  }

  get pid(): number {
    return this.process.pid;
  }

  private async pump(): Promise<ExitInfo> {
    let next = 0;
    let failures = 0;
    for (;;) {
      let cause: unknown = new HutchError("unavailable", `the output of process ${this.process.id} keeps ending before its exit`);
      try {
        for await (const ev of this.client.processOutput(this.sandboxId, this.process.id, {
          fromSeq: next,
          follow: true,
          signal: this.follow.signal,
        })) {
          if (ev.type === "output") {
            failures = 0; // progress: the retries count again from here
            next = ev.seq + 1;
            this.output.push({ stream: ev.stream ?? "stdout", data: Buffer.from(ev.data ?? "", "base64"), seq: ev.seq });
          } else if (ev.type === "exit") {
            this.done = true;
            this.output.end();
            return exitInfo(ev);
          }
        }
      } catch (err) {
        // Detached, or an answer (a gone sandbox, a bad key) that no retry changes.
        if (this.follow.signal.aborted || (err instanceof HutchError && err.code !== "unavailable")) {
          this.output.end(err);
          throw err;
        }
        cause = err;
      }
      // The stream broke or ended without an exit: follow again from where
      // it stopped, a bounded number of times in a row.
      if (++failures > maxReattach) {
        this.output.end(cause);
        throw cause;
      }
      await new Promise((r) => setTimeout(r, 50 * failures));
    }
  }

  /** Queues bytes for the process's stdin (it must have been started with stdin: true). */
  write(data: string | Uint8Array): Promise<void> {
    const b = Buffer.from(data);
    this.stdinChain = this.stdinChain.then(() => this.client.writeStdin(this.sandboxId, this.process.id, b));
    return this.stdinChain;
  }

  /** Closes stdin after what was queued. */
  closeStdin(): Promise<void> {
    this.stdinChain = this.stdinChain.then(() => this.client.writeStdin(this.sandboxId, this.process.id, "", { close: true }));
    return this.stdinChain;
  }

  /** Signals the process group; a process that has exited already is no error. */
  async signal(sig: string): Promise<void> {
    if (this.done) return;
    try {
      await this.client.signalProcess(this.sandboxId, this.process.id, sig);
    } catch (err) {
      // It may have exited between the check and the signal.
      if (!(err instanceof HutchError && (err.code === "failed_precondition" || err.code === "not_found" || err.code === "conflict"))) throw err;
    }
  }

  /** Kills the process and waits for its exit. */
  async kill(): Promise<ExitInfo> {
    await this.signal("KILL");
    return this.exited;
  }

  /** Stops following the output; the process runs on. */
  detach(): void {
    this.follow.abort(new HutchError("unavailable", "detached"));
  }
}
