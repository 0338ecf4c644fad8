import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { hutchZidaneProvider, type ZidaneSandbox } from "../src/adapters/zidane.js";
import { readUntil, tcpClient, text } from "./helpers.js";

describe("zidane provider", () => {
  const client = tcpClient();
  const provider = hutchZidaneProvider({ client });
  let sb: ZidaneSandbox;

  before(async () => {
    sb = await provider.spawn({ env: { WHO: "zidane" }, labels: { suite: "zidane" } });
  });
  after(async () => {
    if (sb) await provider.destroy(sb);
  });

  test("spawn makes a running sandbox with its env and labels", async () => {
    assert.equal(provider.name, "hutch");
    assert.equal(sb.cwd, "/workspace");
    const info = await client.getSandbox(sb.id);
    assert.equal(info.state, "running");
    assert.equal(info.labels?.["suite"], "zidane");
  });

  test("exec with stdin, cwd, env; exit codes and timeouts", async () => {
    const r = await provider.exec(sb, 'tr a-z A-Z; echo "$WHO@$PWD $X"', { stdin: "shout\n", cwd: "/tmp", env: { X: "y" } });
    assert.deepEqual(r, { exitCode: 0, stdout: "SHOUT\nzidane@/tmp y\n", stderr: "", timedOut: false });
    assert.equal((await provider.exec(sb.id, "exit 4")).exitCode, 4);
    const slow = await provider.exec(sb, "sleep 20", { timeoutMs: 300 });
    assert.equal(slow.timedOut, true);
    assert.equal(slow.exitCode, null);
    const ac = new AbortController();
    setTimeout(() => ac.abort(new Error("cancelled")), 200);
    await assert.rejects(provider.exec(sb, "sleep 20", { signal: ac.signal }), { message: "cancelled" });
    const left = await provider.exec(sb, "ps -o args= | grep -c '[s]leep 20' || true");
    assert.equal(left.stdout.trim(), "0");
  });

  test("execStream: stdin both ways while it runs, then the exit", async () => {
    const s = await provider.execStream(sb, "while read l; do echo \"got $l\"; echo \"err $l\" >&2; done; exit 5");
    assert.ok(s.pid > 0);
    await s.write("one\n");
    const first = await readUntil(
      (async function* () {
        for await (const c of s) if (c.stream === "stdout") yield c.data;
      })(),
      (acc) => acc.includes("got one"),
    );
    assert.equal(first, "got one\n");
    await s.write("two\n");
    await s.closeStdin();
    let rest = "";
    for await (const c of s) if (c.stream === "stdout") rest += text(c.data);
    assert.equal(rest, "got two\n");
    assert.deepEqual(await s.exit, { exitCode: 5, timedOut: false });
  });

  test("execStream kill ends the command with its signal", async () => {
    const s = await provider.execStream(sb, "sleep 60");
    await s.kill("TERM");
    const e = await s.exit;
    assert.equal(e.exitCode, null);
    assert.equal(e.signal, "SIGTERM");
  });

  test("writeFile, readFile and listFiles with a glob", async () => {
    await provider.writeFile(sb, "src/a.ts", "export const a = 1;\n");
    await provider.writeFile(sb, "src/lib/b.ts", new Uint8Array(Buffer.from("b")));
    await provider.writeFile(sb, "src/readme.md", "# r");
    assert.equal(text(await provider.readFile(sb, "/workspace/src/a.ts")), "export const a = 1;\n");
    const ts = await provider.listFiles(sb, "src", { glob: "**/*.ts" });
    assert.deepEqual(ts.map((f) => f.path).sort(), ["/workspace/src/a.ts", "/workspace/src/lib/b.ts"]);
    assert.equal(ts.find((f) => f.name === "b.ts")?.size, 1);
    const top = await provider.listFiles(sb, "src");
    assert.deepEqual(top.map((f) => `${f.name}:${f.type}`).sort(), ["a.ts:file", "lib:dir", "readme.md:file"]);
  });

  test("openTerminal, detach, reconnectTerminal with scrollback", async () => {
    const term = await provider.openTerminal(sb, { command: "sh", rows: 30, cols: 100 });
    term.write("echo marker-$((40+2))\n");
    await readUntil(term, (acc) => acc.includes("marker-42"));
    await term.resize(40, 120);
    term.write("stty size\n");
    await readUntil(term, (acc) => acc.includes("40 120"));
    await term.detach();
    assert.equal(await term.exit, undefined);

    const again = await provider.reconnectTerminal(sb, term.id, { scrollback: 4096 });
    const replay = await readUntil(again, (acc) => acc.includes("marker-42"));
    assert.match(replay, /marker-42/);
    again.write("exit 3\n");
    const e = await again.exit;
    assert.equal(e?.exitCode, 3);
  });

  test("destroy is idempotent", async () => {
    const other = await provider.spawn();
    await provider.destroy(other);
    await provider.destroy(other.id);
    assert.equal((await client.getSandbox(other.id)).state, "destroyed");
  });
});
