/**
 * What every suite shares: clients for the daemon the Go harness started
 * (TCP with the suite's API key, and the trusted unix socket).
 */
import { HutchClient } from "../src/index.js";

function need(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this suite through clients/typescript's Go test, which starts hutch serve`);
  return v;
}

/** A client over TCP with the suite's bearer key: a tenant of its own. */
export function tcpClient(): HutchClient {
  return new HutchClient({ host: need("HUTCH_TCP"), apiKey: need("HUTCH_API_KEY") });
}

/** A client over the daemon's unix socket (trusted: sees every tenant). */
export function socketClient(): HutchClient {
  return new HutchClient({ host: `unix://${need("HUTCH_SOCKET")}`, apiKey: "" });
}

export const text = (b: Uint8Array | null | undefined): string | undefined => (b ? Buffer.from(b).toString("utf8") : undefined);

/** Reads an async iterable of bytes until pred holds for the text so far, or fails after ms. */
export async function readUntil(src: AsyncIterable<Uint8Array>, pred: (s: string) => boolean, ms = 10_000): Promise<string> {
  let acc = "";
  const it = src[Symbol.asyncIterator]();
  const deadline = Date.now() + ms;
  while (!pred(acc)) {
    const left = deadline - Date.now();
    if (left <= 0) throw new Error(`timed out waiting; got ${JSON.stringify(acc)}`);
    let timer: NodeJS.Timeout | undefined;
    const r = await Promise.race([
      it.next(),
      new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new Error(`timed out waiting; got ${JSON.stringify(acc)}`)), left))),
    ]).finally(() => clearTimeout(timer));
    if (r.done) break;
    acc += Buffer.from(r.value).toString("utf8");
  }
  return acc;
}
