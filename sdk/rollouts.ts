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
 * rollout's recorded results are read once, so replaying a thousand steps costs no round trip per
 * step; a step the log does not settle (not recorded, or still in flight) goes to the node, which
 * decides with the same rules.
 */
import type { JetStreamManager } from '@nats-io/jetstream';
import { jetstreamManager } from '@nats-io/jetstream';
import { type KV, Kvm } from '@nats-io/kv';
import { DEFAULT_RETENTION_SEC } from '../chronus/config.ts';
import { purgeRollout, readRollout, recordedSteps } from '../chronus/log.ts';
import {
  type DigestInput,
  decodeRolloutRecord,
  describeExec,
  describeWrite,
  newRolloutId,
  type ResultRecord,
  type RolloutRecord,
  type StepOp,
  type StepRecord,
  sameRequest,
} from '../chronus/record.ts';
import { Buckets, encode, type FilesWriteReply, isToken, Limits, type SandboxSpec } from '../protocol/index.ts';
import { AlreadyExistsError, CancelledError, errorFromWire, InvalidRequestError, NotFoundError, PaddockError, ReplayMismatchError, StepError, UnavailableError } from './errors.ts';
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

/** What Rollouts needs of `pdk.sandboxes`. */
export interface SandboxSource {
  create(spec: Partial<SandboxSpec>, opts?: CallOptions): Promise<Sandbox>;
  get(id: string, opts?: CallOptions): Promise<Sandbox>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** After a running step's deadline, how long to keep asking before taking the node's last word. */
const CONFLICT_SLACK_MS = 2000;

export class Rollouts {
  private kvp?: Promise<KV>;
  private jsmp?: Promise<JetStreamManager>;

  constructor(
    private readonly t: Transport,
    private readonly sandboxes: SandboxSource,
  ) {}

  private kv(): Promise<KV> {
    this.kvp ??= new Kvm(this.t.nc).open(Buckets.rollouts).catch((err: unknown) => {
      this.kvp = undefined;
      throw new UnavailableError('UNAVAILABLE', `no command log here (bucket ${Buckets.rollouts}): is a Paddock node running? ${(err as Error).message}`, { cause: err });
    });
    return this.kvp;
  }

  private jsm(): Promise<JetStreamManager> {
    this.jsmp ??= jetstreamManager(this.t.nc).catch((err: unknown) => {
      this.jsmp = undefined;
      throw new UnavailableError('UNAVAILABLE', `JetStream is not available: ${(err as Error).message}`, { cause: err });
    });
    return this.jsmp;
  }

  /** The rollout's record (its sandbox, retention), or null. */
  async get(rolloutId: string): Promise<RolloutRecord | null> {
    if (!isToken(rolloutId)) throw new InvalidRequestError('INVALID_REQUEST', `rolloutId: must be 1-64 characters of [A-Za-z0-9_-], got ${JSON.stringify(rolloutId)}`);
    const e = await (await this.kv()).get(rolloutId);
    return e?.operation === 'PUT' ? decodeRolloutRecord(e.value) : null;
  }

  /** Creates a sandbox and a rollout on it. Fails with ALREADY_EXISTS if the id is taken. */
  async start(opts: RolloutStartOptions = {}): Promise<Rollout> {
    const rolloutId = opts.rolloutId ?? newRolloutId();
    const retentionSec = opts.retentionSec ?? DEFAULT_RETENTION_SEC;
    if (!(Number.isFinite(retentionSec) && retentionSec > 0)) throw new InvalidRequestError('INVALID_REQUEST', `retentionSec: must be a positive number, got ${retentionSec}`);
    if (await this.get(rolloutId)) throw taken(rolloutId);
    const spec = { ...opts.sandbox, labels: { ...opts.sandbox?.labels, 'paddock.rollout': rolloutId } };
    const sandbox = await this.sandboxes.create(spec, opts);
    const now = Date.now();
    const rec: RolloutRecord = { v: 1, rolloutId, sandbox: sandbox.id, createdAt: now, touchedAt: now, retentionSec };
    try {
      await (await this.kv()).create(rolloutId, encode(rec));
    } catch (err) {
      // Another trainer started the same id a moment ago: it keeps it.
      await sandbox.kill().catch(() => {});
      if (await this.get(rolloutId).catch(() => null)) throw taken(rolloutId);
      throw new UnavailableError('UNAVAILABLE', `could not record rollout ${rolloutId}: ${(err as Error).message}`, { cause: err });
    }
    return new Rollout(rec, sandbox, await this.load(rolloutId, true));
  }

