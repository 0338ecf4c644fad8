import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { defineSandboxProvider } from "eve/sandbox/provider";
import type { SandboxProviderPrepareContext, SandboxProviderSessionContext } from "eve/sandbox/provider";
import { HutchError } from "../src/index.js";
import {
  hutchEnvironment,
  hutchSandboxProvider,
  toHutchPolicy,
  type HutchEveArtifact,
  type HutchEveSession,
  type HutchEveState,
} from "../src/adapters/eve.js";
import { tcpClient, text } from "./helpers.js";

const host = { loadOptionalPackage: async () => { throw new Error("unused"); }, resolveProjectPath: (p: string) => p };

function sessionCtx(id: string): SandboxProviderSessionContext {
  return { host, storagePath: "/tmp", session: { id, auth: {} as never, turn: {} as never } };
}

function prepareCtx(revision: string, log: string[]): SandboxProviderPrepareContext {
  return {
    host,
    storagePath: "/tmp",
    sourceRevision: revision,
    log: (m) => log.push(m),
    files: { list: async () => [], read: async () => new Uint8Array(), readText: async () => "" },
    resources: {
      source: { kind: "inline", key: revision },
      workspace: {
        key: "ws",
        mountPath: "/eve/resources/workspace",
        targetPath: "/workspace",
        files: [
          { relativePath: "seed/schema.sql", content: "create table t (x int);\n" },
          { relativePath: "seed/blob.bin", content: new Uint8Array([1, 2, 3]) },
        ],
      },
      skills: {
        key: "sk",
        mountPath: "/eve/resources/skills",
        targetPath: "/root/.agents/skills",
        files: [{ relativePath: "hello/SKILL.md", content: "# hello\n" }],
      },
    },
  };
}

async function readAllStream(s: ReadableStream<Uint8Array>): Promise<string> {
  let out = "";
  for await (const c of s as unknown as AsyncIterable<Uint8Array>) out += Buffer.from(c).toString();
  return out;
}

