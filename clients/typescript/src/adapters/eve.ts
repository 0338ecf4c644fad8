/**
 * hutch as an eve sandbox provider. `prepare` builds a hutch template from
 * the environment's recipe and eve's workspace and skill trees (and, with an
 * authored `prepare` callback, snapshots a sandbox it ran in); the artifact
 * is that template and its generation. `start` creates a sandbox from it and
 * keeps only `{sandboxId}` as state; `resume` reconnects to that sandbox and
 * fails if it is gone; `onSessionEnd` destroys it, idempotently.
 *
 * Export the definition through eve's own `defineSandboxProvider`:
 *
 *     import { defineSandboxProvider } from "eve/sandbox/provider";
 *     import { hutchSandboxProvider } from "@hutch-dev/client/eve";
 *     export const HutchSandbox = defineSandboxProvider(hutchSandboxProvider);
 *
 * Only eve's types are imported here, so this module loads without eve.
 */
import { createHash } from "node:crypto";
import { posix } from "node:path";
import { Readable } from "node:stream";
import type { SandboxNetworkPolicy, SandboxProcess, SandboxRunOptions, SandboxSession, SandboxSpawnOptions } from "eve/sandbox";
import type {
  SandboxDeleteOptions,
  SandboxProviderDefinition,
  SandboxProviderHandle,
  SandboxProviderImplementation,
  SandboxProviderPrepareContext,
  SandboxProviderResources,
} from "eve/sandbox/provider";
import {
  HutchClient,
  type CreateSandboxRequest,
  type HutchClientOptions,
  type NetworkPolicy,
  type Sandbox,
  type TemplateDefinition,
  type TemplateFile,
} from "../client.js";
import { HutchError, isNotFound } from "../errors.js";
import { ProcessSession } from "../process.js";
import { numericExitCode, runCommand } from "../run.js";

export interface HutchEveEnvironmentOptions extends HutchClientOptions {
  client?: HutchClient;
  /** Prefix of the template names prepare makes (a hash of the inputs follows). Default "eve". */
  name?: string;
  /** host (default), dir:/path or oci:/path (the last two on the local socket only). */
  base?: string;
  /** Commands run in order while the template is built. */
  setup?: string[];
  /** The network the setup commands get (e.g. a package registry); default deny-all. */
  buildNetwork?: SandboxNetworkPolicy;
  /** For the setup commands and every sandbox. */
  env?: Record<string, string>;
  limits?: TemplateDefinition["limits"];
  /** Authored preparation: runs once per artifact in a sandbox whose files become the artifact. */
  prepare?: (sandbox: HutchEveSession) => Promise<void>;
  /** Timers and labels for session sandboxes (timeout, idle_timeout, retire_after, on_timeout…). */
  sandbox?: Pick<CreateSandboxRequest, "timeout" | "on_timeout" | "idle_timeout" | "retire_after" | "labels" | "metadata">;
  /** Seconds a run() or spawn() may take before the daemon kills it; default: no limit. */
  commandTimeoutSeconds?: number;
  /** Told when onSessionEnd destroys a sandbox (whose reason becomes "deleted: eve session REASON"). */
  onSessionEnd?: (sandboxId: string, reason: "completed" | "expired" | "failed") => void | Promise<void>;
}

export interface HutchEveOpenOptions {
  networkPolicy?: SandboxNetworkPolicy;
  env?: Record<string, string>;
  labels?: Record<string, string>;
}

/** The prepared artifact: a hutch template and the generation prepare made. */
export type HutchEveArtifact = { template: string; generation: string };

/** The persisted session state: the sandbox, nothing more. */
export type HutchEveState = { sandboxId: string };

/** eve's session surface plus a live network policy change. */
export type HutchEveSession = SandboxSession & {
  readonly sandboxId: string;
  setNetworkPolicy(policy: SandboxNetworkPolicy): Promise<void>;
};

type Implementation = SandboxProviderImplementation<HutchEveOpenOptions, HutchEveArtifact, HutchEveState, HutchEveSession>;

/** The eve provider definition; pass it to eve's defineSandboxProvider. */
export const hutchSandboxProvider: SandboxProviderDefinition<
  HutchEveEnvironmentOptions,
  HutchEveOpenOptions,
  HutchEveArtifact,
  HutchEveState,
  HutchEveSession
> = {
  name: "hutch",
  stateProtocolVersion: 1,
  environment: (options?: Readonly<HutchEveEnvironmentOptions>) => hutchEnvironment(options ?? {}),
};

