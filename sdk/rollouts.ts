/**
 * Rollouts: a sandbox driven through numbered steps that are recorded in the command log, so that a
 * trainer restarted after preemption replays them instead of running them again.
 *
 * ```ts
 * const ro = await pdk.rollouts.start({ sandbox: { image: 'busybox' } })
 * await ro.exec('echo one >> /work/log')     // step 0
 * await ro.files.write('/work/a.py', code)    // step 1
 * // … the trainer is preempted; a new process:
 * const again = await pdk.rollouts.attach(ro.rolloutId)
 * await again.exec('echo one >> /work/log')  // step 0 again: { replayed: true }, nothing runs
 * ```
 *
 * Every exec or write takes the next step number (0, 1, 2, …) unless given `step`. On attach the
 * rollout's recorded results come with the reply (`pdk.v1.rollouts.attach`, prefetch), so
 * replaying a thousand steps costs no round trip per step; they are answered by the replay rule of
 * protocol/records.ts, the one the node's journal applies. A step that rule does not settle (not
 * recorded, or still in flight) goes to the node, which decides.
 */
import {
  assertSameRequest,
  type DigestInput,
  describeExec,
  describeWrite,
  type RolloutRecord,
  recordedOutcome,
  type StepOp,
  type StepRecord,
} from '../protocol/records.ts';
import { type ExecResult as WireExecResult, type FilesWriteReply, isToken, Limits, ProtocolError, type RolloutsStepsReply, type RolloutView, type SandboxInfo, type SandboxSpec, subjects } from '../protocol/index.ts';
import { CancelledError, errorFromWire, InvalidRequestError, NotFoundError, PaddockError, StepError } from './errors.ts';
import { type ExecOptions, type ExecResult, execBody, type Sandbox, toExecResult } from './sandbox.ts';
import type { CallOptions, Transport } from './transport.ts';

export interface RolloutStartOptions extends CallOptions {
  /** The sandbox to create for the rollout (as `pdk.sandboxes.create` takes it). */
  sandbox?: Partial<SandboxSpec>;
  /** Default: a new `ro-…` id. 1-64 characters of [A-Za-z0-9_-]. */
  rolloutId?: string;
  /**
   * Keep the log this long after the rollout's last record or attach (default 7 days). No record
   * outlives the node's PADDOCK_CHRONUS_MAX_AGE_SEC (default 30 days) whatever this says.
   */
  retentionSec?: number;
}

export interface AttachOptions extends CallOptions {
  /**
   * Read the recorded results up front so that replayed steps need no round trip (default true).
   * Costs memory for the recorded output of every step; off, each step asks the node.
   */
  prefetch?: boolean;
}

export interface RolloutExecOptions extends Omit<ExecOptions, 'rolloutId' | 'step'> {
  /** Default: the rollout's next step. Setting it moves the counter to `step + 1`. */
  step?: number;
}

export interface StepExecResult extends ExecResult {
  step: number;
  /** The step was recorded before: this is its recorded result, and nothing ran now. */
  replayed: boolean;
}

export interface StepWriteResult {
  step: number;
  size: number;
  replayed: boolean;
}

/** What Rollouts needs of `pdk.sandboxes`: a handle on a sandbox whose record the server sent. */
export interface SandboxSource {
  handle(info: SandboxInfo): Sandbox;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** After a running step's deadline, how long to keep asking before taking the node's last word. */
const CONFLICT_SLACK_MS = 2000;

export class Rollouts {
  constructor(
    private readonly t: Transport,
    private readonly sandboxes: SandboxSource,
  ) {}

  private checkId(rolloutId: string): void {
    if (!isToken(rolloutId)) throw new InvalidRequestError('INVALID_REQUEST', `rolloutId: must be 1-64 characters of [A-Za-z0-9_-], got ${JSON.stringify(rolloutId)}`);
  }

  /** The rollout's record (its sandbox, retention), or null. */
  async get(rolloutId: string, opts?: CallOptions): Promise<RolloutRecord | null> {
    this.checkId(rolloutId);
    try {
      return await this.t.request<RolloutRecord>(subjects.rollouts('get'), { rolloutId }, opts);
    } catch (err) {
      if (err instanceof NotFoundError) return null;
      throw err;
    }
  }

