/**
 * Background processes and terminals of a sandbox (`sb.processes`, `sb.pty`). A process runs on
 * after the call that started it; its node keeps the newest output of each stream (1 MiB by
 * default), so any client, now or later, reads it from a byte offset and learns how much was
 * dropped before it came.
 */
import { createInbox, type Msg } from '@nats-io/transport-node';
import { decode, encode, type ExecVerdict, Limits, type ProcessEvent, type ProcessInfo, type ProcessListReply, type Reply, subjects } from '../protocol/index.ts';
import { CancelledError, errorFromWire, InvalidRequestError } from './errors.ts';
import type { Sandbox } from './sandbox.ts';
import type { CallOptions, Transport } from './transport.ts';

export type { ProcessInfo } from '../protocol/index.ts';

export interface ProcessStartOptions extends CallOptions {
  cwd?: string;
  env?: Record<string, string>;
  /** Kill it (verdict TIMEOUT) after this long, as exec's `timeoutMs`. Default: no timeout of its own; the sandbox's ttl bounds it. */
  timeoutMs?: number;
  /** Cap on stdout and on stderr over its whole life (verdict OUTPUT_LIMIT). Default: none. */
  maxOutputBytes?: number;
  /** Output kept on the node per stream for readers (default: the node's, 1 MiB). */
  bufferBytes?: number;
  /** Free text shown in `list()`. */
  tag?: string;
}

/** How a process ended: the fields of an exec's result, without its output (read that with `output()`). */
export interface ProcessResult {
  verdict: ExecVerdict;
  exitCode: number;
  signal?: string;
  durationMs: number;
  truncated: boolean;
  timedOut: boolean;
}

export type ProcessOutputEvent =
  | { type: 'stdout' | 'stderr'; data: Uint8Array; text: string; offset: number }
  /** Bytes of `stream` from `offset` on that the node had dropped before this reader asked for them. */
  | { type: 'gap'; stream: 'stdout' | 'stderr'; offset: number; bytes: number }
  | ({ type: 'exit' } & ProcessResult);

export interface ProcessOutputOptions {
  /** Where to start: byte offsets in stdout and stderr, or one number for both (default 0: all the node holds). */
  from?: number | { stdout?: number; stderr?: number };
  /** Keep reading until it exits (default), or stop at what the node holds now. */
  follow?: boolean;
  /**
   * Every byte, at the loop's pace (containers): the process waits on its pipe while this reader
   * is a window behind (1 MiB, or half the process's buffer if less), instead of this reader
   * getting `gap`s for what the node's buffer dropped. A reader that takes nothing for `stallMs`
   * (default 60 s) is let go with CANCELLED and the process goes on. Other readers' pace is the
   * slowest holding reader's.
   */
  hold?: boolean;
  stallMs?: number;
  signal?: AbortSignal;
}

/** A holding reader's window: what the process may get ahead of the loop. */
const HOLD_WINDOW_BYTES = 1024 * 1024;

/** A silent reader checks this often that the process and its sandbox still answer. */
const PROBE_MS = 5000;
/**
 * Output received and not yet taken by the loop, past which the reader stops the node's sending
 * and asks again from its offsets once the loop has caught up. A follower that reads slower than
 * the process writes (an HTTP client behind the gateway) otherwise made this queue, and the
 * gateway's memory, grow for as long as it followed: ~25 MiB/s with \`yes\`, 0.9 GiB in 30 s.
 * What the node dropped meanwhile comes as a gap, as for any late reader.
 */
const QUEUED_MAX_BYTES = 8 * 1024 * 1024;
const WAIT_MS = 20_000;
const utf8 = new TextDecoder();

export class ProcessHandle {
  constructor(
    /** @internal */
    protected readonly sb: Sandbox,
    /** Last known record; `refresh()` fetches a new one. */
    public info: ProcessInfo,
  ) {}

  get id(): string {
    return this.info.id;
  }

  /** Its pid inside the sandbox. */
  get pid(): number | undefined {
    return this.info.pid;
  }

  async refresh(opts?: CallOptions): Promise<ProcessInfo> {
    this.info = await this.sb.call<ProcessInfo>('process.get', { id: this.id }, opts);
    return this.info;
  }

