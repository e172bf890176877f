/**
 * The node's side of one streamed exec: every event gets the next sequence number, and the most
 * recent ones are kept (up to STREAM_BUFFER_BYTES of output) so that a caller who missed some
 * (NATS restarted, its client reconnected: what either side published meanwhile is gone) asks
 * `exec.resume` and gets them again. What the buffer no longer holds comes back as one `gap`
 * event saying how many events and bytes were lost, never as silence.
 */
import type { ExecEvent } from '../protocol/index.ts';

/** Output kept per running stream: at the default 64 KiB chunks, the last eight of them. */
export const STREAM_BUFFER_BYTES = 512 * 1024;
/** How long a finished stream's last events stay: a caller reconnecting after the exit still finds it. */
export const STREAM_KEEP_MS = 30_000;

type Unnumbered = Exclude<ExecEvent, { t: 'gap' }>;
type Numbered = Unnumbered & { s: number };

function sizeOf(ev: ExecEvent): number {
  return 'd' in ev ? ev.d.length : 0;
}

export class ExecStream {
  private next = 0;
  /** Output bytes sent so far. */
  private offset = 0;
  /** Recent events, oldest first, each with the output offset it starts at. */
  private readonly held: Array<{ ev: Numbered; at: number }> = [];
  private heldBytes = 0;
  done = false;

  constructor(
    private readonly send: (ev: ExecEvent) => void,
    private readonly maxBytes = STREAM_BUFFER_BYTES,
  ) {}

  /** Numbers, keeps and sends one event. */
  emit(event: Unnumbered): void {
    const ev = { ...event, s: this.next++ } as Numbered;
    const size = sizeOf(ev);
    this.held.push({ ev, at: this.offset });
    this.offset += size;
    this.heldBytes += size;
    // The newest event stays whatever its size: the end of a stream must always be resendable.
    while (this.heldBytes > this.maxBytes && this.held.length > 1) {
      const old = this.held.shift();
      if (old) this.heldBytes -= sizeOf(old.ev);
    }
    if (ev.t === 'exit' || ev.t === 'error') this.done = true;
    this.send(ev);
  }

  /**
   * Sends again every event from `from` on; those no longer held as one gap first. `offset` is
   * what output the caller has (it sizes the gap; without it the gap counts all output before
   * what is held).
   */
  resume(from: number, offset?: number): { resent: number; next: number; done: boolean } {
    let resent = 0;
    const first = this.held[0];
    const firstSeq = first ? first.ev.s : this.next;
    if (from < firstSeq) {
      const firstAt = first ? first.at : this.offset;
      this.send({ t: 'gap', s: from, n: firstSeq - from, bytes: Math.max(0, firstAt - (offset ?? 0)) });
      resent++;
    }
    for (const h of this.held) {
      if (h.ev.s < from) continue;
      this.send(h.ev);
      resent++;
    }
    return { resent, next: this.next, done: this.done };
  }
}
