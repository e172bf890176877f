/**
 * The liveness of a client's creates in flight. A create's answer comes from the placement replica
 * that took it; when that replica dies with the create (under `paddock up` placement runs inside
 * the node, and a SIGKILLed node takes it along), nothing else can answer, and the call would wait
 * out its whole timeout. Every PROBE_MS this client asks all replicas at once (`place.pending`,
 * one message for all its creates older than PROBE_MS) which of them they hold; a create no
 * replica has held for LOST_AFTER_MS fails with UNAVAILABLE, `placement_lost`, and says it may
 * have been made (a node that made it has recorded it; `sandboxes.get(id)` tells).
 *
 * LOST_AFTER_MS is a few probes long, because a replica answers probes on the same event loop that
 * takes creates: one stalled that long by a flood of work is as good as gone to its callers. Time
 * NATS is down does not count: the SDK sends the create again once it is back.
 */
import type { Msg, Subscription } from '@nats-io/transport-node';
import { createInbox } from '@nats-io/transport-node';
import { decode, encode, type PlacePendingReply, type Reply, subjects } from '../protocol/index.ts';
import { UnavailableError } from './errors.ts';
import type { Transport } from './transport.ts';

const PROBE_MS = 2000;
/** How long a probe waits for answers before it judges (an answer that comes later counts at the next). */
const COLLECT_MS = 1000;
const LOST_AFTER_MS = 10_000;
/** Ids per probe message (the request schema's bound). */
const BATCH = 1000;

interface Watched {
  id: string;
  sentAt: number;
  /** When a replica last said it held it (or the connection last came back). */
  heldAt: number;
  node?: string;
  fail(err: Error): void;
}

export class PendingCreates {
  private readonly watched = new Map<string, Watched>();
  private timer?: NodeJS.Timeout;
  private sub?: Subscription;
  private stopReconnect?: () => void;
  private probing = false;

  constructor(private readonly t: Transport) {}

  /**
   * Watches the create of `id` until `done` is called; `lost` rejects when no replica holds it any
   * more. A second create of the same id (sent again by the caller) shares the watch.
   */
  watch(id: string): { lost: Promise<never>; done: () => void } {
    let fail!: (err: Error) => void;
    const lost = new Promise<never>((_, reject) => (fail = reject));
    lost.catch(() => {});
    const now = Date.now();
    const w: Watched = { id, sentAt: now, heldAt: now, fail };
    this.watched.set(id, w);
    this.start();
    return {
      lost,
      done: () => {
        if (this.watched.get(id) === w) this.watched.delete(id);
        if (this.watched.size === 0) this.stop();
      },
    };
  }

  private start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => void this.probe(), PROBE_MS);
    this.timer.unref();
    this.stopReconnect = this.t.onReconnect(() => {
      const now = Date.now();
      for (const w of this.watched.values()) w.heldAt = now;
    });
  }

  private stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
    this.stopReconnect?.();
    this.stopReconnect = undefined;
    this.sub?.unsubscribe();
    this.sub = undefined;
  }

  private inbox(): string {
    if (!this.sub || this.sub.isClosed()) {
      this.sub = this.t.nc.subscribe(createInbox(), { callback: (_err, m) => this.onAnswer(m) });
    }
    return this.sub.getSubject();
  }

  private onAnswer(m: Msg): void {
    let r: Reply<PlacePendingReply>;
    try {
      r = decode(m.data) as Reply<PlacePendingReply>;
    } catch {
      return;
    }
    if (!r.ok) return;
    // Any answer, also one that comes after its probe's collect window, says the create is held:
    // a replica whose loop lags past the window (GC of a large heap, a queue of thousands of
    // creates) is alive. Dropped, such answers failed 366 of 32,000 creates at 350,000 live in
    // bench:scale as placement_lost while their replicas were placing them.
    const now = Date.now();
    for (const h of r.result.held) {
      const w = this.watched.get(h.id);
      if (!w) continue;
      w.heldAt = Math.max(w.heldAt, now);
      if (h.node) w.node = h.node;
    }
  }

  private async probe(): Promise<void> {
    // Down: the create is sent again on reconnect, which restarts every watch's clock (start).
    if (this.probing || !this.t.isConnected || this.t.nc.isClosed()) return;
    const now = Date.now();
    const due = [...this.watched.values()].filter((w) => now - w.sentAt >= PROBE_MS);
    if (due.length === 0) return;
    this.probing = true;
    try {
      const reply = this.inbox();
      for (let i = 0; i < due.length; i += BATCH) {
        this.t.nc.publish(subjects.placePending, encode({ ids: due.slice(i, i + BATCH).map((w) => w.id) }), { reply });
      }
      await new Promise((r) => setTimeout(r, COLLECT_MS));
    } catch {
      return; // a publish that fails (closing, reconnecting): the next probe asks again
    } finally {
      this.probing = false;
    }
    if (!this.t.isConnected) return;
    const at = Date.now();
    for (const w of due) {
      if (this.watched.get(w.id) !== w) continue;
      if (at - w.heldAt < LOST_AFTER_MS) continue;
      this.watched.delete(w.id);
      const where = w.node ? ` (it had been sent to node ${w.node})` : '';
      w.fail(
        new UnavailableError(
          'UNAVAILABLE',
          `the create of ${w.id} was lost: no placement replica has held it for ${Math.round((at - w.heldAt) / 1000)} s (the one that took it stopped)${where}. It may have been made: sandboxes.get('${w.id}') tells`,
          { detail: { what: subjects.placeCreate, reason: 'placement_lost', id: w.id, inDoubt: true, ...(w.node ? { node: w.node } : {}) } },
        ),
      );
    }
    if (this.watched.size === 0) this.stop();
  }
}
