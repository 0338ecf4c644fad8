/**
 * A push-to-pull queue: WebSocket callbacks push, a consumer awaits. It
 * keeps what arrives before anyone reads, so output sent right after a
 * command starts is never lost to a listener attached a tick later.
 */
export class AsyncQueue<T> implements AsyncIterable<T> {
  private items: T[] = [];
  private waiters: Array<{ resolve: (r: IteratorResult<T>) => void; reject: (e: unknown) => void }> = [];
  private done = false;
  private failure: unknown = undefined;

  push(item: T): void {
    if (this.done) return;
    const w = this.waiters.shift();
    if (w) w.resolve({ value: item, done: false });
    else this.items.push(item);
  }

  /** Ends the queue; readers get what is queued, then the end (or err). */
  end(err?: unknown): void {
    if (this.done) return;
    this.done = true;
    this.failure = err;
    for (const w of this.waiters.splice(0)) {
      if (err === undefined) w.resolve({ value: undefined, done: true });
      else w.reject(err);
    }
  }

  next(): Promise<IteratorResult<T>> {
    const item = this.items.shift();
    if (item !== undefined) return Promise.resolve({ value: item, done: false });
    if (this.done) {
      return this.failure === undefined ? Promise.resolve({ value: undefined, done: true }) : Promise.reject(this.failure);
    }
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return { next: () => this.next() };
  }
}
