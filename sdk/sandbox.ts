/** A handle on one sandbox: exec, streamed exec, files, kill. Small on purpose; verbs group under sub-objects. */
import { Readable } from 'node:stream';
import { createInbox, type Msg } from '@nats-io/transport-node';
import { type Attributes, context, SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import { create as createTar } from 'tar';
import {
  type ComputerAction,
  type ComputerReply,
  Credits,
  decode,
  type ExecEvent,
  type ExecResumeReply,
  type ExecVerdict,
  encode,
  type FileChange,
  type FileEntry,
  type FilesDownloadReply,
  type FilesReadReply,
  type FilesUploadReply,
  type FilesWatchLeaseReply,
  type FilesWriteReply,
  type FileWatchEvent,
  type ForkReply,
  Limits,
  type NetworkPolicy,
  type Reply,
  type SandboxInfo,
  type SandboxStats,
  type SandboxVerb,
  SandboxVerbTable,
  type Screenshot,
  type SnapshotInfo,
  subjects,
  subjectTemplate,
  type ExecResult as WireExecResult,
} from '../protocol/index.ts';
import { Attr, traceHeaders } from '../protocol/trace.ts';
import { CancelledError, errorFromWire, NotFoundError, TimeoutError, UnavailableError } from './errors.ts';
import { SandboxPorts } from './ports.ts';
import { SandboxProcesses, SandboxPty } from './processes.ts';
import { type CallOptions, checkTimeout, clientAttrs, sdkTracer, spanFailed, type Transport } from './transport.ts';

export interface ExecOptions extends CallOptions {
  cwd?: string;
  env?: Record<string, string>;
  stdin?: string | Uint8Array;
  /** Cap on stdout and on stderr, each (default: the node's, 1 MiB). Past it the command is killed. */
  maxOutputBytes?: number;
  /**
   * Command log: run this as step `step` (0, 1, 2, …) of rollout `rolloutId`, at most once. A step
   * already recorded returns its recorded result (`replayed: true`). See `pdk.rollouts`.
   */
  rolloutId?: string;
  step?: number;
}

export interface ExecResult {
  /** `OK`, or the limit that ended the command: TIMEOUT, OUTPUT_LIMIT, MEMORY_LIMIT, PIDS_LIMIT, DISK_LIMIT. */
  verdict: ExecVerdict;
  exitCode: number;
  /** The signal that ended the command, if one did (exitCode is then 128 + its number). */
  signal?: string;
  stdout: string;
  stderr: string;
  durationMs: number;
  /** Output hit the cap: the command was killed and its output cut there. */
  truncated: boolean;
  /** The command ran past `timeoutMs` and was killed; the output is what it printed until then. */
  timedOut: boolean;
  /** Command log: the step was recorded before; this is its recorded result and nothing ran now. */
  replayed?: boolean;
}

/**
 * An output event whose \`text\` is decoded when read: many consumers of a stream want the bytes
 * alone (the gateway, a file, a hash), and decoding every chunk for them was about 6% of the
 * gateway's CPU while it streamed (a CPU profile).
 */
function outputEvent(type: 'stdout' | 'stderr', data: Uint8Array): ExecStreamEvent {
  return {
    type,
    data,
    get text() {
      return utf8.decode(data);
    },
  };
}

export type ExecStreamEvent =
  | { type: 'stdout' | 'stderr'; data: Uint8Array; text: string }
  /** Output lost for good: the stream resumed after an outage longer than the node keeps output for. */
  | { type: 'gap'; events: number; bytes: number }
  /** `replayed`: a rollout step recorded before; the output events were its recorded output and nothing ran now. */
  | { type: 'exit'; exitCode: number; signal?: string; durationMs: number; truncated: boolean; timedOut: boolean; verdict: ExecVerdict; replayed?: boolean };

export interface ForkOptions extends CallOptions {
  /** Labels of the copies (default: this sandbox's). */
  labels?: Record<string, string>;
  /** Training job of the copies (default: this sandbox's). */
  group?: string;
  /** Lifetime of the copies (default: this sandbox's ttlSec). */
  ttlSec?: number;
}

/** A fork's default timeout: a snapshot, then each copy's start (seconds under TCG, several at once). */
const FORK_BASE_MS = 60_000;
const FORK_PER_COPY_MS = 5000;

/** Past the command's own timeout, how long to wait for the node's answer. */
const REPLY_MARGIN_MS = 10_000;
/** A silent stream asks its sandbox this often whether it still runs (and for events it missed). */
const PROBE_MS = 2000;
/**
 * A streamed exec's window (ExecRequest.window): the node sends at most this many output bytes
 * past what this stream's reader has taken, then leaves the command's output unread (containers).
 * A reader slower than its command (an HTTP client behind the gateway) otherwise had all of the
 * output, up to maxOutputBytes of each stream, waiting here for it. 8 MiB, not less: with 2 MiB
 * the gateway's 48 MiB stream ran 15–20% slower here (the command waited on credits in flight).
 */
export const EXEC_WINDOW_BYTES = 8 * 1024 * 1024;
const RESUME_TIMEOUT_MS = 5000;
/** A sandbox that nothing answers for this long (its node died) ends its streams. */
const LOST_AFTER_MS = 2000;
const DEFAULT_EXEC_TIMEOUT_MS = Limits.exec.timeoutMs.default;
/** Moves a call follows (a sandbox drained off one node after another) before it gives up. */
const MAX_MOVES = 4;
/** How long a call waits out a sandbox being moved (it answers UNAVAILABLE, reason `moving`), asking again this often. */
const MOVING_WAIT_MS = 120_000;
const MOVING_POLL_MS = 200;
const utf8 = new TextDecoder();

/** @internal the wire body of an exec (the command log digests the same fields). */
export function execBody(cmd: string | string[], opts: ExecOptions) {
  // The node refuses it too, but the SDK's own timer (timeoutMs plus a margin) must be valid first.
  if (opts.timeoutMs !== undefined) checkTimeout(opts.timeoutMs, 'timeoutMs', Limits.exec.timeoutMs.max);
  return {
    cmd: typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd,
    timeoutMs: opts.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS,
    ...(opts.cwd !== undefined ? { cwd: opts.cwd } : {}),
    ...(opts.env !== undefined ? { env: opts.env } : {}),
    ...(opts.stdin !== undefined ? { stdin: typeof opts.stdin === 'string' ? new TextEncoder().encode(opts.stdin) : opts.stdin } : {}),
    ...(opts.maxOutputBytes !== undefined ? { maxOutputBytes: opts.maxOutputBytes } : {}),
    ...(opts.rolloutId !== undefined || opts.step !== undefined ? { rolloutId: opts.rolloutId, step: opts.step } : {}),
  };
}

/** @internal A wire exec result as the SDK hands it out: text decoded, optional fields only when set. */
export function toExecResult(r: WireExecResult): ExecResult {
  const out: ExecResult = {
    verdict: r.verdict ?? 'OK',
    exitCode: r.exitCode,
    stdout: utf8.decode(r.stdout),
    stderr: utf8.decode(r.stderr),
    durationMs: r.durationMs,
    truncated: r.truncated,
    timedOut: r.timedOut,
  };
  if (r.signal) out.signal = r.signal;
  if (r.replayed) out.replayed = true;
  return out;
}

/** How long a call that found no actor waits before it reads a live record again (gone). */
const GONE_RECHECK_MS = 250;

export class Sandbox {
  readonly files: SandboxFiles;
  readonly network: SandboxNetwork;
  /** The screen, pointer and keyboard of a full VM (`backend: 'fullvm'`). */
  readonly display: SandboxDisplay;
  /** TCP ports inside the sandbox, reached from outside without giving it a network (containers). */
  readonly ports: SandboxPorts;
  /** Background processes: start one, list them, read their output now or later. */
  readonly processes: SandboxProcesses;
  /** Terminals (pseudo-terminals running a shell). */
  readonly pty: SandboxPty;

  constructor(
    private readonly t: Transport,
    /** Last known record; `refresh()` fetches a new one. */
    public info: SandboxInfo,
    private readonly lookup: (id: string, opts?: CallOptions) => Promise<SandboxInfo | null>,
  ) {
    this.files = new SandboxFiles(this);
    this.network = new SandboxNetwork(this);
    this.display = new SandboxDisplay(this);
    const sb = this;
    this.ports = new SandboxPorts({
      get id() {
        return sb.id;
      },
      nc: t.nc,
      call: (verb, body, opts) => sb.call(verb, body, opts),
      tell: (verb, body) => t.nc.publish(subjects.sandbox(sb.id, verb), encode(body)),
    });
    this.processes = new SandboxProcesses(this);
    this.pty = new SandboxPty(this);
  }

  /** @internal */
  get transport(): Transport {
    return this.t;
  }

  get id(): string {
    return this.info.id;
  }

  /**
   * @internal
   * A sandbox that a drain moved to another node (reason `migrated`) is followed: the call goes to
   * the sandbox it goes on as, and this handle becomes that one (its `id` changes).
   */
  async call<T>(verb: SandboxVerb, body: unknown, opts: CallOptions = {}): Promise<T> {
    const movingUntil = Date.now() + MOVING_WAIT_MS;
    for (let hop = 0; ; ) {
      try {
        return await this.callHere<T>(verb, body, opts);
      } catch (e) {
        // Refused by a sandbox that had just ended: its answer says where it moved.
        if (e instanceof NotFoundError && typeof e.detail?.movedTo === 'string' && !this.info.movedTo) this.info = { ...this.info, movedTo: e.detail.movedTo, reason: e.detail.reason as SandboxInfo['reason'] };
        if (hop < MAX_MOVES && e instanceof NotFoundError && (await this.follow())) {
          hop++;
          continue;
        }
        // Being moved: it refused the call without doing anything; it will soon say where it went.
        if (e instanceof UnavailableError && e.detail?.reason === 'moving' && Date.now() < movingUntil && !opts.signal?.aborted) {
          await new Promise((r) => setTimeout(r, MOVING_POLL_MS));
          continue;
        }
        throw e;
      }
    }
  }

  private callHere<T>(verb: SandboxVerb, body: unknown, opts: CallOptions): Promise<T> {
    // An ended sandbox answers nothing (its actor is gone): the verb table says which verbs still
    // mean anything there, and the directory says how it ended without a request that cannot succeed.
    const st = this.info.state;
    if ((st === 'stopped' || st === 'failed') && !SandboxVerbTable[verb].states.includes(st)) return this.gone();
    return this.t.request<T>(subjects.sandbox(this.id, verb), body, opts, () => this.gone(), this.spanAttributes());
  }

  /** When the last record says the sandbox moved: this handle becomes the one it moved to. */
  private async follow(): Promise<boolean> {
    const to = this.info.movedTo;
    if (!to || this.info.reason !== 'migrated') return false;
    const next = await this.lookup(to).catch(() => null);
    if (!next) return false;
    this.info = next;
    return true;
  }

  /** Where the sandbox runs, for its calls' spans: replies such as exec's do not say. */
  private spanAttributes(): Attributes {
    const a: Attributes = {};
    // A handle made from an id alone (the gateway's) knows neither until it is refreshed.
    if (this.info.node) a[Attr.nodeId] = this.info.node;
    if (this.info.backend) a[Attr.backend] = this.info.backend;
    return a;
  }

  /**
   * No actor answers: the sandbox ended (say how) or never existed, or its node does not answer
   * (restarting, or lost: UNAVAILABLE, which a retry may get past; a node that stays away has its
   * sandboxes marked `node_lost` by placement, and a restarted one says what became of them).
   */
  private async gone(): Promise<never> {
    const live = (r: SandboxInfo | null) => r !== null && r.state !== 'stopped' && r.state !== 'failed';
    let rec = await this.lookup(this.id).catch(() => null);
    // An actor stops answering as it writes its final record: a call in between finds it live.
    if (live(rec)) {
      await new Promise((r) => setTimeout(r, GONE_RECHECK_MS));
      rec = (await this.lookup(this.id).catch(() => null)) ?? rec;
    }
    if (rec && live(rec)) {
      this.info = rec;
      throw new UnavailableError('UNAVAILABLE', `sandbox ${this.id} is ${rec.state} on node ${rec.node}, which does not answer (restarting, or gone); ask again in a moment`, { detail: { state: rec.state, node: rec.node, reason: 'no_responders' } });
    }
    if (rec) {
      this.info = rec;
      throw new NotFoundError('NOT_FOUND', `sandbox ${this.id} is ${rec.state}${rec.reason ? ` (${rec.reason})` : ''}${rec.movedTo ? `, moved to ${rec.movedTo}` : ''}`, { detail: { state: rec.state, reason: rec.reason, ...(rec.movedTo ? { movedTo: rec.movedTo } : {}) } });
    }
    throw new NotFoundError('NOT_FOUND', `sandbox ${this.id} does not exist`);
  }

  async refresh(opts?: CallOptions): Promise<SandboxInfo> {
    try {
      this.info = await this.call<SandboxInfo>('info', {}, opts);
    } catch (err) {
      if ((err instanceof NotFoundError || err instanceof UnavailableError) && err.detail?.state) return this.info;
      throw err;
    }
    return this.info;
  }

  /** Runs a command (an argv array, or a string for `/bin/sh -c`) to completion. */
  async exec(cmd: string | string[], opts: ExecOptions = {}): Promise<ExecResult> {
    const body = execBody(cmd, opts);
    return toExecResult(await this.call<WireExecResult>('exec', body, { timeoutMs: body.timeoutMs + REPLY_MARGIN_MS, signal: opts.signal }));
  }

  /**
   * Runs a command and yields its output as it comes, then one `exit` event. Breaking out of the
   * loop, or aborting `signal`, kills the command.
   *
   * Nothing is lost silently: events are numbered, and after a NATS outage (or any missing number)
   * the stream asks the node for what it missed; output the node no longer holds comes as one
   * `gap` event with the bytes lost. While the command is silent the stream checks every
   * PROBE_MS that its sandbox still answers, so one whose node died ends within seconds with
   * UNAVAILABLE (or NOT_FOUND when the sandbox ended), not at the exec's timeout.
   */
  async *execStream(cmd: string | string[], opts: ExecOptions = {}): AsyncGenerator<ExecStreamEvent, void, undefined> {
    // A stream is not sent again when it finds the sandbox moved (its command may have run): one
    // started on a handle already known to be moved goes where the sandbox is now.
    if (this.info.movedTo) await this.follow();
    const body = execBody(cmd, opts);
    const execId = `e${Math.random().toString(36).slice(2, 14)}`;
    const nc = this.t.nc;
    const inbox = createInbox();
    const queue: Array<Msg | { fail: unknown }> = [];
    let wake: (() => void) | null = null;
    const push = (m: Msg | { fail: unknown }) => {
      queue.push(m);
      wake?.();
    };
    const sub = nc.subscribe(inbox, { callback: (_err, m) => push(m) });
    let done = false;
    /** The next event number expected, and output bytes received. */
    let next = 0;
    let offset = 0;
    /** Output bytes the loop's reader has taken, credited back to the node (ExecRequest.window). */
    const credits = new Credits(EXEC_WINDOW_BYTES, (received) => nc.publish(subjects.sandbox(this.id, 'exec.credit'), encode({ execId, received })));
    const take = (bytes: number) => {
      credits.add(bytes);
      credits.offer();
    };
    /** A resume is under way (set until the event it asked for arrives). */
    let resuming = false;
    /** Since when exec.resume finds nothing answering for the sandbox. */
    let unanswered: number | undefined;
    const resume = (why: 'hole' | 'probe' | 'reconnect') => {
      if (done || (resuming && why === 'hole')) return;
      if (why !== 'probe') resuming = true;
      this.t
        .request<ExecResumeReply>(subjects.sandbox(this.id, 'exec.resume'), { execId, from: next, offset }, { timeoutMs: RESUME_TIMEOUT_MS }, async () => {
          // Right after NATS comes back the node may not have reconnected yet: only a sandbox
          // silent for LOST_AFTER_MS is taken for gone.
          unanswered ??= Date.now();
          if (Date.now() - unanswered < LOST_AFTER_MS) throw new TimeoutError('TIMEOUT', 'no answer yet');
          throw await this.lost(execId, next);
        })
        .then(() => {
          unanswered = undefined;
        })
        .catch((err: unknown) => {
          resuming = false;
          // NATS slow or away: the next probe or reconnect asks again. Anything else ends the stream.
          if (err instanceof TimeoutError || (err instanceof UnavailableError && (err.detail?.reason === 'disconnected' || err.detail?.reason === 'timeout'))) return;
          push({ fail: err });
        });
    };
    const stopReconnect = this.t.onReconnect(() => resume('reconnect'));
    const idleMs = body.timeoutMs + REPLY_MARGIN_MS;
    const span = sdkTracer.startSpan(`exec.stream ${subjectTemplate(subjects.sandbox(this.id, 'exec')).template}`, { kind: SpanKind.CLIENT, attributes: { ...clientAttrs(subjects.sandbox(this.id, 'exec'), 'exec.stream'), ...this.spanAttributes(), [Attr.execId]: execId } });
    try {
      const data = encode({ ...body, stream: true, execId, window: EXEC_WINDOW_BYTES });
      this.t.checkSize(subjects.sandbox(this.id, 'exec'), data);
      await this.t.connected(idleMs, subjects.sandbox(this.id, 'exec'));
      nc.publish(subjects.sandbox(this.id, 'exec'), data, { reply: inbox, headers: traceHeaders(trace.setSpan(context.active(), span)) });
      let quietSince = Date.now();
      for (;;) {
        if (queue.length === 0) {
          if (opts.signal?.aborted) throw new CancelledError('CANCELLED', 'the stream was cancelled');
          if (Date.now() - quietSince > idleMs) throw new TimeoutError('TIMEOUT', `no output or exit from sandbox ${this.id} within ${idleMs} ms`);
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
          // Silence: is the sandbox still there? (also fetches a lost tail, exit included)
          if (!woke) resume('probe');
          continue;
        }
        quietSince = Date.now();
        unanswered = undefined;
        const m = queue.shift() as Msg | { fail: unknown };
        if ('fail' in m) throw m.fail;
        if (m.headers?.code === 503) await this.gone();
        const ev = decode(m.data) as ExecEvent | Reply<unknown>;
        if ('ok' in ev) {
          done = true;
          if (!ev.ok) throw errorFromWire(ev.error);
          continue;
        }
        if (ev.s !== undefined) {
          if (ev.s < next) continue;
          if (ev.s > next) {
            // Something before it was lost: ask for it again; this one comes again after it.
            resume('hole');
            continue;
          }
          resuming = false;
          next = ev.t === 'gap' ? ev.s + ev.n : ev.s + 1;
        }
        switch (ev.t) {
          case 'out':
          case 'err':
            offset += ev.d.length;
            yield outputEvent(ev.t === 'out' ? 'stdout' : 'stderr', ev.d);
            take(ev.d.length);
            break;
          case 'gap':
            offset += ev.bytes;
            // Lost for good, so never taken: counted as taken, or the node would wait for them.
            take(ev.bytes);
            span.addEvent('exec.gap', { 'paddock.exec.gap.events': ev.n, 'paddock.exec.gap.bytes': ev.bytes });
            yield { type: 'gap', events: ev.n, bytes: ev.bytes };
            break;
          case 'exit': {
            done = true;
            const { t: _, s: _s, ...rest } = ev;
            span.setAttributes({ [Attr.execVerdict]: ev.verdict, [Attr.execExitCode]: ev.exitCode });
            if (ev.verdict !== 'OK') span.setStatus({ code: SpanStatusCode.ERROR, message: ev.verdict });
            yield { type: 'exit', ...rest };
            return;
          }
          case 'error':
            done = true;
            throw errorFromWire(ev.error);
        }
      }
    } catch (err) {
      spanFailed(span, err);
      throw err;
    } finally {
      span.end();
      stopReconnect();
      sub.unsubscribe();
      if (!done) nc.publish(subjects.sandbox(this.id, 'exec.cancel'), encode({ execId }));
    }
  }

  /** The error that ends a stream whose sandbox no longer answers: it ended (NOT_FOUND), or its node is gone. */
  private async lost(execId: string, next: number): Promise<Error> {
    const rec = await this.lookup(this.id).catch(() => null);
    if (rec) this.info = rec;
    if (rec && (rec.state === 'stopped' || rec.state === 'failed')) {
      const moved = rec.movedTo ? `, moved to ${rec.movedTo} (the next call on this handle goes there)` : '';
      return new NotFoundError('NOT_FOUND', `sandbox ${this.id} is ${rec.state}${rec.reason ? ` (${rec.reason})` : ''}${moved}: stream ${execId} ended after event ${next}`, { detail: { state: rec.state, reason: rec.reason, ...(rec.movedTo ? { movedTo: rec.movedTo } : {}) } });
    }
    const node = rec?.node ?? this.info.node;
    return new UnavailableError('UNAVAILABLE', `sandbox ${this.id} no longer answers (its node ${node} is gone or cut off): stream ${execId} ended after event ${next}; its output from there on is lost`, { detail: { node, execId, reason: 'no_responders' } });
  }

  /** Freezes every process of the sandbox; state, memory and files are kept. */
  async pause(opts?: CallOptions): Promise<SandboxInfo> {
    this.info = await this.call<SandboxInfo>('pause', {}, opts);
    return this.info;
  }

  async resume(opts?: CallOptions): Promise<SandboxInfo> {
    this.info = await this.call<SandboxInfo>('resume', {}, opts);
    return this.info;
  }

  /**
   * Freezes the sandbox and gives its memory back to the node; `info.released.bytes` says how much.
   * An exec or file call on a hibernated (or paused) sandbox wakes it first, unless it was created
   * with `autoResume: false`.
   */
  async hibernate(opts?: CallOptions): Promise<SandboxInfo> {
    this.info = await this.call<SandboxInfo>('hibernate', {}, opts);
    return this.info;
  }

  async restore(opts?: CallOptions): Promise<SandboxInfo> {
    this.info = await this.call<SandboxInfo>('restore', {}, opts);
    return this.info;
  }

  /**
   * One action of the computer-use action set (`screenshot`, `left_click`, `type`, `key`, `scroll`,
   * `left_click_drag`, `hold_key`, `wait`, `cursor_position`, …), with the argument names
   * computer-use harnesses send: `{ action: 'left_click', coordinate: [100, 200] }`. The reply has
   * the pointer's position, and a screenshot for `screenshot` or when `screenshot: true`.
   */
  computer(action: ComputerAction, opts?: CallOptions): Promise<ComputerReply> {
    return this.call<ComputerReply>('display.action', action, { ...opts, timeoutMs: opts?.timeoutMs ?? actionTimeoutMs(action) });
  }

  /**
   * Saves the sandbox; it runs on. A VM (`microvm`, `fullvm`): its whole state (files, processes,
   * memory) on its node, where copies start. A container: its files only (what it wrote, changed
   * and removed, as one more layer in the image store; processes are not kept), and copies start
   * on any node that reads that store, with any memory and CPUs. `pdk.sandboxes.create({
   * fromSnapshot: snap.id })` starts copies until `pdk.snapshots.delete(snap.id)`; the snapshot
   * outlives this sandbox.
   */
  snapshot(opts?: CallOptions): Promise<SnapshotInfo> {
    return this.call<SnapshotInfo>('snapshot', {}, opts);
  }

  /**
   * `count` new sandboxes on this one's node, each a copy of it as it is now (from one snapshot,
   * removed after): real sandboxes with records, events and a TTL. All or none: when the node
   * cannot admit them all, none is left and NoCapacityError says why.
   */
  async fork(count = 1, opts: ForkOptions = {}): Promise<Sandbox[]> {
    const { labels, group, ttlSec, timeoutMs, signal } = opts;
    const body = { count, ...(labels !== undefined ? { labels } : {}), ...(group !== undefined ? { group } : {}), ...(ttlSec !== undefined ? { ttlSec } : {}) };
    const r = await this.call<ForkReply>('fork', body, { timeoutMs: timeoutMs ?? FORK_BASE_MS + count * FORK_PER_COPY_MS, signal });
    return r.sandboxes.map((info) => new Sandbox(this.t, info, this.lookup));
  }

  /** What the sandbox uses now (CPU seconds, memory, disk, processes), as far as its backend can tell. */
  stats(opts?: CallOptions): Promise<SandboxStats> {
    return this.call<SandboxStats>('stats', {}, opts);
  }

  /** Kills the sandbox and waits until it is gone. Killing a sandbox that already ended is a no-op. */
  async kill(opts?: CallOptions): Promise<SandboxInfo> {
    try {
      this.info = await this.call<SandboxInfo>('kill', {}, opts);
    } catch (err) {
      // Ended already: nothing to do. A node that does not answer (UNAVAILABLE) has not killed it.
      if (err instanceof NotFoundError && err.detail?.state) return this.info;
      throw err;
    }
    return this.info;
  }
}

/** How long an action may take: its own duration, and ~10 ms a typed character, on top of a screenshot's. */
function actionTimeoutMs(a: ComputerAction): number {
  return 20_000 + (a.duration ?? 0) * 1000 + (a.action === 'type' ? (a.text?.length ?? 0) * 12 : 0);
}

/** A full VM's screen and input devices, driven through the VMM (QMP), not through the guest. */
export class SandboxDisplay {
  constructor(private readonly sb: Sandbox) {}

  /** The screen as a PNG, with its size. */
  screenshot(opts?: CallOptions): Promise<Screenshot> {
    return this.sb.call<Screenshot>('display.screenshot', {}, opts);
  }

  async click(x: number, y: number, o: { button?: 'left' | 'right' | 'middle'; double?: boolean } & CallOptions = {}): Promise<void> {
    const action = o.double ? 'double_click' : o.button === 'right' ? 'right_click' : o.button === 'middle' ? 'middle_click' : 'left_click';
    await this.sb.computer({ action, coordinate: [x, y] }, o);
  }

  async move(x: number, y: number, opts?: CallOptions): Promise<void> {
    await this.sb.computer({ action: 'mouse_move', coordinate: [x, y] }, opts);
  }

  /** Types `text` on a US keyboard (`\n` is Return). */
  async type(text: string, opts?: CallOptions): Promise<void> {
    await this.sb.computer({ action: 'type', text }, opts);
  }

  /** Presses a key or a combination, as xdotool names them: `Return`, `ctrl+l`, `alt+F4`. */
  async key(keys: string, opts?: CallOptions): Promise<void> {
    await this.sb.computer({ action: 'key', text: keys }, opts);
  }

  /** Wheel clicks at [x, y]: `dy` < 0 scrolls up, > 0 down; `dx` left and right. */
  async scroll(x: number, y: number, d: { dx?: number; dy?: number }, opts?: CallOptions): Promise<void> {
    const dy = d.dy ?? 0;
    const dx = d.dx ?? 0;
    if (dy) await this.sb.computer({ action: 'scroll', coordinate: [x, y], scroll_direction: dy < 0 ? 'up' : 'down', scroll_amount: Math.abs(dy) }, opts);
    if (dx) await this.sb.computer({ action: 'scroll', coordinate: [x, y], scroll_direction: dx < 0 ? 'left' : 'right', scroll_amount: Math.abs(dx) }, opts);
  }

  /** Presses the left button at `from`, moves to `to` with it held, and lets go. */
  async drag(from: [number, number], to: [number, number], opts?: CallOptions): Promise<void> {
    await this.sb.computer({ action: 'left_click_drag', start_coordinate: from, coordinate: to }, opts);
  }

  /**
   * A URL a person opens in a browser to watch the screen live (noVNC on the node's loopback; the
   * RFB WebSocket is `${url}/ws`). View only unless `control: true`.
   */
  async viewUrl(o: { control?: boolean } & CallOptions = {}): Promise<string> {
    const { control, ...opts } = o;
    return (await this.sb.call<{ url: string }>('display.view', control ? { control } : {}, opts)).url;
  }

  /** Where the pointer is. */
  async cursor(opts?: CallOptions): Promise<{ x: number; y: number }> {
    return (await this.sb.computer({ action: 'cursor_position' }, opts)).cursor;
  }
}

/** The sandbox's egress policy. */
export class SandboxNetwork {
  constructor(private readonly sb: Sandbox) {}

  /**
   * Replaces the egress policy while the sandbox runs: `{ allow: ['CIDR:port', …], domains: ['pypi.org', '*.example.com'], ports: [443] }`.
   * `{}` closes everything again (e.g. after a set-up phase).
   */
  async set(policy: NetworkPolicy, opts?: CallOptions): Promise<NetworkPolicy> {
    return (await this.sb.call<{ policy: NetworkPolicy }>('network.set', { policy }, opts)).policy;
  }
}

/** Files inside the sandbox. Large files move in chunks; paths are absolute. */
export class SandboxFiles {
  constructor(private readonly sb: Sandbox) {}

  async read(path: string, opts?: CallOptions & { maxBytes?: number }): Promise<Uint8Array> {
    const max = opts?.maxBytes ?? 256 * 1024 * 1024;
    const parts: Uint8Array[] = [];
    let offset = 0;
    for (;;) {
      const r = await this.sb.call<FilesReadReply>('files.read', { path, offset, length: Limits.files.chunkMax }, opts);
      if (r.size > max) throw new CancelledError('CANCELLED', `${path} is ${r.size} bytes, more than maxBytes ${max}`);
      parts.push(r.data);
      offset += r.data.length;
      if (r.eof || r.data.length === 0) break;
    }
    return Buffer.concat(parts);
  }

  async readText(path: string, opts?: CallOptions): Promise<string> {
    return utf8.decode(await this.read(path, opts));
  }

  /** Replaces (or creates) the file; parent directories are created. */
  async write(path: string, data: string | Uint8Array, opts?: CallOptions & { mode?: number }): Promise<void> {
    const bytes = typeof data === 'string' ? new TextEncoder().encode(data) : data;
    const chunk = 1024 * 1024;
    const mode = opts?.mode !== undefined ? { mode: opts.mode } : {};
    await this.sb.call<FilesWriteReply>('files.write', { path, data: bytes.subarray(0, chunk), ...mode }, opts);
    for (let off = chunk; off < bytes.length; off += chunk) {
      await this.sb.call<FilesWriteReply>('files.write', { path, data: bytes.subarray(off, off + chunk), offset: off }, opts);
    }
  }

  async list(path: string, opts?: CallOptions): Promise<FileEntry[]> {
    return (await this.sb.call<{ entries: FileEntry[] }>('files.list', { path }, opts)).entries;
  }

  async remove(path: string, opts?: CallOptions & { recursive?: boolean }): Promise<void> {
    await this.sb.call('files.remove', { path, recursive: opts?.recursive === true }, opts);
  }

  /**
   * Unpacks a directory tree into the existing directory `dest`: `src` is a local directory (packed
   * here as it is read: symlinks stay symlinks, hardlinked files go as copies) or a tar archive as
   * bytes, a stream or any async iterable of chunks. It moves in chunks, each sent once the node has
   * written the one before. Archives may hold files, directories and symlinks: a hardlink, device or
   * FIFO is ForbiddenError, and so is an entry with `..` or one that would go through a symlink; a
   * broken archive is InvalidRequestError; a full writable layer LimitError (DISK_LIMIT). On an error, the
   * entries written before it stay (`err.detail.entries` counts them); the file it broke off is removed.
   */
  async upload(src: string | Uint8Array | AsyncIterable<Uint8Array>, dest: string, opts?: CallOptions): Promise<{ entries: number; bytes: number }> {
    const source: AsyncIterable<Uint8Array> | Iterable<Uint8Array> =
      typeof src === 'string'
        ? // portable: no host uids or names; an empty linkCache that forgets: hardlinks are sent as files.
          (createTar({ cwd: src, portable: true, linkCache: { get: () => undefined, set() {} } as never }, ['.']) as unknown as AsyncIterable<Uint8Array>)
        : src instanceof Uint8Array
          ? [src]
          : src;
    const uploadId = `u${Math.random().toString(36).slice(2, 14)}`;
    let seq = 0;
    const send = (data: Uint8Array, end: boolean) => this.sb.call<FilesUploadReply>('files.upload', { uploadId, path: dest, seq: seq++, data, ...(end ? { end } : {}) }, opts);
    let held: Uint8Array[] = [];
    let size = 0;
    for await (const piece of source) {
      if (opts?.signal?.aborted) throw new CancelledError('CANCELLED', 'the upload was cancelled');
      held.push(piece);
      size += piece.length;
      while (size >= TREE_CHUNK) {
        const all = Buffer.concat(held);
        await send(all.subarray(0, TREE_CHUNK), false);
        held = [all.subarray(TREE_CHUNK)];
        size -= TREE_CHUNK;
      }
    }
    const r = await send(Buffer.concat(held), true);
    return { entries: r.entries, bytes: r.bytes };
  }

  /**
   * A tar archive of `path` (a directory: what is below it; a file: that file), as a stream pulled
   * chunk by chunk from the node: a chunk is fetched when the reader wants it. Symlinks are
   * archived as symlinks, never followed; other filesystems (/proc, /dev, /sys), sockets, FIFOs and
   * devices are left out. Errors (NotFoundError, ForbiddenError) come as the stream's error.
   */
  download(path: string, opts?: CallOptions): Readable {
    const sb = this.sb;
    const downloadId = `d${Math.random().toString(36).slice(2, 14)}`;
    async function* pull(): AsyncGenerator<Uint8Array, void, undefined> {
      let eof = false;
      try {
        for (let seq = 0; !eof; seq++) {
          const r = await sb.call<FilesDownloadReply>('files.download', { downloadId, path, seq }, opts);
          eof = r.eof;
          if (r.data.length > 0) yield r.data;
        }
      } finally {
        if (!eof) void sb.call('files.download', { downloadId, path, seq: 0, cancel: true }).catch(() => {});
      }
    }
    return Readable.from(pull(), { objectMode: false });
  }

  /**
   * Watches the directory `path` (with `recursive`, every directory below it too, those made later
   * included); resolves once the node watches. Iterate it for `{ type: 'created' | 'modified' |
   * 'removed', path }` (absolute paths inside the sandbox); the iteration ends when you break out of
   * it, call `close()`, abort `signal`, or the sandbox ends; it throws if the watch fails on the
   * node (BusyError: too many directories watched).
   */
  async watch(path: string, opts: CallOptions & { recursive?: boolean } = {}): Promise<FileWatch> {
    const w = new FileWatch(this.sb, path, opts);
    await w.start();
    return w;
  }
}

/** Upload chunks: the default 1 MiB NATS payload, less room for the request's other fields. */
const TREE_CHUNK = 1024 * 1024 - 4096;

export interface FileChangeEvent {
  type: FileChange;
  /** Absolute inside the sandbox; a name that is not UTF-8 has U+FFFD where its bad bytes were (see pathBytes). */
  path: string;
  pathBytes?: Uint8Array;
}

/** A running `files.watch`: an async iterable of changes, on a lease this object renews. */
export class FileWatch implements AsyncIterable<FileChangeEvent> {
  private readonly watchId = `w${Math.random().toString(36).slice(2, 14)}`;
  private readonly queue: Array<FileWatchEvent | { t: 'fail'; error: unknown }> = [];
  private wake: (() => void) | null = null;
  private sub?: ReturnType<Sandbox['transport']['nc']['subscribe']>;
  private renewer?: NodeJS.Timeout;
  private ended = false;

  constructor(
    private readonly sb: Sandbox,
    private readonly path: string,
    private readonly opts: CallOptions & { recursive?: boolean },
  ) {}

  private push(ev: FileWatchEvent | { t: 'fail'; error: unknown }): void {
    this.queue.push(ev);
    this.wake?.();
  }

  /** @internal */
  async start(): Promise<void> {
    const nc = this.sb.transport.nc;
    const inbox = createInbox();
    this.sub = nc.subscribe(inbox, {
      callback: (_err, m) => {
        if (m.headers?.code === 503) {
          this.push({ t: 'fail', error: new NotFoundError('NOT_FOUND', `sandbox ${this.sb.id} does not answer`) });
          return;
        }
        const ev = decode(m.data) as FileWatchEvent | Reply<unknown>;
        if ('ok' in ev) {
          if (!ev.ok) this.push({ t: 'fail', error: errorFromWire(ev.error) });
          return;
        }
        this.push(ev);
      },
    });
    const subject = subjects.sandbox(this.sb.id, 'files.watch');
    const timeoutMs = this.opts.timeoutMs ?? 30_000;
    try {
      await this.sb.transport.connected(timeoutMs, subject);
      nc.publish(subject, encode({ watchId: this.watchId, path: this.path, ...(this.opts.recursive ? { recursive: true } : {}) }), { reply: inbox });
      const first = await this.next(timeoutMs);
      if (first === null) throw new TimeoutError('TIMEOUT', `sandbox ${this.sb.id} did not start watching ${this.path} within ${timeoutMs} ms`);
      if (first.t !== 'ready') throw new UnavailableError('UNAVAILABLE', `files.watch: expected ready, got ${first.t}`);
    } catch (err) {
      this.stop();
      throw err;
    }
    this.renewer = setInterval(() => {
      this.sb
        .call<FilesWatchLeaseReply>('files.watch.renew', { watchId: this.watchId }, { timeoutMs: Limits.files.watchLeaseMs / 3 })
        .then((r) => {
          if (!r.watching) this.push({ t: 'end', s: 0, reason: 'expired' });
        })
        .catch((err: unknown) => {
          // NATS slow or away: the next renewal tries again; a sandbox that ended ends the watch.
          if (err instanceof NotFoundError) this.push({ t: 'end', s: 0, reason: 'sandbox_ended' });
        });
    }, Limits.files.watchLeaseMs / 3);
    this.renewer.unref();
    this.opts.signal?.addEventListener('abort', () => this.close(), { once: true });
  }

  /** The next event, or null after `waitMs` (or at once once closed). Throws what the node sent as an error. */
  private async next(waitMs: number): Promise<FileWatchEvent | null> {
    const until = Date.now() + waitMs;
    while (this.queue.length === 0) {
      if (this.ended || Date.now() >= until) return null;
      let timer: NodeJS.Timeout | undefined;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
        timer = setTimeout(resolve, Math.min(1000, until - Date.now()));
      });
      this.wake = null;
      clearTimeout(timer);
    }
    const ev = this.queue.shift() as FileWatchEvent | { t: 'fail'; error: unknown };
    if (ev.t === 'fail') throw ev.error;
    if (ev.t === 'error') throw errorFromWire(ev.error);
    return ev;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<FileChangeEvent, void, undefined> {
    try {
      for (;;) {
        const ev = await this.next(Number.POSITIVE_INFINITY);
        if (ev === null || ev.t === 'end') return;
        if (ev.t !== 'change') continue;
        yield { type: ev.type, path: ev.path, ...(ev.pathBytes ? { pathBytes: ev.pathBytes } : {}) };
      }
    } finally {
      this.close();
    }
  }

  /** Stops watching (the node gives its inotify watches back). */
  close(): void {
    if (this.ended) return;
    this.stop();
    void this.sb.call('files.watch.cancel', { watchId: this.watchId }, { timeoutMs: 5000 }).catch(() => {});
  }

  private stop(): void {
    this.ended = true;
    clearInterval(this.renewer);
    this.sub?.unsubscribe();
    this.wake?.();
  }
}
