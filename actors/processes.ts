/**
 * A sandbox's background processes and terminals, as its node keeps them: a table of at most
 * Limits.processes.liveMax running ones (and the most recent that exited), each with a bounded
 * buffer per output stream and the readers that follow it.
 *
 * Output is addressed by byte offset in its stream, not by message: a reader says where it wants
 * to start, gets a `gap` for what the buffer dropped before that, then every chunk with its offset.
 * A reader that lost messages (a NATS outage) asks again from the last offset it has; nothing is
 * numbered per reader, so any number of clients can read one process at once, or one after another.
 *
 * The table lives in the node's memory: a node restart ends its sandboxes (reason
 * `node_restarted`) and their processes with them, so nothing here needs to outlive it.
 */

import { Limits, type ProcessEvent, type ProcessInfo, ProtocolError } from '../protocol/index.ts';
import { EXEC_KILLED, type ExecOutcome, type OutputFlow, type RunningProcess } from '../runtime/backend.ts';
import { TurnBatch } from './exec-stream.ts';

type Which = 'out' | 'err';

/** The newest bytes of one stream, with the offset of the first one still held. */
export class Ring {
  private readonly chunks: Array<{ at: number; d: Buffer }> = [];
  /** Offset of the first byte held (= bytes dropped). */
  start = 0;
  /** Bytes written in all (= the next offset). */
  total = 0;

  constructor(private readonly max: number) {}

  append(d: Buffer): number {
    const at = this.total;
    this.chunks.push({ at, d });
    this.total += d.length;
    // Dropped from the front, the oldest chunk cut when only part of it must go.
    while (this.total - this.start > this.max) {
      const first = this.chunks[0];
      if (!first) break;
      const over = this.total - this.start - this.max;
      if (over >= first.d.length) {
        this.chunks.shift();
        this.start = first.at + first.d.length;
      } else {
        first.d = first.d.subarray(over);
        first.at += over;
        this.start = first.at;
      }
    }
    return at;
  }

  /** What is held from `from` on, with what was asked for but is gone. */
  from(from: number): { lost?: { o: number; bytes: number }; chunks: Array<{ at: number; d: Buffer }> } {
    const chunks: Array<{ at: number; d: Buffer }> = [];
    const lost = from < this.start ? { o: from, bytes: this.start - from } : undefined;
    for (const c of this.chunks) {
      const end = c.at + c.d.length;
      if (end <= from) continue;
      chunks.push(c.at >= from ? c : { at: from, d: c.d.subarray(from - c.at) });
    }
    return lost ? { lost, chunks } : { chunks };
  }
}

interface Reader {
  send: (ev: ProcessEvent) => void;
  /** A holding reader's flow: the offsets it has credited, its window, and when it last credited. */
  hold?: { window: number; stallMs: number; out: number; err: number; at: number };
}

/**
 * A process's output flow (runtime OutputFlow, as a streamed exec's): while a holding reader has
 * a window or more past its last credit, the backend leaves the process's output unread, so the
 * process waits on its pipe. The ring holds everything sent and not yet credited (a window is at
 * most half the buffer), so a reader that lost a message reads it again from its offsets.
 */
export class TrackedProcess implements OutputFlow {
  readonly out: Ring;
  readonly err: Ring;
  info: ProcessInfo;
  running?: RunningProcess;
  /** The last signal the caller sent: a death by signal is then its doing (verdict KILLED). */
  private sent?: string;
  private readonly readers = new Map<string, Reader>();
  private readonly waiters: Array<() => void> = [];
  readonly abort = new AbortController();
  private waiting: Array<() => void> = [];
  private stallTimer: NodeJS.Timeout | undefined;
  /**
   * What followers have not been sent yet: the output read in this turn, as one event. Sent as
   * read, a 48 MiB `dd` was 768 messages (a pipe read is ≤ 64 KiB, 4–8 KiB from a program that
   * writes little at a time), each a cost in the node, in nats-server and in every reader.
   */
  private readonly batch = new TurnBatch<Which>((t, parts, bytes, o) => {
    const d = parts.length === 1 ? (parts[0] as Buffer) : Buffer.concat(parts, bytes);
    for (const r of this.readers.values()) r.send({ t, d, o });
  });

  constructor(id: string, cmd: string[], bufferBytes: number, extra: { tag?: string; pty?: { cols: number; rows: number } }) {
    this.out = new Ring(bufferBytes);
    this.err = new Ring(bufferBytes);
    this.info = { id, cmd, state: 'running', startedAt: Date.now(), bytesOut: 0, bytesErr: 0, droppedOut: 0, droppedErr: 0, bufferBytes, ...extra };
  }