/** The provider implementation for one environment's options. */
export function hutchEnvironment(options: Readonly<HutchEveEnvironmentOptions>): Implementation {
  const client = options.client ?? new HutchClient(options);
  return {
    prepare: (ctx) => prepare(client, options, ctx),

    async start(ctx, open, artifact) {
      const sb = await client.createSandbox({
        ...options.sandbox,
        template: artifact.template,
        env: open?.env,
        labels: { ...options.sandbox?.labels, ...open?.labels, "eve.session": ctx.session.id },
        // The policy is part of the create, so the sandbox never runs under another.
        network: open?.networkPolicy === undefined ? undefined : toHutchPolicy(open.networkPolicy),
      });
      if (sb.generation !== artifact.generation) {
        await client.deleteSandbox(sb.id).catch(() => {});
        throw new HutchError(
          "failed_precondition",
          `hutch template ${artifact.template} is at generation ${sb.generation ?? "(none)"}, not the prepared ${artifact.generation}: rebuild or redeploy to prepare it again`,
        );
      }
      return { handle: makeHandle(client, options, sb.id), state: { sandboxId: sb.id } };
    },

    async resume(_ctx, _artifact, state) {
      let sb: Sandbox;
      try {
        sb = await client.getSandbox(state.sandboxId);
      } catch (err) {
        if (isNotFound(err)) {
          throw new HutchError("not_found", `the session's hutch sandbox ${state.sandboxId} is gone; it cannot be resumed`, { cause: err });
        }
        throw err;
      }
      if (sb.state === "destroyed" || sb.state === "failed") {
        throw new HutchError(
          "failed_precondition",
          `the session's hutch sandbox ${sb.id} is ${sb.state}${sb.reason ? ` (${sb.reason})` : ""}; it cannot be resumed`,
        );
      }
      if (sb.state !== "running") await client.resumeSandbox(sb.id);
      return makeHandle(client, options, sb.id);
    },

    async onSessionEnd(_ctx, _artifact, state, { reason }) {
      await destroy(client, state.sandboxId, `eve session ${reason}`);
      await options.onSessionEnd?.(state.sandboxId, reason);
    },
  };
}

async function destroy(client: HutchClient, id: string, reason?: string): Promise<void> {
  try {
    await client.deleteSandbox(id, reason);
  } catch (err) {
    if (!isNotFound(err)) throw err;
  }
}

// Preparation.

function resourceFiles(resources: SandboxProviderResources): TemplateFile[] {
  const files: TemplateFile[] = [];
  for (const tree of [resources.workspace, resources.skills]) {
    for (const f of tree?.files ?? []) {
      const path = posix.join(tree!.targetPath, f.relativePath);
      files.push(
        typeof f.content === "string"
          ? { path, content: f.content }
          : { path, content: Buffer.from(f.content).toString("base64"), encoding: "base64" },
      );
    }
  }
  return files;
}

/** A template name from the prefix and a hash of everything that shapes the artifact. */
function templateName(prefix: string, def: TemplateDefinition, ctx: SandboxProviderPrepareContext, authored: boolean): string {
  const h = createHash("sha256")
    .update(JSON.stringify({ def, revision: ctx.sourceRevision, source: ctx.resources.source, authored }))
    .digest("hex")
    .slice(0, 16);
  return `${prefix.toLowerCase().replace(/[^a-z0-9._-]/g, "-").slice(0, 40)}-${h}`;
}

async function prepare(client: HutchClient, options: HutchEveEnvironmentOptions, ctx: SandboxProviderPrepareContext): Promise<HutchEveArtifact> {
  const def: TemplateDefinition = {
    base: options.base,
    setup: options.setup,
    env: options.env,
    limits: options.limits,
    cwd: "/workspace",
    files: resourceFiles(ctx.resources),
  };
  if (options.buildNetwork !== undefined) def.build_network = toHutchPolicy(options.buildNetwork);
  const name = templateName(options.name ?? "eve", def, ctx, options.prepare !== undefined);
  await client.putTemplate(name, def);
  const built = await client.buildTemplate(name, {
    onOutput: (data) => ctx.log?.(data.toString("utf8").trimEnd()),
  });
  if (!built.generation) throw new HutchError("internal", `template ${name} built without a generation`);
  if (!options.prepare) return { template: name, generation: built.generation };

  // A snapshot's generation is new each time, so one already made for these
  // inputs is the artifact: preparing twice does not redo the authored work.
  const snapName = `${name}-p`;
  try {
    const snap = await client.getTemplate(snapName);
    if (snap.status === "ready" && snap.generation) return { template: snapName, generation: snap.generation };
  } catch (err) {
    if (!isNotFound(err)) throw err;
  }
  const sb = await client.createSandbox({ template: name, labels: { "eve.prepare": name }, idle_timeout: -1 });
  try {
    await options.prepare(makeSession(client, options, sb.id, new Set()));
    const snap = await client.snapshotSandbox(sb.id, snapName);
    if (!snap.generation) throw new HutchError("internal", `snapshot template ${snapName} has no generation`);
    return { template: snapName, generation: snap.generation };
  } finally {
    await destroy(client, sb.id);
  }
}

