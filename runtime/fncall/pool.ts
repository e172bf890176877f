/**
 * Warm pools, one per image, and the node's bounded queue in front of them.
 *
 * A pool keeps `warm` members ready (created at start and refilled in the background when one is
 * lost), may grow to `max` under load, and shrinks back when the extra members sit idle. A member
 * goes back to its pool only after reset() made it fresh; one that cannot be made fresh is
 * destroyed and replaced. Requests that find no idle member wait in one FIFO per node, bounded:
 * past the bound the node answers BUSY with a retry hint instead of piling work up.
 */
import { performance } from 'node:perf_hooks';
import { ErrorCodes, ProtocolError } from '../../protocol/index.ts';
import type { ImageManifest } from '../images/store.ts';
import { Member, type MemberOptions } from './member.ts';

export interface PoolOptions {
  /** Warm members per image. */
  warm: Record<string, number>;
  /** Members per image at most (warm ones included). */
  max: number;
  /** Requests waiting for a member, per node, at most. */
  queue: number;
  /** A member is replaced after this many programs. */
  recycleAfter: number;
  /** Members above the warm count are removed after idling this long. */
  idleMs: number;
}

interface Log {
  info(o: object, msg: string): void;
  warn(o: object, msg: string): void;
}

interface Waiter {
  image: string;
  resolve: (m: Member) => void;
  reject: (e: unknown) => void;
}

class ImagePool {
  readonly members = new Set<Member>();
  readonly idle: Member[] = [];
  creating = 0;
  /** Creation failures in a row, the last one and when: retries back off, callers learn why. */
  failures = 0;
  failedAt = 0;
  lastError?: unknown;
  retryTimer?: NodeJS.Timeout;
  /**
   * How long the last members took from the end of their invocation until they could serve again
   * (reset, or replacement when they could not be reset), ms: what a caller queued behind them waits.
   */
  readonly recycleMs: number[] = [];
  reportedMissing = false;
  constructor(
    readonly image: string,
    readonly warm: number,
    readonly max: number,
  ) {}
}

/** Retry sooner than this is pointless; later than this the caller should look elsewhere. */
const RETRY_MIN_MS = 20;
const RETRY_MAX_MS = 5000;
/** Member creation retries back off from 1 s to 30 s. */
const REFILL_BACKOFF_MS = [1000, 30_000] as const;
/** After this many failures in a row (or one the caller caused), waiting callers get the error. */
const FAILURES_TO_GIVE_UP = 3;

function backoffMs(failures: number): number {
  return Math.min(REFILL_BACKOFF_MS[1], REFILL_BACKOFF_MS[0] * 2 ** Math.max(0, failures - 1));
}

/** A failure retrying cannot fix (an image the node does not have): no point in waiting. */
function hopeless(err: unknown, failures: number): boolean {
  return failures >= FAILURES_TO_GIVE_UP || (err instanceof ProtocolError && !ErrorCodes[err.code].retryable);
}

export interface PoolStats {
  members: number;
  idle: number;
  warm: number;
  /** Over the last resets (see RECYCLE_SAMPLES): 0 before the first. */
  recycleP50Ms: number;
  recycleMaxMs: number;
}

const RECYCLE_SAMPLES = 64;

function record(window: number[], ms: number): void {
  window.push(ms);
  if (window.length > RECYCLE_SAMPLES) window.shift();
}

const round1 = (x: number) => Math.round(x * 10) / 10;

export class Pools {
  private readonly pools = new Map<string, ImagePool>();
  private readonly waiting: Waiter[] = [];
  private running = 0;
  /** Mean time a member is held (EWMA, ms): the basis of the BUSY retry hint. */
  private holdMs = 50;
  private timer?: NodeJS.Timeout;
  private stopping: boolean = false;
  private readonly heldAt = new Map<Member, number>();
  private readonly retiring = new Set<Promise<void>>();
  private warming: boolean = false;

  constructor(
    private readonly o: PoolOptions,
    private readonly member: Omit<MemberOptions, 'onRunnerExit'>,
    /** The image's manifest, or null when the node's store does not have it. */
    private readonly manifest: (image: string) => Promise<ImageManifest | null>,
    private readonly log: Log,
    /** Readies a new member before its first caller (warms its page cache); leaves it fresh. */
    private readonly prepare: (m: Member) => Promise<void> = async () => {},
  ) {}