  /** Bytes a holding reader has been sent (or will be, this turn) past its last credit. */
  private outstanding(h: NonNullable<Reader['hold']>): number {
    return this.out.total - h.out + (this.err.total - h.err);
  }

  /** Some holding reader has a window or more out past its last credit: the process should wait. */
  held(): boolean {
    if (this.exited) return false;
    for (const r of this.readers.values()) if (r.hold && this.outstanding(r.hold) >= r.hold.window) return true;
    return false;
  }

  whenOpen(cb: () => void): void {
    if (!this.held()) {
      cb();
      return;
    }
    this.waiting.push(cb);
    this.watchStall();
  }

  /** A holding reader has every byte before these offsets. */
  credit(readerId: string, out: number, err: number): boolean {
    const h = this.readers.get(readerId)?.hold;
    if (!h) return false;
    // Offsets only move forward, and never past what was written: a late or forged credit changes nothing.
    h.out = Math.max(h.out, Math.min(out, this.out.total));
    h.err = Math.max(h.err, Math.min(err, this.err.total));
    h.at = Date.now();
    this.reopen();
    return true;
  }

  private reopen(): void {
    if (this.waiting.length === 0 || this.held()) return;
    if (this.stallTimer) clearTimeout(this.stallTimer);
    this.stallTimer = undefined;
    const w = this.waiting;
    this.waiting = [];
    for (const cb of w) cb();
  }

  /**
   * While the process waits, a holding reader that has credited nothing for its stallMs is let
   * go: it went away (its client died without cancelling) or cannot keep up at all.
   */
  private watchStall(): void {
    if (this.stallTimer) return;
    let next = Number.POSITIVE_INFINITY;
    for (const r of this.readers.values()) if (r.hold && this.outstanding(r.hold) >= r.hold.window) next = Math.min(next, r.hold.at + r.hold.stallMs);
    if (next === Number.POSITIVE_INFINITY) return;
    this.stallTimer = setTimeout(() => {
      this.stallTimer = undefined;
      const now = Date.now();
      for (const [id, r] of this.readers) {
        if (!r.hold || this.outstanding(r.hold) < r.hold.window || now < r.hold.at + r.hold.stallMs) continue;
        this.readers.delete(id);
        r.send({ t: 'error', error: { code: 'CANCELLED', message: `reader ${id} of process ${this.info.id} credited nothing for ${r.hold.stallMs} ms while the process waited on it: it was let go, and the process goes on`, retryable: true } });
      }
      this.reopen();
      if (this.waiting.length > 0) this.watchStall();
    }, Math.max(0, next - Date.now()));
    this.stallTimer.unref?.();
  }

  get exited(): boolean {
    return this.info.state === 'exited';
  }

  /** The record with its counters as they are now. */
  snapshot(): ProcessInfo {
    return { ...this.info, bytesOut: this.out.total, bytesErr: this.err.total, droppedOut: this.out.start, droppedErr: this.err.start };
  }

  output(which: Which, d: Buffer): void {
    const o = (which === 'out' ? this.out : this.err).append(d);
    if (this.readers.size > 0) this.batch.add(which, d, o);
  }

  ended(o: ExecOutcome | Error): void {
    const exit: Extract<ProcessEvent, { t: 'exit' }> extends infer E ? Omit<E, 't'> : never =
      o instanceof Error
        ? { exitCode: 127, durationMs: Date.now() - this.info.startedAt, truncated: false, timedOut: false, verdict: 'OK' as const }
        : { exitCode: o.exitCode, ...(o.signal ? { signal: o.signal } : {}), durationMs: o.durationMs, truncated: o.truncated, timedOut: o.timedOut, verdict: o.verdict ?? (o.timedOut ? 'TIMEOUT' : o.truncated ? 'OUTPUT_LIMIT' : 'OK') };
    if (this.sent !== undefined && exit.signal !== undefined && (exit.verdict === 'OK' || exit.verdict === 'CANCELLED')) exit.verdict = 'KILLED';
    this.batch.flush();
    this.info = { ...this.info, ...exit, state: 'exited', endedAt: Date.now() };
    this.running = undefined;
    for (const r of this.readers.values()) {
      if (o instanceof Error) r.send({ t: 'error', error: { code: 'BACKEND_FAILED', message: o.message, retryable: false } });
      else r.send({ t: 'exit', ...exit });
    }
    this.readers.clear();
    for (const w of this.waiters.splice(0)) w();
    this.reopen();
  }

