import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { type ExecEvent, HutchClient, HutchError, type Process } from "../src/index.js";
import { ProcessSession } from "../src/process.js";
import { tcpClient } from "./helpers.js";

/**
 * A daemon whose output streams break: a real client whose processOutput
 * drops the connection after a few events of each stream, the way a proxy
 * or a daemon restart would.
 */
class BreakingClient extends HutchClient {
  follows: number[] = [];
  constructor(
    private readonly real: HutchClient,
    private readonly cutAfter: number,
  ) {
    super({ host: "unix:///nonexistent/hutch.sock" });
  }
  override startProcess(id: string, req: Parameters<HutchClient["startProcess"]>[1]): Promise<Process> {
    return this.real.startProcess(id, req);
  }
  override async *processOutput(id: string, proc: string, opts: Parameters<HutchClient["processOutput"]>[2] = {}): AsyncGenerator<ExecEvent> {
    this.follows.push(opts.fromSeq ?? 0);
    let n = 0;
    for await (const ev of this.real.processOutput(id, proc, opts)) {
      if (ev.type === "output" && n++ === this.cutAfter) {
        throw new HutchError("unavailable", "connection reset");
      }
      yield ev;
    }
  }
}

describe("ProcessSession", () => {
  test("a broken output stream is followed again from the next sequence number, losing nothing", async () => {
    const real = tcpClient();
    const sb = await real.createSandbox({});
    try {
      const flaky = new BreakingClient(real, 2);
      const s = await ProcessSession.start(flaky, sb.id, { cmd: "for i in 1 2 3 4 5 6 7; do echo line-$i; sleep 0.05; done; exit 3" });
      let out = "";
      for await (const c of s.output) out += c.data.toString();
      assert.equal(out, [1, 2, 3, 4, 5, 6, 7].map((i) => `line-${i}\n`).join(""));
      assert.deepEqual(await s.exited, { exitCode: 3, timedOut: false, killed: false });
      assert.ok(flaky.follows.length >= 3, `followed ${flaky.follows.length} times`);
      assert.deepEqual(flaky.follows.slice(0, 2), [0, 2]);
    } finally {
      await real.deleteSandbox(sb.id);
    }
  });

  test("a stream that keeps breaking before any output gives up with the error", async () => {
    const real = tcpClient();
    const sb = await real.createSandbox({});
    try {
      const s = await ProcessSession.start(new BreakingClient(real, 0), sb.id, { cmd: "echo a; sleep 5" });
      await assert.rejects(s.exited, (e: unknown) => e instanceof HutchError && e.code === "unavailable");
      await assert.rejects(async () => {
        for await (const _ of s.output);
      });
    } finally {
      await real.deleteSandbox(sb.id);
    }
  });
});
