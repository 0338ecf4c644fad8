/**
 * hutch as a zidane sandbox provider. Commands and streams with stdin run
 * as hutch background processes followed by sequence number, terminals are
 * hutch's detachable PTY processes (so a dropped client reconnects with its
 * scrollback), and file listings use hutch's server-side glob.
 */
import { HutchClient, type HutchClientOptions, type TerminalConnection } from "../client.js";
import { isNotFound } from "../errors.js";
import { ProcessSession } from "../process.js";
import { runCommand, seconds } from "../run.js";
import type {
  ZidaneExecOptions,
  ZidaneExecResult,
  ZidaneExecStream,
  ZidaneFileEntry,
  ZidaneListOptions,
  ZidaneOutputChunk,
  ZidaneSandbox,
  ZidaneSandboxProvider,
  ZidaneSpawnOptions,
  ZidaneTerminal,
  ZidaneTerminalOptions,
} from "./zidane-types.js";

export type * from "./zidane-types.js";

export interface HutchZidaneOptions extends HutchClientOptions {
  client?: HutchClient;
  /** A template every spawned sandbox stacks. */
  template?: string;
}

const idOf = (sb: ZidaneSandbox | string): string => (typeof sb === "string" ? sb : sb.id);

export function hutchZidaneProvider(opts: HutchZidaneOptions = {}): ZidaneSandboxProvider {
  const client = opts.client ?? new HutchClient(opts);
  return {
    name: "hutch",

    async spawn(o: ZidaneSpawnOptions = {}): Promise<ZidaneSandbox> {
      const sb = await client.createSandbox({
        template: opts.template,
        env: o.env,
        cwd: o.cwd,
        labels: o.labels,
        timeout: o.timeoutSeconds,
      });
      return { id: sb.id, cwd: sb.cwd || "/workspace" };
    },

    async exec(sandbox, command, o: ZidaneExecOptions = {}): Promise<ZidaneExecResult> {
      const res = await runCommand(
        client,
        idOf(sandbox),
        { cmd: command, cwd: o.cwd, env: o.env, timeoutSeconds: seconds(o.timeoutMs), stdin: o.stdin },
        o.signal ? { signal: o.signal } : {},
      );
      const out: ZidaneExecResult = {
        exitCode: res.exitCode,
        stdout: res.stdout.toString("utf8"),
        stderr: res.stderr.toString("utf8"),
        timedOut: res.timedOut,
      };
      if (res.signal) out.signal = res.signal;
      return out;
    },

    async execStream(sandbox, command, o = {}): Promise<ZidaneExecStream> {
      o.signal?.throwIfAborted();
      // A background process followed by sequence number: no deadline unless
      // asked, and a dropped output stream resumes where it stopped.
      const session = await ProcessSession.start(client, idOf(sandbox), {
        cmd: command,
        cwd: o.cwd,
        env: o.env,
        timeout: seconds(o.timeoutMs),
        stdin: true,
      });
      const onAbort = () => void session.kill().catch(() => {});
      o.signal?.addEventListener("abort", onAbort, { once: true });
      if (o.signal?.aborted) onAbort();
      const exit = session.exited.then((e) => {
        o.signal?.removeEventListener("abort", onAbort);
        session.detach();
        return e.signal ? { exitCode: e.exitCode, timedOut: e.timedOut, signal: e.signal } : { exitCode: e.exitCode, timedOut: e.timedOut };
      });
      exit.catch(() => {});
      return {
        pid: session.pid,
        exit,
        write: (data) => session.write(data),
        closeStdin: () => session.closeStdin(),
        kill: (sig = "KILL") => session.signal(sig),
        async *[Symbol.asyncIterator](): AsyncIterator<ZidaneOutputChunk> {
          for await (const c of session.output) yield { stream: c.stream, data: new Uint8Array(c.data) };
        },
      };
    },

    async listFiles(sandbox, path, o: ZidaneListOptions = {}): Promise<ZidaneFileEntry[]> {
      const depth = o.depth ?? (o.glob ? 16 : 1);
      // hutch matches a glob against the relative path or the base name, so
      // "**/*.ts" (one or more directories deep, in path.Match) is "*.ts".
      let glob = o.glob;
      while (glob?.startsWith("**/") && !glob.slice(3).includes("/")) glob = glob.slice(3);
      const files = await client.listFiles(idOf(sandbox), path, { depth, glob });
      return files.map((f) => ({ path: f.path, name: f.name, type: f.type ?? (f.is_dir ? "dir" : "file"), size: f.size }));
    },

    async readFile(sandbox, path): Promise<Uint8Array> {
      return new Uint8Array(await client.readFile(idOf(sandbox), path));
    },

    async writeFile(sandbox, path, content): Promise<void> {
      await client.writeFile(idOf(sandbox), path, content);
    },

    async openTerminal(sandbox, o: ZidaneTerminalOptions = {}): Promise<ZidaneTerminal> {
      const id = idOf(sandbox);
      const p = await client.openTerminal(id, { cmd: o.command, cwd: o.cwd, env: o.env, rows: o.rows, cols: o.cols });
      return terminal(client, id, p.id, await client.attachTerminal(id, p.id));
    },

    async reconnectTerminal(sandbox, terminalId, o = {}): Promise<ZidaneTerminal> {
      const id = idOf(sandbox);
      return terminal(client, id, terminalId, await client.attachTerminal(id, terminalId, { scrollback: o.scrollback }));
    },

    async destroy(sandbox): Promise<void> {
      try {
        await client.deleteSandbox(idOf(sandbox));
      } catch (err) {
        if (!isNotFound(err)) throw err;
      }
    },
  };
}

function terminal(client: HutchClient, sandboxId: string, id: string, conn: TerminalConnection): ZidaneTerminal {
  return {
    id,
    exit: conn.exited.then((e) =>
      e === undefined ? undefined : e.signal ? { exitCode: e.exitCode, timedOut: e.timedOut, signal: e.signal } : { exitCode: e.exitCode, timedOut: e.timedOut },
    ),
    write: (data) => conn.write(data),
    resize: (rows, cols) => client.resizeTerminal(sandboxId, id, rows, cols),
    detach: () => conn.close(),
    async *[Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
      for await (const b of conn.output) yield new Uint8Array(b);
    },
  };
}