// The live session.

function makeHandle(client: HutchClient, options: HutchEveEnvironmentOptions, id: string): SandboxProviderHandle<HutchEveSession> {
  const live = new Set<ProcessSession>();
  // Spawned processes whose handles are about to go away are killed: no one
  // could wait for or stop them later, and they would keep the sandbox busy.
  const killAll = () => Promise.all([...live].map((s) => s.kill().catch(() => {})));
  return {
    sandbox: makeSession(client, options, id, live),
    // The runtime is going away; the sandbox stays for resume.
    async onRuntimeShutdown() {
      await killAll();
    },
    // Stop keeps the session's files (a suspend archives them) and lets
    // processes go; any later call resumes the sandbox.
    async onSandboxStop() {
      await killAll();
      try {
        await client.suspendSandbox(id);
      } catch (err) {
        if (!(err instanceof HutchError && err.code === "conflict" && (err.from === "suspended" || err.from === "retired"))) throw err;
      }
    },
    async onSandboxDelete(_opts?: SandboxDeleteOptions) {
      for (const s of live) s.detach();
      await destroy(client, id);
    },
  };
}

const AGENT_ENV = { AI_AGENT: "eve" };

function resolvePath(path: string): string {
  return posix.isAbsolute(path) ? posix.normalize(path) : posix.join("/workspace", path);
}

function makeSession(client: HutchClient, options: HutchEveEnvironmentOptions, id: string, live: Set<ProcessSession>): HutchEveSession {
  const readBytes = async (path: string, signal?: AbortSignal): Promise<Buffer | null> =>
    client.readFileIfExists(id, resolvePath(path), signal ? { signal } : {});
  const write = async (path: string, content: string | Uint8Array | ReadableStream<Uint8Array>, signal?: AbortSignal) => {
    await client.writeFile(id, resolvePath(path), content, signal ? { signal } : {});
  };

  const session: HutchEveSession = {
    sandboxId: id,
    resolvePath,

    async run(o: SandboxRunOptions) {
      const res = await runCommand(
        client,
        id,
        {
          cmd: o.command,
          cwd: o.workingDirectory === undefined ? undefined : resolvePath(o.workingDirectory),
          env: { ...AGENT_ENV, ...o.env },
          timeoutSeconds: options.commandTimeoutSeconds,
        },
        o.abortSignal ? { signal: o.abortSignal } : {},
      );
      return { exitCode: numericExitCode(res), stdout: res.stdout.toString("utf8"), stderr: res.stderr.toString("utf8") };
    },

    spawn: ((o: SandboxSpawnOptions) => spawn(client, options, id, live, o)) as HutchEveSession["spawn"],

    async readFile({ path, abortSignal }) {
      const b = await readBytes(path, abortSignal);
      return b === null ? null : (Readable.toWeb(Readable.from([b])) as unknown as ReadableStream<Uint8Array>);
    },

    async readBinaryFile({ path, abortSignal }) {
      const b = await readBytes(path, abortSignal);
      return b === null ? null : new Uint8Array(b);
    },

    async readTextFile({ path, abortSignal, encoding, startLine, endLine }) {
      const b = await readBytes(path, abortSignal);
      if (b === null) return null;
      const enc = (encoding ?? "utf-8").toLowerCase();
      const text = enc === "utf-8" || enc === "utf8" ? new TextDecoder("utf-8", { fatal: true }).decode(b) : b.toString(enc as BufferEncoding);
      if (startLine === undefined && endLine === undefined) return text;
      const lines = text.split(/(?<=\n)/);
      return lines.slice(Math.max(0, (startLine ?? 1) - 1), endLine).join("");
    },

    async writeFile({ path, content, abortSignal }) {
      await write(path, content, abortSignal);
    },

    async writeBinaryFile({ path, content, abortSignal }) {
      await write(path, content, abortSignal);
    },

    async writeTextFile({ path, content, encoding, abortSignal }) {
      await write(path, Buffer.from(content, (encoding ?? "utf-8") as BufferEncoding), abortSignal);
    },

    async removePath({ path, force, recursive }) {
      await client.removeFile(id, resolvePath(path), { force, recursive });
    },

    async setNetworkPolicy(policy: SandboxNetworkPolicy) {
      await client.setNetworkPolicy(id, toHutchPolicy(policy));
    },
  };
  return session;
}