  /** Waits for its end (as long as it takes; `signal` stops waiting, not the process). */
  async wait(opts: { signal?: AbortSignal } = {}): Promise<ProcessResult> {
    for (;;) {
      if (opts.signal?.aborted) throw new CancelledError('CANCELLED', 'the wait was cancelled');
      this.info = await this.sb.call<ProcessInfo>('process.wait', { id: this.id, waitMs: WAIT_MS }, { timeoutMs: WAIT_MS + 10_000, ...(opts.signal ? { signal: opts.signal } : {}) });
      if (this.info.state === 'exited') return resultOf(this.info);
    }
  }

  /** Sends a signal (default SIGKILL, which ends its whole process tree). A process ended by it has verdict KILLED. */
  async kill(signal = 'SIGKILL', opts?: CallOptions): Promise<ProcessInfo> {
    this.info = await this.sb.call<ProcessInfo>('process.kill', { id: this.id, signal }, opts);
    return this.info;
  }

  /** Bytes for its stdin (a string as UTF-8). BUSY when it has not read the last MiB yet. */
  async write(data: string | Uint8Array, opts?: CallOptions): Promise<void> {
    const bytes = typeof data === 'string' ? new TextEncoder().encode(data) : data;
    // One message each, under what the server takes (a NATS of its own default takes 1 MiB in all).
    const max = this.sb.transport.nc.info?.max_payload ?? Limits.processes.inputMax;
    const chunk = Math.max(4096, Math.min(Limits.processes.inputMax, max - 64 * 1024));
    for (let at = 0; at < bytes.length; at += chunk) {
      await this.sb.call('process.input', { id: this.id, data: bytes.subarray(at, at + chunk) }, opts);
    }
  }

  /** Closes its stdin (it reads end of file). */
  async closeStdin(opts?: CallOptions): Promise<void> {
    await this.sb.call('process.input', { id: this.id, eof: true }, opts);
  }

