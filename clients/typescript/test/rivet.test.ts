import assert from "node:assert/strict";
import { after, describe, test } from "node:test";
import { HutchError } from "../src/index.js";
import { hutchProvider, type HutchRivetSandbox, type SandboxActorContext } from "../src/adapters/rivet.js";
import { tcpClient, text } from "./helpers.js";

const actor: SandboxActorContext = { actorId: "actor-1", client: () => undefined };

describe("Rivet sandbox-adapter provider", () => {
  const client = tcpClient();
  const provider = hutchProvider({ client });
  const made: string[] = [];
  after(async () => {
    for (const id of made) await provider.destroy!(actor, id);
  });

  async function sandbox(): Promise<HutchRivetSandbox> {
    const id = await provider.create(actor);
    made.push(id);
    const sb = await provider.connect(actor, id);
    assert.ok(sb, "connect after create");
    return sb as HutchRivetSandbox;
  }

  test("create labels the sandbox with the actor; connect returns it", async () => {
    const sb = await sandbox();
    assert.equal(provider.name, "hutch");
    assert.equal(sb.cwd, "/workspace");
    assert.equal((await client.getSandbox(sb.id)).labels?.["rivet.actor"], "actor-1");
  });

  test("exec with cwd, env and onData; a non-zero exit is a result", async () => {
    const sb = await sandbox();
    const chunks: string[] = [];
    const res = await sb.exec('echo "$A" && pwd && echo oops >&2 && exit 7', {
      cwd: "/tmp",
      env: { A: "from-env" },
      onData: (c) => chunks.push(Buffer.from(c).toString()),
    });
    assert.deepEqual(res, { exitCode: 7, timedOut: false, stdout: "from-env\n/tmp\n", stderr: "oops\n" });
    assert.equal(chunks.join("").split("").sort().join(""), "from-env\n/tmp\noops\n".split("").sort().join(""));
  });

  test("exec past timeoutMs: exitCode null and timedOut", async () => {
    const sb = await sandbox();
    const t0 = Date.now();
    const res = await sb.exec("echo started; sleep 30", { cwd: sb.cwd, timeoutMs: 500 });
    assert.equal(res.exitCode, null);
    assert.equal(res.timedOut, true);
    assert.equal(res.stdout, "started\n");
    assert.ok(Date.now() - t0 < 10_000);
  });

  test("exec without timeoutMs has no deadline: it outlives the daemon's default exec timeout", async (t) => {
    const deadline = process.env["HUTCH_EXEC_TIMEOUT"];
    if (!deadline) {
      t.skip("HUTCH_EXEC_TIMEOUT (the daemon's --exec-timeout) is not set");
      return;
    }
    const sb = await sandbox();
    const secs = parseFloat(deadline) + 1;
    const res = await sb.exec(`sleep ${secs}; echo finished`, { cwd: sb.cwd });
    assert.deepEqual(res, { exitCode: 0, timedOut: false, stdout: "finished\n", stderr: "" });
  });

  test("exec aborted by its signal rejects with Error('aborted') and the command dies", async () => {
    const sb = await sandbox();
    const ac = new AbortController();
    const running = sb.exec("touch /tmp/began; sleep 30; touch /tmp/finished", { cwd: sb.cwd, signal: ac.signal });
    for (let i = 0; i < 100 && !(await sb.exists("/tmp/began")); i++) await new Promise((r) => setTimeout(r, 50));
    ac.abort();
    await assert.rejects(running, { message: "aborted" });
    // The hang-up killed the command: nothing of it is left running.
    const ps = await sb.exec("ps -o args= | grep -c '[s]leep 30' || true", { cwd: sb.cwd });
    assert.equal(ps.stdout.trim(), "0");
  });

  test("files: writeFile, readFile as bytes, mkdir, stat, readdir, exists", async () => {
    const sb = await sandbox();
    await sb.mkdir("/workspace/dir/sub");
    await sb.writeFile("/workspace/dir/a.txt", "alpha");
    await sb.writeFile("/workspace/dir/b.bin", new Uint8Array([0, 255, 1]));
    const bytes = await sb.readFile("/workspace/dir/a.txt");
    assert.ok(bytes instanceof Uint8Array);
    assert.equal(text(bytes), "alpha");
    assert.deepEqual([...(await sb.readFile("/workspace/dir/b.bin"))], [0, 255, 1]);
    assert.equal((await sb.stat("/workspace/dir")).isDirectory, true);
    const st = await sb.stat("/workspace/dir/a.txt");
    assert.equal(st.isDirectory, false);
    assert.equal(st.size, 5);
    assert.deepEqual((await sb.readdir("/workspace/dir")).sort(), ["a.txt", "b.bin", "sub"]);
    assert.equal(await sb.exists("/workspace/dir/a.txt"), true);
    assert.equal(await sb.exists("/workspace/nope"), false);
    await assert.rejects(sb.readFile("/workspace/nope"), (e: unknown) => e instanceof HutchError && e.code === "not_found");
  });

  test("suspend keeps files; connect after it works and the next call resumes", async () => {
    const sb = await sandbox();
    await sb.writeFile("/workspace/kept.txt", "still here");
    await provider.suspend!(actor, sb.id);
    assert.equal((await client.getSandbox(sb.id)).state, "suspended");
    await provider.suspend!(actor, sb.id); // asleep already: no error
    const again = await provider.connect(actor, sb.id);
    assert.ok(again);
    assert.equal(text(await again.readFile("/workspace/kept.txt")), "still here");
    assert.equal((await again.exec("echo up", { cwd: again.cwd })).stdout, "up\n");
  });

  test("destroy is idempotent; connect to a destroyed or unknown sandbox is undefined", async () => {
    const sb = await sandbox();
    await provider.destroy!(actor, sb.id);
    await provider.destroy!(actor, sb.id);
    assert.equal(await provider.connect(actor, sb.id), undefined);
    assert.equal(await provider.connect(actor, "never-was"), undefined);
  });

  test("the provider works over the daemon's unix socket too", async () => {
    const local = hutchProvider({ host: `unix://${process.env["HUTCH_SOCKET"]}` });
    const id = await local.create(actor);
    try {
      const sb = await local.connect(actor, id);
      assert.ok(sb);
      assert.equal((await sb.exec("echo via-socket", { cwd: sb.cwd })).stdout, "via-socket\n");
      await sb.writeFile("/workspace/s.txt", "socket");
      assert.equal(text(await sb.readFile("/workspace/s.txt")), "socket");
    } finally {
      await local.destroy!(actor, id);
    }
    assert.equal(await local.connect(actor, id), undefined);
  });

  test("connect throws on any other failure", async () => {
    const bad = hutchProvider({ host: process.env["HUTCH_TCP"]!, apiKey: "wrong" });
    await assert.rejects(bad.connect(actor, "x"), (e: unknown) => e instanceof HutchError && e.code === "unauthenticated");
  });
});
