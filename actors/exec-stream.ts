/**
 * The node's side of one streamed exec: every event gets the next sequence number, and the most
 * recent ones are kept (up to STREAM_BUFFER_BYTES of output) so that a caller who missed some
 * (NATS restarted, its client reconnected: what either side published meanwhile is gone) asks
 * `exec.resume` and gets them again. What the buffer no longer holds comes back as one `gap`
 * event saying how many events and bytes were lost, never as silence.
 */
import { encodeOutputEvent, type ExecEvent, SendWindow } from '../protocol/index.ts';
import type { OutputFlow } from '../runtime/backend.ts';

/** Output kept per running stream: two full chunks (STREAM_CHUNK_BYTES), or more smaller ones. */
export const STREAM_BUFFER_BYTES = 512 * 1024;
/**
 * Output read in one turn of the event loop goes out as one event of up to this many bytes. A
 * command's pipe is read as fast as it is written, mostly 4–8 KiB at a time, and every event costs
 * a message in the node, in nats-server and in the caller: sent as read, a 48 MiB stream was ~6,000
 * events and ran at 28–52 MiB/s on a 2-core host. At 64 KiB the node took 6.5 ms and nats-server 6
 * ms of CPU per MiB streamed; at 256 KiB 2.5–3.5 and 4.5–5 (the SDK's stream 82 → 115–135 MiB/s).
 */
export const STREAM_CHUNK_BYTES = 256 * 1024;
/** How long a finished stream's last events stay: a caller reconnecting after the exit still finds it. */
export const STREAM_KEEP_MS = 30_000;

/**
 * Output read in one turn of the event loop, joined: one stream's bytes until the turn ends, the
 * other stream's come, or STREAM_CHUNK_BYTES are held. `at` is the offset of the first byte, for
 * callers that address output by offset (a background process's readers).
 */
export class TurnBatch<T extends string = 'out' | 'err'> {
  private pending: { t: T; parts: Uint8Array[]; bytes: number; at: number } | undefined;
  private queued = false;

  constructor(private readonly emit: (t: T, parts: Uint8Array[], bytes: number, at: number) => void) {}

  /** Bytes held, not yet emitted. */
  get bytes(): number {
    return this.pending?.bytes ?? 0;
  }

  add(t: T, d: Uint8Array, at = 0): void {
    if (d.length === 0) return;
    if (this.pending && this.pending.t !== t) this.flush();
    const p = this.pending ?? { t, parts: [], bytes: 0, at };
    this.pending = p;
    p.parts.push(d);
    p.bytes += d.length;
    if (p.bytes >= STREAM_CHUNK_BYTES) this.flush();
    else if (!this.queued) {
      this.queued = true;
      setImmediate(() => {
        this.queued = false;
        this.flush();
      });
    }
  }

  /** What is held, taken out without being emitted (its owner sends it its own way). */
  take(): { t: T; parts: Uint8Array[]; bytes: number; at: number } | undefined {
    const p = this.pending;
    this.pending = undefined;
    return p;
  }

  flush(): void {
    const p = this.take();
    if (p) this.emit(p.t, p.parts, p.bytes, p.at);
  }
}

type Unnumbered = Exclude<ExecEvent, { t: 'gap' }>;
type Numbered = Unnumbered & { s: number };

function sizeOf(ev: ExecEvent): number {
  return 'd' in ev ? ev.d.length : 0;
}

export class ExecStream implements OutputFlow {
  private next = 0;
  /** Output bytes sent so far, against the caller's window and credits (exec.credit, a resume's offset). */
  private readonly out: SendWindow;
  private waiting: Array<() => void> = [];
  /** Recent events, oldest first, each with the output offset it starts at (and its bytes on the wire, for output). */
  private readonly kept: Array<{ ev: Numbered; at: number; wire?: Uint8Array }> = [];
  private keptBytes = 0;
  /** Output not sent yet: one stream's, sent at the end of this turn of the event loop. */
  private readonly batch = new TurnBatch((t, parts, bytes) => this.sendOutput(t, parts, bytes, true));
  done = false;

  constructor(
    /** Publishes an event: `wire`, when given, is its MessagePack already (output: encodeOutputEvent). */
    private readonly send: (ev: ExecEvent, wire?: Uint8Array) => void,
    private readonly maxBytes = STREAM_BUFFER_BYTES,
    /** The caller's window (ExecRequest.window): absent, nothing is ever held. */
    window?: number,
  ) {
    this.out = new SendWindow(window);
  }

  /** A window of output is out past the caller's last credit: the command should wait. */
  held(): boolean {
    return !this.done && this.out.full(this.batch.bytes);
  }

  whenOpen(cb: () => void): void {
    if (!this.held()) cb();
    else this.waiting.push(cb);
  }

  /** The caller has taken `received` output bytes (never more than were sent). */
  credit(received: number): void {
    this.out.credit(received);
    if (!this.held()) this.open();
  }

  private open(): void {
    const w = this.waiting;
    this.waiting = [];
    for (const cb of w) cb();
  }

  /** Output of the command: joined with what else came in this turn, up to STREAM_CHUNK_BYTES. */
  output(t: 'out' | 'err', d: Uint8Array): void {
    this.batch.add(t, d);
  }

  /** `send` false: numbered and kept only, for a resume that is about to send it. */
  private flush(send = true): void {
    const p = this.batch.take();
    if (p) this.sendOutput(p.t, p.parts, p.bytes, send);
  }

  private sendOutput(t: 'out' | 'err', parts: Uint8Array[], bytes: number, send: boolean): void {
    const { wire, d } = encodeOutputEvent(t, this.next, parts, bytes);
    this.send1({ t, d }, send, wire);
  }

  /** Numbers, keeps and sends one event, after the output before it. */
  emit(event: Unnumbered): void {
    this.flush();
    this.send1(event);
  }

  private send1(event: Unnumbered, send = true, wire?: Uint8Array): void {
    const ev = { ...event, s: this.next++ } as Numbered;
    const size = sizeOf(ev);
    this.kept.push({ ev, at: this.out.sent, ...(wire ? { wire } : {}) });
    this.out.sent += size;
    this.keptBytes += size;
    // The newest event stays whatever its size: the end of a stream must always be resendable.
    while (this.keptBytes > this.maxBytes && this.kept.length > 1) {
      const old = this.kept.shift();
      if (old) this.keptBytes -= sizeOf(old.ev);
    }
    if (ev.t === 'exit' || ev.t === 'error') {
      this.done = true;
      this.open();
    }
    if (send) this.send(ev, wire);
  }

  /**
   * Sends again every event from `from` on; those no longer held as one gap first. `offset` is
   * what output the caller has (it sizes the gap; without it the gap counts all output before
   * what is held).
   */
  resume(from: number, offset?: number): { resent: number; next: number; done: boolean } {
    this.flush(false);
    // What the caller has is what it took, or more: a credit lost on the way is made good here.
    if (offset !== undefined) this.credit(offset);
    let resent = 0;
    const first = this.kept[0];
    const firstSeq = first ? first.ev.s : this.next;
    if (from < firstSeq) {
      const firstAt = first ? first.at : this.out.sent;
      this.send({ t: 'gap', s: from, n: firstSeq - from, bytes: Math.max(0, firstAt - (offset ?? 0)) });
      resent++;
    }
    for (const h of this.kept) {
      if (h.ev.s < from) continue;
      this.send(h.ev, h.wire);
      resent++;
    }
    return { resent, next: this.next, done: this.done };
  }
}
