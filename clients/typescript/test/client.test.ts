import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { HutchClient, HutchError, isNotFound } from "../src/index.js";
import { socketClient, tcpClient } from "./helpers.js";

describe("HutchClient", () => {
  const tcp = tcpClient();
  const sock = socketClient();
  let id = "";

  before(async () => {
    id = (await tcp.createSandbox({ labels: { suite: "client" }, env: { GREETING: "hello" } })).id;
  });
  after(async () => {
    if (id) await tcp.deleteSandbox(id);
  });

  test("reaches the daemon over TCP with a key and over the unix socket", async () => {
    assert.equal((await tcp.health()).status, "ok");
    assert.equal((await sock.health()).backend, "native");
    // The socket is trusted and sees the TCP tenant's sandbox.
    assert.equal((await sock.getSandbox(id)).id, id);
  });

  test("a wrong key is unauthenticated, a missing sandbox not_found, each with its code", async () => {
    const bad = new HutchClient({ host: process.env["HUTCH_TCP"]!, apiKey: "nope" });
    await assert.rejects(bad.listSandboxes(), (e: unknown) => e instanceof HutchError && e.code === "unauthenticated" && e.status === 401);
    await assert.rejects(tcp.getSandbox("no-such-sandbox"), (e: unknown) => isNotFound(e) && (e as HutchError).requestId !== undefined);
    const nowhere = new HutchClient({ host: "unix:///nonexistent/hutch.sock" });
    await assert.rejects(nowhere.health(), (e: unknown) => e instanceof HutchError && e.code === "unavailable");
    assert.throws(() => new HutchClient({ host: "ftp://x" }), (e: unknown) => e instanceof HutchError && e.code === "invalid_argument");
    // With no host given, the client finds the daemon as the CLI does: $HUTCH_HOST, else $HUTCH_DATA's socket.
    const saved = { host: process.env["HUTCH_HOST"], data: process.env["HUTCH_DATA"] };
    try {
      process.env["HUTCH_HOST"] = "";
      process.env["HUTCH_DATA"] = process.env["HUTCH_SOCKET"]!.replace(/\/hutch\.sock$/, "");
      assert.equal(new HutchClient({ apiKey: "" }).host, `unix://${process.env["HUTCH_SOCKET"]}`);
      assert.equal((await new HutchClient({ apiKey: "" }).health()).status, "ok");
    } finally {
      process.env["HUTCH_HOST"] = saved.host ?? "";
      if (saved.data === undefined) delete process.env["HUTCH_DATA"];
      else process.env["HUTCH_DATA"] = saved.data;
    }
  });

  test("lists by label and gets a sandbox", async () => {
    const list = await tcp.listSandboxes({ label: ["suite=client"], state: "running" });
    assert.deepEqual(list.sandboxes.map((s) => s.id), [id]);
    const sb = await tcp.getSandbox(id);
    assert.equal(sb.state, "running");
    assert.equal(sb.env?.["GREETING"], "hello");
  });

  test("exec buffers, execStream streams, with env, cwd and stdin", async () => {
    const res = await tcp.exec(id, { cmd: 'echo "$GREETING $X" && pwd && cat', env: { X: "world" }, cwd: "/tmp", stdin: "in" });
    assert.equal(res.exit_code, 0);
    assert.equal(res.stdout, "hello world\n/tmp\nin");
    const events = [];
    for await (const ev of tcp.execStream(id, { cmd: "echo out; echo err >&2; exit 3" })) events.push(ev);
    assert.equal(events[0]?.type, "start");
    const exit = events.at(-1)!;
    assert.equal(exit.type, "exit");
    assert.equal(exit.exit_code, 3);
    const out = events.filter((e) => e.type === "output").map((e) => `${e.stream}:${Buffer.from(e.data!, "base64")}`);
    assert.deepEqual(out.sort(), ["stderr:err\n", "stdout:out\n"]);
  });

  test("files: write creating parents, read, stat, list, rename, remove", async () => {
    const fi = await tcp.writeFile(id, "a/b/c.txt", "data", { mode: "0600" });
    assert.equal(fi.path, "/workspace/a/b/c.txt");
    assert.equal(fi.mode, "0600");
    assert.equal((await tcp.readFile(id, "/workspace/a/b/c.txt")).toString(), "data");
    assert.equal(await tcp.readFileIfExists(id, "a/missing"), null);
    assert.equal((await tcp.stat(id, "a/b")).is_dir, true);
    assert.deepEqual((await tcp.listFiles(id, "a", { depth: 3, glob: "**/*.txt" })).map((f) => f.path), ["/workspace/a/b/c.txt"]);
    await tcp.rename(id, "a/b/c.txt", "a/d.txt");
    assert.equal(await tcp.exists(id, "a/d.txt"), true);
    await tcp.removeFile(id, "a", { recursive: true });
    assert.equal(await tcp.exists(id, "a"), false);
    await tcp.removeFile(id, "a", { force: true });
  });

  test("a background process: start, stdin, output from a sequence number, wait", async () => {
    const p = await tcp.startProcess(id, { cmd: "cat", stdin: true, tag: "echoer" });
    await tcp.writeStdin(id, "echoer", "one\n");
    await tcp.writeStdin(id, p.id, "two\n", { close: true });
    const done = await tcp.waitProcess(id, "echoer", 10);
    assert.equal(done.exit?.exit_code, 0);
    let out = "";
    for await (const ev of tcp.processOutput(id, p.id, { fromSeq: 0 })) {
      if (ev.type === "output") out += Buffer.from(ev.data!, "base64").toString();
    }
    assert.equal(out, "one\ntwo\n");
  });

  test("an interactive exec over the unix socket's WebSocket: stdin both ways, signals", async () => {
    const session = await sock.execInteractive(id, { cmd: "read a; echo got-$a; read b; echo got-$b" });
    let out = "";
    session.write("one\n");
    while (!out.includes("got-one")) out += (await session.output.next()).value?.data.toString() ?? "";
    session.write("two\n");
    for await (const c of session.output) out += c.data.toString();
    assert.equal(out, "got-one\ngot-two\n");
    assert.deepEqual(await session.exited, { exitCode: 0, timedOut: false, killed: false });
    const sleeper = await sock.execInteractive(id, { cmd: "sleep 30" });
    sleeper.signal("TERM");
    assert.equal((await sleeper.exited).signal, "SIGTERM");
  });

  test("ports: expose, reach through the daemon, list, unexpose", async (t) => {
    const py = await tcp.exec(id, { cmd: "command -v python3" });
    if (py.exit_code !== 0) {
      t.skip("the sandbox's base has no python3 to serve HTTP with");
      return;
    }
    await tcp.startProcess(id, {
      cmd: "mkdir -p /tmp/www && echo served > /tmp/www/index.html && cd /tmp/www && exec python3 -m http.server 8000 --bind 127.0.0.1",
      tag: "web",
    });
    const p = await tcp.exposePort(id, { port: 8000 });
    assert.equal(p.path, `/v1/sandboxes/${id}/ports/8000/`);
    assert.ok(p.token);
    assert.deepEqual((await tcp.listPorts(id)).map((x) => x.port), [8000]);
    let res: Awaited<ReturnType<typeof tcp.portRequest>> = { status: 0, headers: {}, body: Buffer.alloc(0) };
    for (let i = 0; i < 50 && res.status !== 200; i++) {
      res = await tcp.portRequest(id, 8000, "/index.html");
      if (res.status !== 200) await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(res.status, 200);
    assert.equal(res.body.toString(), "served\n");
    assert.equal((await tcp.portRequest(id, 8000, "/missing")).status, 404);
    await tcp.unexposePort(id, 8000);
    assert.deepEqual(await tcp.listPorts(id), []);
    await tcp.signalProcess(id, "web", "KILL");
  });
});