  /**
   * Its output from `from` on, as the node holds it, then as it comes until the exit (`follow`).
   * Bytes the node dropped before they were asked for come as one `gap` per stream. A message
   * lost on the way (a NATS outage) is asked for again from the offsets received, so nothing is
   * skipped silently. Breaking out of the loop stops the reader, not the process.
   */
  async *output(opts: ProcessOutputOptions = {}): AsyncGenerator<ProcessOutputEvent, void, undefined> {
    const t: Transport = this.sb.transport;
    const nc = t.nc;
    const from = typeof opts.from === 'number' ? { stdout: opts.from, stderr: opts.from } : (opts.from ?? {});
    const next = { out: from.stdout ?? 0, err: from.stderr ?? 0 };
    const follow = opts.follow ?? true;
    let window: number | undefined;
    if (opts.hold && follow) {
      const buffer = this.info.bufferBytes ?? (await this.refresh()).bufferBytes;
      if (buffer === undefined) throw new InvalidRequestError('INVALID_REQUEST', `hold: the node of sandbox ${this.sb.id} does not hold readers (it predates them)`);
      window = Math.max(Limits.processes.window.min, Math.min(HOLD_WINDOW_BYTES, Math.floor(buffer / 2)));
    }
    /** The offsets last credited (a holding reader credits in steps of half its window). */
    const credited = { out: next.out, err: next.err };
    const credit = (force: boolean) => {
      if (window === undefined || !readerId) return;
      const taken = next.out - credited.out + (next.err - credited.err);
      if (taken === 0 || (!force && taken < window / 2)) return;
      credited.out = next.out;
      credited.err = next.err;
      try {
        nc.publish(subjects.sandbox(this.sb.id, 'process.output.credit'), encode({ id: this.id, readerId, out: next.out, err: next.err }));
      } catch {
        // NATS away: the ask after the reconnect starts from these offsets anyway.
      }
    };
    const queue: Array<Msg | { again: true }> = [];
    let queued = 0;
    /** The node's sending was stopped because the loop fell QUEUED_MAX_BYTES behind. */
    let behind = false;
    let wake: (() => void) | null = null;
    const push = (m: Msg | { again: true }) => {
      queue.push(m);
      if ('data' in m) queued += m.data.length;
      wake?.();
    };
    let readerId = '';
    let sub: ReturnType<typeof nc.subscribe> | undefined;
    let ended = false;
    const subject = subjects.sandbox(this.sb.id, 'process.output');
    const cancel = () => {
      sub?.unsubscribe();
      sub = undefined;
      // The node's reader of the last ask would go on sending to an inbox no one reads.
      if (readerId && follow) nc.publish(subjects.sandbox(this.sb.id, 'process.output.cancel'), encode({ id: this.id, readerId }));
      readerId = '';
    };
    const ask = async () => {
      cancel();
      behind = false;
      readerId = `r${Math.random().toString(36).slice(2, 14)}`;
      const inbox = createInbox();
      sub = nc.subscribe(inbox, {
        callback: (_e, m) => {
          push(m);
          // A holding reader's queue is bounded by its window: the node waits for its credits.
          if (window === undefined && queued > QUEUED_MAX_BYTES && !behind) {
            behind = true;
            cancel();
          }
        },
      });
      await t.connected(30_000, subject);
      credited.out = next.out;
      credited.err = next.err;
      const hold = window !== undefined ? { window, ...(opts.stallMs !== undefined ? { stallMs: opts.stallMs } : {}) } : {};
      nc.publish(subject, encode({ id: this.id, out: next.out, err: next.err, follow, readerId, ...hold }), { reply: inbox });
    };
    const stopReconnect = t.onReconnect(() => push({ again: true }));
    try {
      await ask();
      for (;;) {
        if (queue.length === 0 && behind) {
          // Caught up: what came meanwhile is asked for from the offsets taken.
          await ask();
          continue;
        }
        if (queue.length === 0) {
          if (opts.signal?.aborted) throw new CancelledError('CANCELLED', 'the output reader was cancelled');
          // Everything received is taken: the node may be waiting for this credit.
          credit(true);
          let timer: NodeJS.Timeout | undefined;
          const onAbort = () => wake?.();
          opts.signal?.addEventListener('abort', onAbort, { once: true });
          const woke = await new Promise<boolean>((resolve) => {
            wake = () => resolve(true);
            timer = setTimeout(() => resolve(false), PROBE_MS);
          });
          wake = null;
          clearTimeout(timer);
          opts.signal?.removeEventListener('abort', onAbort);
          // Silence: the process may have exited with its last message lost, or its sandbox ended (refresh throws NOT_FOUND then).
          if (!woke && (await this.refresh()).state === 'exited') await ask();
          continue;
        }
        const m = queue.shift() as Msg | { again: true };
        if ('again' in m) {
          await ask();
          continue;
        }
        queued -= m.data.length;
        const ev = decode(m.data) as ProcessEvent | Reply<unknown>;
        if ('ok' in ev) {
          if (!ev.ok) throw errorFromWire(ev.error);
          continue;
        }
        switch (ev.t) {
          case 'out':
          case 'err': {
            const at = next[ev.t];
            if (ev.o > at) {
              // A message was lost on the way: ask again from what we have.
              await ask();
              continue;
            }
            if (ev.o + ev.d.length <= at) continue;
            const d = ev.o < at ? ev.d.subarray(at - ev.o) : ev.d;
            next[ev.t] = at + d.length;
            yield {
              type: ev.t === 'out' ? 'stdout' : 'stderr',
              data: d,
              // Decoded when read, as an exec stream's (sandbox.ts outputEvent).
              get text() {
                return utf8.decode(d);
              },
              offset: at,
            };
            credit(false);
            break;
          }
          case 'gap': {
            if (ev.o + ev.bytes <= next[ev.stream]) continue;
            next[ev.stream] = ev.o + ev.bytes;
            yield { type: 'gap', stream: ev.stream === 'out' ? 'stdout' : 'stderr', offset: ev.o, bytes: ev.bytes };
            break;
          }
          case 'exit': {
            ended = true;
            const { t: _, ...rest } = ev;
            yield { type: 'exit', ...rest };
            return;
          }
          case 'end':
            ended = true;
            return;
          case 'error':
            ended = true;
            throw errorFromWire(ev.error);
        }
      }
    } finally {
      stopReconnect();
      if (ended) sub?.unsubscribe();
      else cancel();
    }
  }

  /** Everything the node holds of its stdout and stderr now, as text. */
  async text(): Promise<{ stdout: string; stderr: string; dropped: { stdout: number; stderr: number } }> {
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    const dropped = { stdout: 0, stderr: 0 };
    for await (const ev of this.output({ follow: false })) {
      if (ev.type === 'stdout') out.push(ev.data);
      else if (ev.type === 'stderr') err.push(ev.data);
      else if (ev.type === 'gap') dropped[ev.stream] += ev.bytes;
    }
    return { stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString(), dropped };
  }
}