  /** Creates a sandbox and a rollout on it. Fails with ALREADY_EXISTS if the id is taken. */
  async start(opts: RolloutStartOptions = {}): Promise<Rollout> {
    const { timeoutMs, signal, ...body } = opts;
    if (body.rolloutId !== undefined) this.checkId(body.rolloutId);
    if (body.retentionSec !== undefined && !(Number.isFinite(body.retentionSec) && body.retentionSec > 0)) {
      throw new InvalidRequestError('INVALID_REQUEST', `retentionSec: must be a positive number, got ${body.retentionSec}`);
    }
    const view = await this.t.request<RolloutView<StepRecord>>(subjects.rollouts('start'), body, { timeoutMs, signal });
    return new Rollout(view.rollout, this.sandboxes.handle(view.sandbox), { records: new Map(), lastStep: view.lastStep });
  }

  /**
   * The rollout's sandbox (running, paused or hibernated: an exec wakes it) and its log, to replay
   * from step 0. `lastStep` is the highest step recorded (-1: none).
   */
  async attach(rolloutId: string, opts: AttachOptions = {}): Promise<Rollout> {
    this.checkId(rolloutId);
    const prefetch = opts.prefetch !== false;
    const call = { timeoutMs: opts.timeoutMs, signal: opts.signal };
    const view = await this.t.request<RolloutView<StepRecord>>(subjects.rollouts('attach'), { rolloutId, prefetch }, call);
    const records = new Map<number, StepRecord>();
    for (const r of view.steps ?? []) records.set(r.step, r);
    // A log too large for one reply comes in pages.
    for (let after = view.next; after !== undefined; ) {
      const page: RolloutsStepsReply<StepRecord> = await this.t.request<RolloutsStepsReply<StepRecord>>(subjects.rollouts('steps'), { rolloutId, which: 'last', after }, call);
      for (const r of page.records) records.set(r.step, r);
      after = page.next;
    }
    return new Rollout(view.rollout, this.sandboxes.handle(view.sandbox), { records, lastStep: view.lastStep });
  }

  /** The rollout's trajectory, one JSON line per step (what `paddock rollouts export` writes). */
  async *export(rolloutId: string, opts: CallOptions = {}): AsyncGenerator<string, void, undefined> {
    this.checkId(rolloutId);
    for (let after: number | undefined = -1; after !== undefined; ) {
      const page: { lines: string[]; next?: number } = await this.t.request<{ lines: string[]; next?: number }>(subjects.rollouts('export'), { rolloutId, after }, opts);
      yield* page.lines;
      after = page.next;
    }
  }

  /** Deletes the rollout and every record of its log; with `kill`, its sandbox too. */
  async delete(rolloutId: string, opts: CallOptions & { kill?: boolean } = {}): Promise<void> {
    this.checkId(rolloutId);
    await this.t.request(subjects.rollouts('delete'), { rolloutId, kill: opts.kill === true }, { timeoutMs: opts.timeoutMs, signal: opts.signal });
  }
}

/** One rollout: its sandbox, a step counter, and the recorded steps still to replay. */
export class Rollout {
  readonly rolloutId: string;
  /** Highest step recorded when the rollout was attached (-1: none). */
  readonly lastStep: number;
  /** The step the next exec or write gets unless it names one. */
  nextStep = 0;
  readonly files: RolloutFiles;
  private readonly recorded: Map<number, StepRecord>;

  constructor(
    readonly record: RolloutRecord,
    readonly sandbox: Sandbox,
    loaded: { records: Map<number, StepRecord>; lastStep: number },
  ) {
    this.rolloutId = record.rolloutId;
    this.recorded = loaded.records;
    this.lastStep = loaded.lastStep;
    this.files = new RolloutFiles(this);
  }

  /** @internal the step a call runs as; moves the counter past it. */
  take(step: number | undefined): number {
    if (step === undefined) return this.nextStep++;
    if (!Number.isSafeInteger(step) || step < 0) throw new InvalidRequestError('INVALID_REQUEST', `step: must be an integer from 0, got ${step}`);
    this.nextStep = step + 1;
    return step;
  }

