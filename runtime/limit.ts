/** A counting semaphore: at most `n` holders at once, the rest wait in arrival order. */
export class Semaphore {
  private active = 0;
  private readonly waiting: Array<() => void> = [];

  constructor(private readonly n: number) {}

  /** Holders now, and callers waiting for a turn. */
  get load(): { active: number; waiting: number } {
    return { active: this.active, waiting: this.waiting.length };
  }

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.active >= this.n) await new Promise<void>((r) => this.waiting.push(r));
    this.active++;
    try {
      return await fn();
    } finally {
      this.active--;
      this.waiting.shift()?.();
    }
  }
}

/**
 * Token buckets by key: each key may spend `burst` bytes at once, then `rate` bytes a second.
 * Idle keys are forgotten after a minute (a full bucket is what a new key gets anyway).
 */
export class ByteBudget {
  private readonly buckets = new Map<string, { tokens: number; at: number }>();
  private swept = 0;

  constructor(
    readonly rate: number,
    readonly burst: number,
  ) {}

  /** Spends `bytes` of `key`'s budget; returns how long (ms) the spender should wait before more. */
  spend(key: string, bytes: number, now = Date.now()): number {
    if (now - this.swept > 60_000) {
      for (const [k, b] of this.buckets) if (now - b.at > 60_000) this.buckets.delete(k);
      this.swept = now;
    }
    const b = this.buckets.get(key) ?? { tokens: this.burst, at: now };
    b.tokens = Math.min(this.burst, b.tokens + ((now - b.at) / 1000) * this.rate) - bytes;
    b.at = now;
    this.buckets.set(key, b);
    return b.tokens < 0 ? (-b.tokens / this.rate) * 1000 : 0;
  }
}