/** A terminal: a process on a pseudo-terminal. Iterate it for what the terminal prints. */
export class PtyHandle extends ProcessHandle {
  /** Types `input` (a string as UTF-8; `\r` is Enter). */
  override write(input: string | Uint8Array, opts?: CallOptions): Promise<void> {
    return super.write(input, opts);
  }

  /** A new size: the terminal's foreground process gets SIGWINCH. */
  async resize(cols: number, rows: number, opts?: CallOptions): Promise<void> {
    await this.sb.call('process.resize', { id: this.id, cols, rows }, opts);
    this.info = { ...this.info, pty: { cols, rows } };
  }

  /** What the terminal prints, from `from` (a byte offset) on, until the shell exits. */
  async *bytes(opts: { from?: number; signal?: AbortSignal } = {}): AsyncGenerator<Uint8Array, void, undefined> {
    for await (const ev of this.output({ from: opts.from ?? 0, ...(opts.signal ? { signal: opts.signal } : {}) })) {
      if (ev.type === 'stdout') yield ev.data;
    }
  }

  [Symbol.asyncIterator](): AsyncGenerator<Uint8Array, void, undefined> {
    return this.bytes();
  }
}

export class SandboxProcesses {
  constructor(private readonly sb: Sandbox) {}

  /** Starts a command (an argv array, or a string for `/bin/sh -c`) in the background and returns at once. */
  async start(cmd: string | string[], opts: ProcessStartOptions = {}): Promise<ProcessHandle> {
    const info = await this.sb.call<ProcessInfo>('process.start', { cmd: typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd, ...startFields(opts) }, callOpts(opts));
    return new ProcessHandle(this.sb, info);
  }

  /** The running processes and the most recent that exited, oldest first. */
  async list(opts?: CallOptions): Promise<ProcessInfo[]> {
    return (await this.sb.call<ProcessListReply>('process.list', {}, opts)).processes;
  }

  /** A handle on a process by its id (from `list()`, or another client): NOT_FOUND if there is none. */
  async get(id: string, opts?: CallOptions): Promise<ProcessHandle> {
    const info = await this.sb.call<ProcessInfo>('process.get', { id }, opts);
    return info.pty ? new PtyHandle(this.sb, info) : new ProcessHandle(this.sb, info);
  }
}

export interface PtyOptions extends Omit<ProcessStartOptions, 'maxOutputBytes'> {
  cols?: number;
  rows?: number;
  /** What to run (default: the image's shell, `/bin/bash` if it has one, else `/bin/sh`, as a login shell). */
  cmd?: string[];
}

export class SandboxPty {
  constructor(private readonly sb: Sandbox) {}

  /** Opens a terminal in the sandbox. It is a process too: `sb.processes.list()` shows it, and it ends with the sandbox. */
  async create(opts: PtyOptions = {}): Promise<PtyHandle> {
    const pty = { cols: opts.cols ?? Limits.processes.cols.default, rows: opts.rows ?? Limits.processes.rows.default };
    const info = await this.sb.call<ProcessInfo>('process.start', { ...(opts.cmd ? { cmd: opts.cmd } : {}), pty, ...startFields(opts) }, callOpts(opts));
    return new PtyHandle(this.sb, info);
  }
}

function startFields(o: ProcessStartOptions) {
  return {
    ...(o.cwd !== undefined ? { cwd: o.cwd } : {}),
    ...(o.env !== undefined ? { env: o.env } : {}),
    ...(o.timeoutMs !== undefined ? { timeoutMs: o.timeoutMs } : {}),
    ...(o.maxOutputBytes !== undefined ? { maxOutputBytes: o.maxOutputBytes } : {}),
    ...(o.bufferBytes !== undefined ? { bufferBytes: o.bufferBytes } : {}),
    ...(o.tag !== undefined ? { tag: o.tag } : {}),
  };
}

/** `timeoutMs` is the process's own: the start call waits the client's default. */
function callOpts(o: ProcessStartOptions): CallOptions {
  return o.signal ? { signal: o.signal } : {};
}

function resultOf(i: ProcessInfo): ProcessResult {
  const r: ProcessResult = { verdict: i.verdict ?? 'OK', exitCode: i.exitCode ?? 0, durationMs: i.durationMs ?? 0, truncated: i.truncated ?? false, timedOut: i.timedOut ?? false };
  if (i.signal) r.signal = i.signal;
  return r;
}
