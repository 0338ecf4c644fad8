/**
 * hutch as a Rivet sandbox-adapter provider: each Rivet Actor gets its own
 * hutch sandbox, labelled with the actor's id. Sleep suspends it (its files
 * are kept, processes are not), wake reconnects (any call resumes it), and
 * destroying the actor destroys it.
 */
import { HutchClient, type CreateSandboxRequest, type FileInfo, type HutchClientOptions } from "../client.js";
import { HutchError, isNotFound } from "../errors.js";
import { runCommand, seconds } from "../run.js";
import type { Sandbox, SandboxActorContext, SandboxExecOptions, SandboxExecResult, SandboxProvider } from "./rivet-types.js";

export type * from "./rivet-types.js";

export interface HutchRivetOptions extends HutchClientOptions {
  /** A client to use instead of one made from host/apiKey. */
  client?: HutchClient;
  /** What each new sandbox is created with (template, env, limits, timers…). */
  sandbox?: CreateSandboxRequest;
}

/** The Sandbox with hutch's fuller stat. */
export interface HutchRivetSandbox extends Sandbox {
  readonly id: string;
  stat(path: string): Promise<{ isDirectory: boolean; isFile: boolean; size: number; mode: string; modifiedAt: Date }>;
  writeFile(path: string, content: string | Uint8Array): Promise<void>;
}

/** States in which a sandbox no longer exists for an actor. */
const gone = new Set(["destroyed", "failed"]);

export function hutchProvider(opts: HutchRivetOptions = {}): SandboxProvider {
  const client = opts.client ?? new HutchClient(opts);
  return {
    name: "hutch",
    async create(c: SandboxActorContext): Promise<string> {
      const req = opts.sandbox ?? {};
      const sb = await client.createSandbox({ ...req, labels: { ...req.labels, "rivet.actor": c.actorId } });
      return sb.id;
    },
    async connect(_c: SandboxActorContext, id: string): Promise<HutchRivetSandbox | undefined> {
      let sb;
      try {
        sb = await client.getSandbox(id);
      } catch (err) {
        if (isNotFound(err)) return undefined;
        throw err;
      }
      if (gone.has(sb.state)) return undefined;
      return hutchSandbox(client, id, sb.cwd || "/workspace");
    },
    async suspend(_c: SandboxActorContext, id: string): Promise<void> {
      try {
        await client.suspendSandbox(id);
      } catch (err) {
        // Already asleep (suspended or retired) or gone: nothing to release.
        if (isNotFound(err)) return;
        if (err instanceof HutchError && err.code === "conflict" && err.from && ["suspended", "retired", "destroyed", "failed"].includes(err.from)) return;
        throw err;
      }
    },
    async destroy(_c: SandboxActorContext, id: string): Promise<void> {
      try {
        await client.deleteSandbox(id);
      } catch (err) {
        if (!isNotFound(err)) throw err;
      }
    },
  };
}

function hutchSandbox(client: HutchClient, id: string, cwd: string): HutchRivetSandbox {
  return {
    id,
    cwd,
    async exec(command: string, options: SandboxExecOptions): Promise<SandboxExecResult> {
      const signal = options.signal;
      if (signal?.aborted) throw new Error("aborted");
      try {
        const res = await runCommand(
          client,
          id,
          { cmd: command, cwd: options.cwd, env: options.env, timeoutSeconds: seconds(options.timeoutMs) },
          { signal, onOutput: options.onData && ((c) => options.onData?.(c.data)) },
        );
        const timedOut = res.timedOut;
        return {
          exitCode: timedOut ? null : res.exitCode,
          timedOut,
          stdout: res.stdout.toString("utf8"),
          stderr: res.stderr.toString("utf8"),
        };
      } catch (err) {
        if (signal?.aborted) throw new Error("aborted", { cause: err });
        throw err;
      }
    },
    async readFile(path: string): Promise<Uint8Array> {
      return new Uint8Array(await client.readFile(id, path));
    },
    async writeFile(path: string, content: string | Uint8Array): Promise<void> {
      await client.writeFile(id, path, content);
    },
    async mkdir(path: string): Promise<void> {
      await client.mkdir(id, path);
    },
    async stat(path: string) {
      const fi: FileInfo = await client.stat(id, path);
      return {
        isDirectory: fi.is_dir,
        isFile: fi.type === "file",
        size: fi.size,
        mode: fi.mode,
        modifiedAt: new Date(fi.modified_at),
      };
    },
    async readdir(path: string): Promise<string[]> {
      return (await client.listFiles(id, path)).map((f) => f.name);
    },
    exists(path: string): Promise<boolean> {
      return client.exists(id, path);
    },
  };
}