  /** Sends what is held from the offsets asked for, then (follow) every chunk as it comes until the exit. */
  read(req: { out: number; err: number; follow: boolean; readerId?: string; window?: number; stallMs?: number }, send: (ev: ProcessEvent) => void): void {
    // Followers get what this turn read before a new reader joins: its held output below has it.
    this.batch.flush();
    for (const which of ['out', 'err'] as const) {
      const ring = which === 'out' ? this.out : this.err;
      const held = ring.from(Math.min(req[which], ring.total));
      if (held.lost) send({ t: 'gap', stream: which, o: held.lost.o, bytes: held.lost.bytes });
      for (const c of held.chunks) send({ t: which, d: c.d, o: c.at });
    }
    if (this.exited) {
      const { exitCode = 0, signal, durationMs = 0, truncated = false, timedOut = false, verdict = 'OK' } = this.info;
      send({ t: 'exit', exitCode, ...(signal ? { signal } : {}), durationMs, truncated, timedOut, verdict });
      return;
    }
    if (!req.follow) {
      send({ t: 'end', out: this.out.total, err: this.err.total });
      return;
    }
    const readerId = req.readerId ?? `r${Math.random().toString(36).slice(2)}`;
    this.readers.delete(readerId);
    // Credited from where it starts: what it asked to skip, or what the buffer no longer had.
    const hold = req.window !== undefined ? { window: req.window, stallMs: req.stallMs ?? Limits.processes.stallMs.default, out: Math.min(Math.max(req.out, this.out.start), this.out.total), err: Math.min(Math.max(req.err, this.err.start), this.err.total), at: Date.now() } : undefined;
    this.readers.set(readerId, hold ? { send, hold } : { send });
    // Oldest first: a client that went away without cancelling is the one let go.
    while (this.readers.size > Limits.processes.readersMax) {
      const [oldest, r] = this.readers.entries().next().value as [string, Reader];
      this.readers.delete(oldest);
      r.send({ t: 'error', error: { code: 'CANCELLED', message: `more than ${Limits.processes.readersMax} readers follow process ${this.info.id}: the oldest was stopped`, retryable: false } });
    }
    // A reader that replaced one of the same id, or evicted one, may have let the process go on.
    this.reopen();
  }

  unfollow(readerId: string): boolean {
    const had = this.readers.delete(readerId);
    this.reopen();
    return had;
  }

  /** Resolves at the exit, or after `ms`. */
  wait(ms: number): Promise<void> {
    if (this.exited) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.waiters.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  async kill(signal: string): Promise<void> {
    if (!this.running) return;
    this.sent = signal;
    await this.running.kill(signal);
  }
}

export class ProcessTable {
  private seq = 0;
  private readonly procs = new Map<string, TrackedProcess>();

  constructor(private readonly sandbox: string) {}

  get live(): number {
    let n = 0;
    for (const p of this.procs.values()) if (!p.exited) n++;
    return n;
  }

  /** A new entry, or PIDS_LIMIT when the sandbox runs as many as it may. */
  add(cmd: string[], bufferBytes: number, extra: { tag?: string; pty?: { cols: number; rows: number } }): TrackedProcess {
    if (this.live >= Limits.processes.liveMax) {
      throw new ProtocolError('PIDS_LIMIT', `sandbox ${this.sandbox} runs ${Limits.processes.liveMax} background processes, as many as it may: wait for or kill one first`, { detail: { limit: Limits.processes.liveMax } });
    }
    const p = new TrackedProcess(`p${++this.seq}`, cmd, bufferBytes, extra);
    this.procs.set(p.info.id, p);
    return p;
  }

  remove(id: string): void {
    this.procs.delete(id);
  }

  /** After an exit: the oldest exited entries beyond Limits.processes.exitedKept are forgotten. */
  prune(): void {
    const exited = [...this.procs.values()].filter((p) => p.exited);
    for (const p of exited.slice(0, Math.max(0, exited.length - Limits.processes.exitedKept))) this.procs.delete(p.info.id);
  }

  get(id: string): TrackedProcess {
    const p = this.procs.get(id);
    if (!p) throw new ProtocolError('NOT_FOUND', `no process ${id} in sandbox ${this.sandbox} (it never was, or exited long enough ago to be forgotten)`, { detail: { id } });
    return p;
  }

  list(): ProcessInfo[] {
    return [...this.procs.values()].map((p) => p.snapshot());
  }

  /** The sandbox is ending: every running process is killed, its verdict KILLED. */
  killAll(): void {
    for (const p of this.procs.values()) if (!p.exited) p.abort.abort(EXEC_KILLED);
  }
}