  /**
   * The rollout's sandbox (running, paused or hibernated: an exec wakes it) and its log, to replay
   * from step 0. `lastStep` is the highest step recorded (-1: none).
   */
  async attach(rolloutId: string, opts: AttachOptions = {}): Promise<Rollout> {
    const kv = await this.kv();
    if (!isToken(rolloutId)) throw new InvalidRequestError('INVALID_REQUEST', `rolloutId: must be 1-64 characters of [A-Za-z0-9_-], got ${JSON.stringify(rolloutId)}`);
    const e = await kv.get(rolloutId);
    if (e?.operation !== 'PUT') throw new NotFoundError('NOT_FOUND', `rollout ${rolloutId} does not exist`, { detail: { rolloutId } });
    const rec = decodeRolloutRecord(e.value);
    const sandbox = await this.sandboxes.get(rec.sandbox, opts);
    const loaded = await this.load(rolloutId, opts.prefetch !== false);
    // An attach restarts the retention clock (best effort: a racing attach did it as well).
    const touched = { ...rec, touchedAt: Date.now() };
    await kv.update(rolloutId, encode(touched), e.revision).catch(() => {});
    return new Rollout(touched, sandbox, loaded);
  }

  private async load(rolloutId: string, prefetch: boolean): Promise<{ records: Map<number, StepRecord>; lastStep: number }> {
    try {
      const records = new Map<number, StepRecord>();
      let lastStep = -1;
      if (prefetch) {
        for (const { record } of await readRollout(this.t.nc, rolloutId, 'last', await this.jsm())) {
          records.set(record.step, record);
          lastStep = Math.max(lastStep, record.step);
        }
      } else {
        lastStep = (await recordedSteps(await this.jsm(), rolloutId)).at(-1) ?? -1;
      }
      return { records, lastStep };
    } catch (err) {
      if (err instanceof UnavailableError) throw err;
      throw new UnavailableError('UNAVAILABLE', `cannot read the log of rollout ${rolloutId}: ${(err as Error).message}`, { cause: err });
    }
  }

  /** Deletes the rollout and every record of its log; with `kill`, its sandbox too. */
  async delete(rolloutId: string, opts: CallOptions & { kill?: boolean } = {}): Promise<void> {
    const rec = await this.get(rolloutId);
    await purgeRollout(await this.jsm(), rolloutId);
    await (await this.kv()).delete(rolloutId);
    if (opts.kill && rec) {
      const sb = await this.sandboxes.get(rec.sandbox, opts).catch((err: unknown) => {
        if (err instanceof NotFoundError) return null;
        throw err;
      });
      await sb?.kill(opts);
    }
  }
}

function taken(rolloutId: string): AlreadyExistsError {
  return new AlreadyExistsError('ALREADY_EXISTS', `rollout ${rolloutId} already exists: attach to it`, { detail: { rolloutId } });
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
  fromLog(step: number, op: StepOp, input: DigestInput, what: string): ResultRecord | undefined {
    const rec = this.recorded.get(step);
    if (!rec) return undefined;
    this.recorded.delete(step);
    if (!sameRequest(rec, op, input)) {
      throw new ReplayMismatchError('REPLAY_MISMATCH', `step ${step} of rollout ${this.rolloutId} is recorded as \`${rec.what}\`, not \`${what}\`: the trainer is not replaying what it did`, {
        detail: { rolloutId: this.rolloutId, step, recorded: rec.what, asked: what },
      });
    }
    if (rec.kind !== 'result') return undefined;
    if (!rec.outcome.ok) throw errorFromWire({ ...rec.outcome.error, detail: { ...rec.outcome.error.detail, replayed: true, rolloutId: this.rolloutId, step } });
    return rec;
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
    const rec = this.fromLog(step, 'exec', body, describeExec(body.cmd));
    if (rec?.op === 'exec' && rec.outcome.ok) {
      return { ...toExecResult(rec.outcome.result), step, replayed: true };
    }
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
      const rec = this.ro.fromLog(step, 'write', req, describeWrite(path, bytes.length, opts.offset));
      if (rec?.op === 'write' && rec.outcome.ok) return { step, size: rec.outcome.result.size, replayed: true };
      const r = await this.ro.viaNode(() => this.ro.sandbox.call<FilesWriteReply>('files.write', { ...req, rolloutId: this.ro.rolloutId, step }, opts), opts.signal);
      return { step, size: r.size, replayed: r.replayed === true };
    });
  }
}