describe("eve sandbox provider", () => {
  const client = tcpClient();
  const ended: Array<[string, string]> = [];
  const impl = hutchEnvironment({
    client,
    name: "eve-test",
    setup: ["mkdir -p /opt/tool && echo v1 > /opt/tool/VERSION"],
    env: { FROM_TEMPLATE: "yes" },
    prepare: async (sb) => {
      await sb.writeTextFile({ path: "prepared.txt", content: "by prepare" });
      const r = await sb.run({ command: "cat /opt/tool/VERSION" });
      assert.equal(r.stdout, "v1\n");
    },
    onSessionEnd: (id, reason) => void ended.push([id, reason]),
  });
  let artifact: HutchEveArtifact;
  let state: HutchEveState;
  let sb: HutchEveSession;

  before(async () => {
    const log: string[] = [];
    artifact = await impl.prepare(prepareCtx("rev-1", log));
    const started = await impl.start(sessionCtx("session-1"), { env: { OPENED: "1" } }, artifact);
    state = started.state;
    sb = started.handle.sandbox;
  });
  after(async () => {
    if (state) await impl.onSessionEnd!(sessionCtx("session-1"), artifact, state, { reason: "completed" });
  });

  test("eve's defineSandboxProvider accepts the definition", () => {
    const provider = defineSandboxProvider(hutchSandboxProvider);
    assert.equal(provider.name, "hutch");
    assert.equal(typeof provider.environment({ client }).open, "function");
  });

  test("prepare: the artifact is a template generation holding resources, setup and the authored prepare", async () => {
    assert.match(artifact.template, /^eve-test-[0-9a-f]{16}-p$/);
    const tpl = await client.getTemplate(artifact.template);
    assert.equal(tpl.generation, artifact.generation);
    assert.equal(tpl.kind, "snapshot");
    // Preparing the same inputs again reuses the artifact instead of redoing the work.
    assert.deepEqual(await impl.prepare(prepareCtx("rev-1", [])), artifact);
  });

  test("prepare without an authored callback: the recipe template's generation is the artifact", async () => {
    const plain = hutchEnvironment({ client, name: "eve-plain", setup: ["echo built > /opt/marker"] });
    const a = await plain.prepare(prepareCtx("rev-plain", []));
    assert.match(a.template, /^eve-plain-[0-9a-f]{16}$/);
    const tpl = await client.getTemplate(a.template);
    assert.equal(tpl.kind, "recipe");
    assert.equal(tpl.generation, a.generation);
    const { handle, state: st } = await plain.start(sessionCtx("plain"), undefined, a);
    try {
      assert.equal(await handle.sandbox.readTextFile({ path: "/opt/marker" }), "built\n");
      assert.equal(await handle.sandbox.readTextFile({ path: "seed/schema.sql" }), "create table t (x int);\n");
    } finally {
      await plain.onSessionEnd!(sessionCtx("plain"), a, st, { reason: "completed" });
    }
  });

  test("start: minimal JSON state, a sandbox of the prepared generation with every input in it", async () => {
    assert.deepEqual(Object.keys(state), ["sandboxId"]);
    assert.deepEqual(JSON.parse(JSON.stringify(state)), state);
    const info = await client.getSandbox(state.sandboxId);
    assert.equal(info.generation, artifact.generation);
    assert.equal(info.labels?.["eve.session"], "session-1");
    assert.equal(await sb.readTextFile({ path: "seed/schema.sql" }), "create table t (x int);\n");
    assert.deepEqual([...(await sb.readBinaryFile({ path: "/workspace/seed/blob.bin" }))!], [1, 2, 3]);
    assert.equal(await sb.readTextFile({ path: "/root/.agents/skills/hello/SKILL.md" }), "# hello\n");
    assert.equal(await sb.readTextFile({ path: "prepared.txt" }), "by prepare");
    const r = await sb.run({ command: 'echo "$FROM_TEMPLATE $OPENED $AI_AGENT"' });
    assert.equal(r.stdout, "yes 1 eve\n");
  });

  test("start fails clearly when the template is no longer at the artifact's generation", async () => {
    await assert.rejects(
      impl.start(sessionCtx("s-2"), undefined, { ...artifact, generation: "g-gone" }),
      (e: unknown) => e instanceof HutchError && e.code === "failed_precondition" && /rebuild or redeploy/.test(e.message),
    );
    const left = await client.listSandboxes({ label: ["eve.session=s-2"], state: "running" });
    assert.equal(left.sandboxes.length, 0);
  });

  test("run: exit code, stdout, stderr, env and a working directory relative to /workspace", async () => {
    await sb.writeTextFile({ path: "wd/x", content: "" });
    const r = await sb.run({ command: 'pwd; echo "$V" >&2; exit 9', workingDirectory: "wd", env: { V: "v" } });
    assert.deepEqual(r, { exitCode: 9, stdout: "/workspace/wd\n", stderr: "v\n" });
  });

  test("run: aborting kills the command and rejects with the reason", async () => {
    const ac = new AbortController();
    const p = Promise.resolve(sb.run({ command: "sleep 30", abortSignal: ac.signal }));
    setTimeout(() => ac.abort(new Error("stop now")), 200);
    await assert.rejects(p, { message: "stop now" });
  });

  test("spawn: streams, stdin, wait and kill", async () => {
    const p = await sb.spawn({ command: "cat; echo done >&2", stdin: true });
    assert.ok(p.pid && p.pid > 0);
    const w = p.stdin.getWriter();
    await w.write(new TextEncoder().encode("piped\n"));
    await w.close();
    const [out, err, exit] = await Promise.all([readAllStream(p.stdout), readAllStream(p.stderr), p.wait()]);
    assert.equal(out, "piped\n");
    assert.equal(err, "done\n");
    assert.deepEqual(exit, { exitCode: 0 });

    const noStdin = await sb.spawn({ command: "cat; exit 2" });
    assert.deepEqual(await noStdin.wait(), { exitCode: 2 });

    const ac = new AbortController();
    const aborted = await sb.spawn({ command: "sleep 60", abortSignal: ac.signal });
    ac.abort(new Error("halt"));
    await assert.rejects(Promise.resolve(aborted.wait()), { message: "halt" });

    const long = await sb.spawn({ command: "sleep 60" });
    await long.kill();
    await long.kill();
    assert.deepEqual(await long.wait(), { exitCode: 128 + 9 });
  });

  test("readTextFile: null when missing, line ranges, and the stream and binary variants", async () => {
    assert.equal(await sb.readTextFile({ path: "nope.txt" }), null);
    assert.equal(await sb.readBinaryFile({ path: "nope.bin" }), null);
    assert.equal(await sb.readFile({ path: "nope" }), null);
    await sb.writeTextFile({ path: "lines.txt", content: "1\n2\n3\n4\n" });
    assert.equal(await sb.readTextFile({ path: "lines.txt", startLine: 2, endLine: 3 }), "2\n3\n");
    assert.equal(await sb.readTextFile({ path: "lines.txt", startLine: 4, endLine: 99 }), "4\n");
    assert.equal(await readAllStream((await sb.readFile({ path: "lines.txt" }))!), "1\n2\n3\n4\n");
  });

  test("writeTextFile, writeBinaryFile and writeFile create parents", async () => {
    await sb.writeTextFile({ path: "deep/er/t.txt", content: "héllo" });
    assert.equal(text(await sb.readBinaryFile({ path: "deep/er/t.txt" })), "héllo");
    await sb.writeBinaryFile({ path: "/tmp/b/b.bin", content: new Uint8Array([9, 8]) });
    assert.deepEqual([...(await sb.readBinaryFile({ path: "/tmp/b/b.bin" }))!], [9, 8]);
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(new TextEncoder().encode("str"));
        c.enqueue(new TextEncoder().encode("eamed"));
        c.close();
      },
    });
    await sb.writeFile({ path: "s/streamed.txt", content: body });
    assert.equal(await sb.readTextFile({ path: "s/streamed.txt" }), "streamed");
    assert.equal(sb.resolvePath("a/../b"), "/workspace/b");
    assert.equal(sb.resolvePath("/etc/x"), "/etc/x");
  });

  test("removePath: recursive for directories, force for missing paths", async () => {
    await sb.writeTextFile({ path: "rm/a/b.txt", content: "x" });
    await assert.rejects(sb.removePath({ path: "rm" }));
    await sb.removePath({ path: "rm", recursive: true });
    assert.equal(await sb.readTextFile({ path: "rm/a/b.txt" }), null);
    await assert.rejects(sb.removePath({ path: "rm" }), (e: unknown) => e instanceof HutchError && e.code === "not_found");
    await sb.removePath({ path: "rm", force: true });
  });

  test("setNetworkPolicy maps eve's policy onto hutch's and applies it live", async (t) => {
    assert.throws(() => toHutchPolicy({ allow: { "x.com": [{ forwardURL: "https://proxy" }] } }), /no request matchers or forwarding/);
    assert.deepEqual(toHutchPolicy({ allow: ["*", "a.com"] }), { mode: "allow-all", allow: [{ host: "a.com" }] });
    await sb.setNetworkPolicy("deny-all");
    assert.equal((await client.getNetworkPolicy(sb.sandboxId)).mode, "deny-all");
    try {
      await sb.setNetworkPolicy({
        allow: {
          "api.github.com": [{ transform: [{ headers: { Authorization: "Bearer x" } }] }],
          "*.npmjs.org": [],
        },
        subnets: { allow: ["198.51.100.0/24"], deny: ["10.0.0.0/8"] },
      });
    } catch (err) {
      // A daemon whose host could not set up sandbox networking keeps every sandbox deny-all.
      if (err instanceof HutchError && err.code === "failed_precondition") {
        t.skip(`the daemon runs without sandbox networking: ${err.message}`);
        return;
      }
      throw err;
    }
    const p = await client.getNetworkPolicy(sb.sandboxId);
    assert.equal(p.mode, "allow-list");
    assert.deepEqual(p.allow?.map((r) => r.host ?? r.cidr).sort(), ["*.npmjs.org", "198.51.100.0/24", "api.github.com"]);
    assert.deepEqual(p.deny, ["10.0.0.0/8"]);
    assert.deepEqual(p.credentials, [{ host: "api.github.com", headers: { Authorization: "[redacted]" } }]);
    assert.equal((await client.getSandbox(sb.sandboxId)).network_mode, "allow-list");
    await sb.setNetworkPolicy("allow-all");
    assert.equal((await client.getNetworkPolicy(sb.sandboxId)).mode, "allow-all");
  });

  test("start applies the open options' network policy at create", async (t) => {
    let started;
    try {
      started = await impl.start(sessionCtx("session-net"), { networkPolicy: { allow: ["example.com"] } }, artifact);
    } catch (err) {
      if (err instanceof HutchError && err.code === "failed_precondition" && !/generation/.test(err.message)) {
        t.skip(`the daemon runs without sandbox networking: ${err.message}`);
        return;
      }
      throw err;
    }
    try {
      const p = await client.getNetworkPolicy(started.state.sandboxId);
      assert.deepEqual(p, { mode: "allow-list", allow: [{ host: "example.com" }] });
    } finally {
      await impl.onSessionEnd!(sessionCtx("session-net"), artifact, started.state, { reason: "completed" });
    }
  });

  test("handle: stop suspends, resume reconnects from the state with the files kept", async () => {
    const { handle, state: st } = await impl.start(sessionCtx("session-stop"), undefined, artifact);
    try {
      await handle.sandbox.writeTextFile({ path: "keep.txt", content: "kept" });
      await handle.onSandboxStop();
      assert.equal((await client.getSandbox(st.sandboxId)).state, "suspended");
      await handle.onSandboxStop();
      const resumed = await impl.resume(sessionCtx("session-stop"), artifact, st);
      assert.equal((await client.getSandbox(st.sandboxId)).state, "running");
      assert.equal(await resumed.sandbox.readTextFile({ path: "keep.txt" }), "kept");
      await resumed.onRuntimeShutdown();
      assert.equal((await client.getSandbox(st.sandboxId)).state, "running");
      await resumed.onSandboxDelete();
      assert.equal((await client.getSandbox(st.sandboxId)).state, "destroyed");
    } finally {
      await impl.onSessionEnd!(sessionCtx("session-stop"), artifact, st, { reason: "failed" });
    }
  });

  test("onSessionEnd destroys idempotently with the reason; resume then fails clearly", async () => {
    const { state: st } = await impl.start(sessionCtx("session-end"), undefined, artifact);
    await impl.onSessionEnd!(sessionCtx("session-end"), artifact, st, { reason: "expired" });
    await impl.onSessionEnd!(sessionCtx("session-end"), artifact, st, { reason: "expired" });
    const gone = await client.getSandbox(st.sandboxId);
    assert.equal(gone.state, "destroyed");
    assert.equal(gone.reason, "deleted: eve session expired");
    assert.deepEqual(ended.filter(([id]) => id === st.sandboxId), [[st.sandboxId, "expired"], [st.sandboxId, "expired"]]);
    await assert.rejects(impl.resume(sessionCtx("session-end"), artifact, st), /is destroyed \(deleted: eve session expired\); it cannot be resumed/);
    await assert.rejects(impl.resume(sessionCtx("x"), artifact, { sandboxId: "never-existed" }), /is gone; it cannot be resumed/);
  });
});