async function spawn(
  client: HutchClient,
  options: HutchEveEnvironmentOptions,
  id: string,
  live: Set<ProcessSession>,
  o: SandboxSpawnOptions,
): Promise<SandboxProcess & { stdin?: WritableStream<Uint8Array> }> {
  o.abortSignal?.throwIfAborted();
  // A background process, not a WebSocket exec: a long-running spawn (a dev
  // server, a watcher) has no deadline and outlives a dropped connection.
  const session = await ProcessSession.start(client, id, {
    cmd: o.command,
    cwd: o.workingDirectory === undefined ? undefined : resolvePath(o.workingDirectory),
    env: { ...AGENT_ENV, ...o.env },
    timeout: options.commandTimeoutSeconds,
    stdin: o.stdin === true,
  });
  live.add(session);

  let out!: ReadableStreamDefaultController<Uint8Array>;
  let err!: ReadableStreamDefaultController<Uint8Array>;
  const stdout = new ReadableStream<Uint8Array>({ start: (c) => void (out = c) });
  const stderr = new ReadableStream<Uint8Array>({ start: (c) => void (err = c) });
  void (async () => {
    try {
      for await (const c of session.output) (c.stream === "stderr" ? err : out).enqueue(new Uint8Array(c.data));
      out.close();
      err.close();
    } catch (e) {
      out.error(e);
      err.error(e);
    }
  })();

  const exited = session.exited.finally(() => {
    live.delete(session);
    session.detach();
  });
  const kill = async () => {
    await session.kill().catch(() => {});
  };
  let aborted: Promise<never> | undefined;
  if (o.abortSignal) {
    const signal = o.abortSignal;
    aborted = new Promise((_, reject) => {
      const onAbort = () => void kill().then(() => reject(signal.reason));
      signal.addEventListener("abort", onAbort, { once: true });
      if (signal.aborted) onAbort();
    });
    aborted.catch(() => {});
  }
  const proc: SandboxProcess & { stdin?: WritableStream<Uint8Array> } = {
    pid: session.pid,
    stdout,
    stderr,
    async wait() {
      const e = await (aborted ? Promise.race([exited, aborted]) : exited);
      o.abortSignal?.throwIfAborted();
      return { exitCode: numericExitCode(e) };
    },
    kill,
  };
  if (o.stdin) {
    proc.stdin = new WritableStream<Uint8Array>({
      write: (chunk) => session.write(chunk),
      close: () => session.closeStdin(),
      abort: () => session.closeStdin(),
    });
  }
  return proc;
}

// Network policy: eve's (Vercel's) shape onto hutch's model.

/**
 * Maps eve's network policy onto hutch's. Domains become host rules (80 and
 * 443), "*" allows everything not denied, subnets become CIDR rules and the
 * deny list, and header transforms become credential rules the daemon
 * injects at egress. Request matchers and forwarding have no hutch
 * counterpart, so they are refused rather than silently widened.
 */
export function toHutchPolicy(policy: SandboxNetworkPolicy): NetworkPolicy {
  if (policy === "allow-all" || policy === "deny-all") return { mode: policy };
  const out: NetworkPolicy = { mode: "allow-list", allow: [] };
  const credentials: NonNullable<NetworkPolicy["credentials"]> = [];
  const allow = policy.allow ?? [];
  const hosts = Array.isArray(allow) ? allow : Object.keys(allow);
  for (const host of hosts) {
    if (host === "*") out.mode = "allow-all";
    else out.allow!.push({ host });
  }
  if (!Array.isArray(allow)) {
    for (const [host, rules] of Object.entries(allow)) {
      for (const rule of rules) {
        if (rule.match !== undefined || rule.forwardURL !== undefined) {
          throw new HutchError("invalid_argument", `network policy for ${host}: hutch has no request matchers or forwarding; use header transforms only`);
        }
        const headers: Record<string, string> = {};
        for (const t of rule.transform ?? []) Object.assign(headers, t.headers);
        if (Object.keys(headers).length > 0) {
          if (host === "*") throw new HutchError("invalid_argument", `network policy: header transforms need a host, not "*"`);
          credentials.push({ host, headers });
        }
      }
    }
  }
  for (const cidr of policy.subnets?.allow ?? []) out.allow!.push({ cidr });
  if (policy.subnets?.deny?.length) out.deny = [...policy.subnets.deny];
  if (credentials.length) out.credentials = credentials;
  if (out.allow!.length === 0) delete out.allow;
  return out;
}