  /**
   * Keeps the warm pools filled in the background: from now with `prewarm`, else from the first
   * invocation (a node that never serves one never starts a member).
   */
  start(prewarm: boolean): void {
    this.warming = prewarm;
    for (const [image, n] of Object.entries(this.o.warm)) if (n > 0) this.pool(image);
    this.refill();
    this.timer = setInterval(() => {
      this.trim();
      this.refill();
    }, 5000);
    this.timer.unref();
  }

  private pool(image: string): ImagePool {
    let p = this.pools.get(image);
    if (!p) {
      const warm = this.o.warm[image] ?? 0;
      p = new ImagePool(image, warm, Math.max(warm, this.o.max));
      this.pools.set(image, p);
    }
    return p;
  }

  get load(): { running: number; queued: number } {
    return { running: this.running, queued: this.waiting.length };
  }

  /**
   * A fresh member of `image`, now or when one frees up. Throws BUSY when the queue is full, and
   * the member creation error when the image cannot be run at all.
   */
  async acquire(image: string): Promise<Member> {
    if (this.stopping) throw new ProtocolError('UNAVAILABLE', 'this node is stopping');
    if (!this.warming) {
      this.warming = true;
      this.refill();
    }
    const p = this.pool(image);
    for (let m = p.idle.pop(); m; m = p.idle.pop()) {
      if (m.alive) return this.hold(m);
      void this.replace(p, m);
    }
    // A pool that cannot make members answers with the reason instead of queueing.
    if (p.members.size === 0 && p.creating === 0 && p.lastError && hopeless(p.lastError, p.failures) && performance.now() - p.failedAt < 2000) throw p.lastError;
    if (this.waiting.length >= this.o.queue) {
      const members = [...this.pools.values()].reduce((s, x) => s + x.members.size, 0);
      const retryAfterMs = Math.round(Math.min(RETRY_MAX_MS, Math.max(RETRY_MIN_MS, (this.holdMs * (this.waiting.length + 1)) / Math.max(1, members))));
      throw new ProtocolError('BUSY', `FnCall on this node is full (${this.running} running, ${this.waiting.length} queued); retry in ${retryAfterMs} ms`, { detail: { retryAfterMs, running: this.running, queued: this.waiting.length } });
    }
    const got = new Promise<Member>((resolve, reject) => this.waiting.push({ image, resolve, reject }));
    if (p.members.size + p.creating < p.max) this.grow(p);
    return this.hold(await got);
  }

  private hold(m: Member): Member {
    this.running++;
    this.heldAt.set(m, performance.now());
    return m;
  }

  /**
   * Gives a member back after its invocation. It is reset in the background (off the caller's
   * path) and then serves the next waiter; one that failed or cannot be reset is replaced.
   */
  release(m: Member, broken = false): void {
    this.running--;
    const heldAt = this.heldAt.get(m);
    this.heldAt.delete(m);
    if (heldAt !== undefined) this.holdMs = this.holdMs * 0.9 + (performance.now() - heldAt) * 0.1;
    const p = this.pool(m.image);
    const freed = performance.now();
    void (async () => {
      if (!broken && m.alive && m.uses < this.o.recycleAfter && !this.stopping) {
        try {
          await m.reset();
          record(p.recycleMs, performance.now() - freed);
          this.offer(p, m);
          return;
        } catch (err) {
          this.log.warn({ err, member: m.id }, 'FnCall member could not be reset: replacing it');
        }
      }
      await this.replace(p, m);
    })();
  }

  /** Retires a member and makes another if the warm size or a waiting caller needs one. */
  private async replace(p: ImagePool, m: Member): Promise<void> {
    await this.retire(p, m);
    this.refill();
    if (!this.stopping && this.waiting.some((w) => w.image === p.image) && p.members.size + p.creating < p.max) this.grow(p);
  }

  /** A fresh member goes to the first request waiting for its image, else to the idle list. */
  private offer(p: ImagePool, m: Member): void {
    // Its runner may have died while it was being reset.
    if (!m.alive) {
      void this.replace(p, m);
      return;
    }
    const i = this.waiting.findIndex((w) => w.image === p.image);
    if (i >= 0) {
      const [w] = this.waiting.splice(i, 1);
      w?.resolve(m);
      return;
    }
    m.idleSince = Date.now();
    p.idle.push(m);
  }