  /**
   * @internal The recorded result of `step` if the prefetched log settles it: a result for the
   * same request. A different request is a REPLAY_MISMATCH; anything else (not recorded, in
   * flight) is for the node to decide.
   */
  fromLog(step: number, op: StepOp, input: DigestInput, what: string): Record<string, unknown> | undefined {
    const rec = this.recorded.get(step);
    if (!rec) return undefined;
    this.recorded.delete(step);
    try {
      assertSameRequest(rec, op, input, what);
      return rec.kind === 'result' ? recordedOutcome(rec) : undefined;
    } catch (err) {
      throw err instanceof ProtocolError ? errorFromWire(err.toWire()) : err;
    }
  }

  /**
   * @internal Sends a step to the node. A STEP_CONFLICT means the step is running (an earlier try of this
   * trainer, or a racing one): wait for its result, which then replays (or mismatches).
   */
  async viaNode<T>(call: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    for (let i = 0; ; i++) {
      try {
        return await call();
      } catch (err) {
        const deadline = err instanceof StepError && err.code === 'STEP_CONFLICT' ? Number(err.detail?.deadline) : Number.NaN;
        if (!(Date.now() < deadline + CONFLICT_SLACK_MS)) throw err;
        if (signal?.aborted) throw new CancelledError('CANCELLED', 'the call was cancelled while its step was in flight');
        await sleep(Math.min(25 * 2 ** i, 1000));
      }
    }
  }

  /**
   * @internal Runs `f` as `step`. When it fails without the step getting an outcome (the log or
   * the node unreachable, a bad request), the counter goes back so that a retry reuses the step.
   */
  async as<T>(step: number, f: () => Promise<T>): Promise<T> {
    try {
      return await f();
    } catch (err) {
      const consumed = err instanceof PaddockError && err.detail?.step === step && err.code !== 'STEP_OUT_OF_ORDER';
      if (!consumed && this.nextStep === step + 1) this.nextStep = step;
      throw err;
    }
  }

  /**
   * Runs a command as the next step (or `opts.step`); a recorded step replays instead. An error
   * that is the step's outcome (its detail names the step) uses the step up; any other leaves the
   * counter on it, for a retry.
   */
  exec(cmd: string | string[], opts: RolloutExecOptions = {}): Promise<StepExecResult> {
    const step = this.take(opts.step);
    return this.as(step, () => this.execStep(step, cmd, opts));
  }

  private async execStep(step: number, cmd: string | string[], opts: RolloutExecOptions): Promise<StepExecResult> {
    const body = execBody(cmd, opts);
    const recorded = this.fromLog(step, 'exec', body, describeExec(body.cmd));
    if (recorded) return { ...toExecResult(recorded as unknown as WireExecResult), step, replayed: true };
    const r = await this.viaNode(() => this.sandbox.exec(cmd, { ...opts, rolloutId: this.rolloutId, step }), opts.signal);
    return { ...r, step, replayed: r.replayed === true };
  }
}

/** File writes as steps. Reads change nothing: use `rollout.sandbox.files`. */
export class RolloutFiles {
  constructor(private readonly ro: Rollout) {}

  /**
   * Replaces (or creates) the file as the next step (or `opts.step`). A step writes one message:
   * at most 4 MiB (Limits.files.chunkMax); write larger files in parts with `offset`.
   */
  async write(path: string, data: string | Uint8Array, opts: CallOptions & { step?: number; mode?: number; offset?: number } = {}): Promise<StepWriteResult> {
    const bytes = typeof data === 'string' ? new TextEncoder().encode(data) : data;
    if (bytes.length > Limits.files.chunkMax) throw new InvalidRequestError('INVALID_REQUEST', `a step writes at most ${Limits.files.chunkMax} bytes; write ${bytes.length} bytes in parts with offset`);
    const step = this.ro.take(opts.step);
    return this.ro.as(step, async () => {
      const req = { path, data: bytes, ...(opts.offset !== undefined ? { offset: opts.offset } : {}), ...(opts.mode !== undefined ? { mode: opts.mode } : {}) };
      const recorded = this.ro.fromLog(step, 'write', req, describeWrite(path, bytes.length, opts.offset));
      if (recorded) return { step, size: recorded.size as number, replayed: true };
      const r = await this.ro.viaNode(() => this.ro.sandbox.call<FilesWriteReply>('files.write', { ...req, rolloutId: this.ro.rolloutId, step }, opts), opts.signal);
      return { step, size: r.size, replayed: r.replayed === true };
    });
  }
}