  private grow(p: ImagePool): void {
    p.creating++;
    void (async () => {
      try {
        const manifest = await this.manifest(p.image);
        if (!manifest) throw new ProtocolError('INVALID_SPEC', `image '${p.image}' is not in this node's image store`);
        const m = await Member.create({ ...this.member, onRunnerExit: (x, why) => this.lost(x, why) }, p.image, manifest);
        try {
          await this.prepare(m);
        } catch (err) {
          await m.destroy().catch(() => {});
          throw err;
        }
        p.members.add(m);
        p.lastError = undefined;
        p.failures = 0;
        p.reportedMissing = false;
        if (this.stopping) {
          await this.retire(p, m);
          return;
        }
        this.offer(p, m);
      } catch (err) {
        p.failedAt = performance.now();
        p.lastError = err;
        p.failures++;
        if (err instanceof ProtocolError && err.code === 'INVALID_SPEC') {
          // The image is missing (being built, or never will be): one line, not one per retry.
          if (!p.reportedMissing) this.log.info({ image: p.image }, `FnCall: image '${p.image}' is not in this node's image store (yet): its pool waits for it`);
          p.reportedMissing = true;
        } else this.log.warn({ err, image: p.image, failures: p.failures }, 'FnCall: could not start a pool member');
        const waiters = this.waiting.some((w) => w.image === p.image);
        if (waiters && p.members.size === 0 && p.creating === 1) {
          if (hopeless(err, p.failures)) {
            // Nothing else is coming for these callers: they get the reason now.
            for (let i = this.waiting.length - 1; i >= 0; i--) {
              const w = this.waiting[i];
              if (w?.image !== p.image) continue;
              this.waiting.splice(i, 1);
              w.reject(err);
            }
          } else if (!p.retryTimer) {
            p.retryTimer = setTimeout(() => {
              p.retryTimer = undefined;
              if (!this.stopping && p.members.size + p.creating < p.max) this.grow(p);
            }, backoffMs(p.failures));
          }
        }
      } finally {
        p.creating--;
      }
    })();
  }

  /** A runner died outside an invocation: the member is of no more use. */
  private lost(m: Member, why: string): void {
    const p = this.pools.get(m.image);
    if (!p || this.stopping) return;
    const i = p.idle.indexOf(m);
    if (i < 0) return; // held: its invocation fails and release() retires it
    p.idle.splice(i, 1);
    this.log.warn({ member: m.id, why }, 'FnCall runner stopped in an idle member: replacing it');
    void this.replace(p, m);
  }

  private retire(p: ImagePool, m: Member): Promise<void> {
    p.members.delete(m);
    const i = p.idle.indexOf(m);
    if (i >= 0) p.idle.splice(i, 1);
    const done = m.destroy().catch((err: unknown) => this.log.warn({ err, member: m.id }, 'FnCall member destroy failed'));
    this.retiring.add(done);
    void done.then(() => this.retiring.delete(done));
    return done;
  }

  /** Brings every pool back to its warm size, one creation per pool at a time. */
  private refill(): void {
    if (this.stopping || !this.warming) return;
    for (const p of this.pools.values()) {
      if (p.members.size + p.creating >= p.warm || p.creating > 0) continue;
      if (p.lastError && performance.now() - p.failedAt < backoffMs(p.failures)) continue;
      this.grow(p);
    }
  }

  /** Idle members above the warm size that have idled long enough go. */
  private trim(): void {
    const now = Date.now();
    for (const p of this.pools.values()) {
      while (p.members.size > p.warm) {
        const oldest = p.idle[0];
        if (!oldest || now - oldest.idleSince < this.o.idleMs) break;
        p.idle.shift();
        void this.retire(p, oldest);
      }
    }
  }

  /** Members per image: total and idle, and how long the recent resets took (p50, max; ms). */
  stats(): Record<string, PoolStats> {
    const out: Record<string, PoolStats> = {};
    for (const p of this.pools.values()) {
      const r = [...p.recycleMs].sort((a, b) => a - b);
      out[p.image] = { members: p.members.size, idle: p.idle.length, warm: p.warm, recycleP50Ms: r.length ? round1(r[Math.floor(r.length / 2)] as number) : 0, recycleMaxMs: r.length ? round1(r[r.length - 1] as number) : 0 };
    }
    return out;
  }

  /** Fails the waiting requests, destroys every member (the ones in use once they come back). */
  async stop(): Promise<void> {
    this.stopping = true;
    clearInterval(this.timer);
    for (const p of this.pools.values()) clearTimeout(p.retryTimer);
    for (const w of this.waiting.splice(0)) w.reject(new ProtocolError('UNAVAILABLE', 'this node is stopping'));
    for (let i = 0; i < 600 && (this.running > 0 || [...this.pools.values()].some((p) => p.creating > 0)); i++) await new Promise((r) => setTimeout(r, 50));
    await Promise.all([...this.pools.values()].flatMap((p) => [...p.members].map((m) => this.retire(p, m))));
    await Promise.all([...this.retiring]);
  }
}
