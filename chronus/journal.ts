/**
 * The node's side of the command log: runs a step of a rollout at most once.
 *
 * A step is claimed by writing its `started` record with `Nats-Expected-Last-Subject-Sequence: 0`:
 * JetStream stores it only if the step's subject is empty, so of any number of racing requests (on
 * any nodes) exactly one wins. The winner runs the command and writes the `result` record before it
 * answers. Everyone else reads the step's last record and answers from it:
 *   - a result, same request      → the recorded result, `replayed: true`; nothing runs;
 *   - any record, other request   → REPLAY_MISMATCH;
 *   - `started` and still running → STEP_CONFLICT (retryable: the result is coming);
 *   - `started` and its runner gone (its node restarted, or the step's deadline passed)
 *                                 → UNKNOWN_OUTCOME, for good: it may have run, it never runs again.
 * A step above 0 needs the step before it recorded (STEP_OUT_OF_ORDER otherwise).
 */
import { randomBytes } from 'node:crypto';
import { JetStreamApiCodes, JetStreamApiError, type JetStreamClient, type JetStreamManager, jetstream } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { claimPeriod, type ExecResult, type FilesWriteReply, fewerReplicasWarning, Limits, natsFailure, ProtocolError, scanKv, storeFull, subjects, toWireError } from '../protocol/index.ts';
import type { ChronusConfig } from './config.ts';
import { ensureChronus, lastRecord, purgeRollout, recordedSteps, type StoredRecord } from './log.ts';
import {
  assertSameRequest,
  type DigestInput,
  asRolloutRecord,
  describeExec,
  describeWrite,
  type ExecStepRequest,
  encodeRecord,
  type Outcome,
  recordedOutcome,
  replayMismatch,
  RECORD_VERSION,
  type ResultRecord,
  requestDigest,
  type StartedRecord,
  type StepOp,
} from './record.ts';

/** Which step of which rollout, run in which sandbox. */
export interface StepKey {
  rolloutId: string;
  step: number;
  sandbox: string;
}

export interface WriteStep {
  path: string;
  data: Uint8Array;
  offset?: number;
  mode?: number;
}

/** What a sandbox host needs: run this exec or write as a step, at most once. */
export interface StepJournal {
  exec(key: StepKey, req: ExecStepRequest, run: () => Promise<ExecResult>): Promise<ExecResult>;
  write(key: StepKey, req: WriteStep, run: () => Promise<FilesWriteReply>): Promise<FilesWriteReply>;
}

export interface JournalOptions {
  nodeId: string;
  log: Logger;
  config: ChronusConfig;
  /** Largest message the connection may publish: a record's inline stdin or data is dropped past it. */
  maxPayload: number;
}

/** After its own timeout, how long a step may still take to get its result recorded. */
const RESULT_GRACE_MS = 30_000;
/** A write has no timeout of its own. */
const WRITE_DEADLINE_MS = 60_000;
/** How long the result write is retried (NATS reconnecting) before the outcome is declared unknown. */
const RESULT_RETRY_MS = 15_000;
/** Rollouts whose last step this node remembers (saves the order check's lookup); oldest forgotten first. */
const KNOWN_MAX = 10_000;
/** Room for a record's fields around inline bytes. */
const RECORD_OVERHEAD = 16 * 1024;
/** The last retention sweep of the cluster (`claimSweep`): no rollout id has a dot. */
const SWEEP_KEY = 'sweep.last';

interface Claim {
  op: StepOp;
  digest: string;
  what: string;
  /** How long after its start the step may still be running. */
  holdMs: number;
}

function isWrongLastSequence(e: unknown): boolean {
  return e instanceof JetStreamApiError && e.code === JetStreamApiCodes.StreamWrongLastSequence;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class Journal implements StepJournal {
  /** This node process; a node restarted under the same id is another boot. */
  readonly boot = randomBytes(8).toString('hex');
  private claims = 0;
  private readonly inflight = new Map<string, Omit<Claim, 'holdMs'> & { deadline: number; done: Promise<unknown> }>();
  /** rollout id → highest step known to be recorded. */
  private readonly known = new Map<string, number>();
  /** Claims this process gave up on before running anything (their write's fate was unknown). */
  private readonly abandoned = new Set<string>();
  private sweeper?: NodeJS.Timeout;
  private readonly js: JetStreamClient;

  private constructor(
    nc: NatsConnection,
    private readonly jsm: JetStreamManager,
    private readonly rollouts: KV,
    private readonly o: JournalOptions,
  ) {
    this.js = jetstream(nc);
  }

  static async open(nc: NatsConnection, o: JournalOptions): Promise<Journal> {
    const { jsm, rollouts } = await ensureChronus(nc, o.config, (f) => o.log.warn({ ...f }, fewerReplicasWarning(f)));
    return new Journal(nc, jsm, rollouts, o);
  }

  exec(key: StepKey, req: ExecStepRequest, run: () => Promise<ExecResult>): Promise<ExecResult> {
    const input: DigestInput = req;
    const claim: Claim = { op: 'exec', digest: requestDigest('exec', input), what: describeExec(req.cmd), holdMs: req.timeoutMs + RESULT_GRACE_MS };
    const request: ExecStepRequest = { cmd: req.cmd, timeoutMs: req.timeoutMs, maxOutputBytes: req.maxOutputBytes };
    if (req.cwd !== undefined) request.cwd = req.cwd;
    if (req.env !== undefined) request.env = req.env;
    if (req.stdin && req.stdin.length > 0) {
      const argBytes = req.cmd.reduce((n, a) => n + Buffer.byteLength(a), 0);
      if (req.stdin.length + argBytes + RECORD_OVERHEAD <= this.o.maxPayload) request.stdin = req.stdin;
      else request.stdinSize = req.stdin.length;
    }
    return this.step(key, claim, input, { op: 'exec', request }, async () => {
      const { replayed: _, ...r } = await run();
      return r;
    }) as Promise<ExecResult>;
  }

  write(key: StepKey, req: WriteStep, run: () => Promise<FilesWriteReply>): Promise<FilesWriteReply> {
    // Refused before it is claimed: a request that cannot run is not a step's outcome.
    if (req.data.length > Limits.files.chunkMax) throw new ProtocolError('PAYLOAD_TOO_LARGE', `write chunk larger than ${Limits.files.chunkMax} bytes`);
    const claim: Claim = { op: 'write', digest: requestDigest('write', req), what: describeWrite(req.path, req.data.length, req.offset), holdMs: WRITE_DEADLINE_MS };
    const fits = req.data.length + req.path.length + RECORD_OVERHEAD <= this.o.maxPayload;
    const request = { path: req.path, size: req.data.length, ...(fits ? { data: req.data } : {}), ...(req.offset !== undefined ? { offset: req.offset } : {}), ...(req.mode !== undefined ? { mode: req.mode } : {}) };
    return this.step(key, claim, req, { op: 'write', request }, async () => ({ size: (await run()).size })) as Promise<FilesWriteReply>;
  }

  private async lookup(rolloutId: string, step: number): Promise<StoredRecord | null> {
    try {
      return await lastRecord(this.jsm, rolloutId, step);
    } catch (e) {
      if (e instanceof ProtocolError) throw e;
      throw logUnavailable(e, 'the command log cannot be read');
    }
  }

  private note(rolloutId: string, step: number): void {
    const k = this.known.get(rolloutId);
    if (k !== undefined && k >= step) return;
    this.known.delete(rolloutId);
    this.known.set(rolloutId, step);
    if (this.known.size > KNOWN_MAX) this.known.delete(this.known.keys().next().value as string);
  }

  private async step(key: StepKey, claim: Claim, input: DigestInput, body: Pick<StartedRecord, 'op' | 'request'>, run: () => Promise<object>): Promise<object> {
    this.refuseIfBusy(key, claim);
    let over = 0;
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.attempt(key, claim, input, body, run, over);
      } catch (e) {
        if (!(e instanceof Retake) || attempt > 3) throw e;
        over = e.seq;
      }
    }
  }

  /** A step this process is claiming or running already: the request differs, or it has to wait. */
  private refuseIfBusy(key: StepKey, claim: Claim): void {
    const mine = this.inflight.get(`${key.rolloutId}.${key.step}`);
    if (!mine) return;
    if (mine.op !== claim.op || mine.digest !== claim.digest) throw replayMismatch(key, mine.what, claim.what);
    throw conflict(key, { deadline: mine.deadline, node: this.o.nodeId });
  }

  /** One try at a step; `over` > 0 replaces a claim of ours that never ran (see `abandoned`). */
  private async attempt(key: StepKey, claim: Claim, input: DigestInput, body: Pick<StartedRecord, 'op' | 'request'>, run: () => Promise<object>, over: number): Promise<object> {
    const { rolloutId, step } = key;
    const id = `${rolloutId}.${step}`;
    // Steps this node saw recorded are probably replays: look before claiming.
    let known = over > 0 ? step : this.known.get(rolloutId);
    let looked = over > 0;
    if (!looked && known !== undefined && step <= known) {
      const found = await this.lookup(rolloutId, step);
      if (found) return this.settle(key, found, claim, input);
      // The rollout was deleted since: what this node knew no longer holds.
      looked = true;
      this.known.delete(rolloutId);
      known = undefined;
    }
    if (step > 0 && (known === undefined || known < step - 1)) {
      if (!looked) {
        const found = await this.lookup(rolloutId, step);
        if (found) return this.settle(key, found, claim, input);
      }
      if (!(await this.lookup(rolloutId, step - 1))) {
        throw new ProtocolError('STEP_OUT_OF_ORDER', `step ${step} of rollout ${rolloutId} skips ahead: step ${step - 1} is not recorded (steps start at 0 and go up by one)`, {
          detail: { rolloutId, step },
        });
      }
    }

    const subject = subjects.chronusStep(rolloutId, step);
    const startedAt = Date.now();
    const started = {
      v: RECORD_VERSION,
      kind: 'started',
      rolloutId,
      step,
      ...body,
      digest: claim.digest,
      what: claim.what,
      sandbox: key.sandbox,
      node: this.o.nodeId,
      boot: this.boot,
      claim: `${this.boot}-${++this.claims}`,
      startedAt,
      deadline: startedAt + claim.holdMs,
    } as StartedRecord;
    const entry = { op: claim.op, digest: claim.digest, what: claim.what, deadline: started.deadline, done: Promise.resolve() as Promise<unknown> };
    // Another request for the step may have got here during the lookups above.
    this.refuseIfBusy(key, claim);
    this.inflight.set(id, entry);
    const release = () => {
      if (this.inflight.get(id) === entry) this.inflight.delete(id);
    };
    let startedSeq: number;
    try {
      startedSeq = await this.claim(key, subject, started, over);
    } catch (e) {
      release();
      if (e instanceof Settled) return this.settle(key, e.found, claim, input);
      throw e;
    }
    this.note(rolloutId, step);
    const done = this.runAndRecord(key, subject, started, startedSeq, run);
    entry.done = done.catch(() => {});
    try {
      return await done;
    } finally {
      release();
    }
  }

  /**
   * Writes the `started` record if the step is free (its last record is `over`: none, or an
   * abandoned claim of ours); its sequence, or `Settled` with whoever has the step.
   */
  private async claim(key: StepKey, subject: string, started: StartedRecord, over: number): Promise<number> {
    // nats-server acks a few writes from its cache once its disk is full: a claim it acks may be
    // followed by a result it cannot store, and a step that ran would be UNKNOWN_OUTCOME for good.
    // Where the store's disk can be seen (a local server), a full one refuses the step before it runs.
    const full = storeFull();
    if (full) throw new ProtocolError('UNAVAILABLE', `the command log is unavailable, step ${key.step} of rollout ${key.rolloutId} did not run: JetStream's store is full (${full})`, { detail: { what: 'the command log', reason: 'disk_full' } });
    try {
      return (await this.js.publish(subject, encodeRecord(started), { expect: { lastSubjectSequence: over } })).seq;
    } catch (e) {
      if (isWrongLastSequence(e)) {
        const found = await this.lookup(key.rolloutId, key.step);
        if (found) throw new Settled(found);
        // Recorded a moment ago and deleted since (the rollout was deleted): let the caller retry.
        throw conflict(key, { deadline: Date.now(), node: this.o.nodeId });
      }
      // The claim may have been stored before the error (a lost ack): look whether it is ours.
      const found = await this.lookup(key.rolloutId, key.step).catch(() => null);
      if (found?.record.kind === 'started' && found.record.claim === started.claim) return found.seq;
      if (found) throw new Settled(found);
      // It may still be stored: if it is, it is a claim that never ran, and a retry may take it over.
      this.abandoned.add(started.claim);
      if (this.abandoned.size > KNOWN_MAX) this.abandoned.delete(this.abandoned.values().next().value as string);
      throw logUnavailable(e, `the command log is unavailable, step ${key.step} of rollout ${key.rolloutId} did not run`);
    }
  }

  private async runAndRecord(key: StepKey, subject: string, started: StartedRecord, startedSeq: number, run: () => Promise<object>): Promise<object> {
    let outcome: Outcome<object>;
    let thrown: unknown;
    try {
      outcome = { ok: true, result: await run() };
    } catch (e) {
      thrown = e;
      outcome = { ok: false, error: toWireError(e) };
    }
    const result = {
      v: RECORD_VERSION,
      kind: 'result',
      op: started.op,
      rolloutId: key.rolloutId,
      step: key.step,
      digest: started.digest,
      what: started.what,
      sandbox: key.sandbox,
      node: this.o.nodeId,
      startedAt: started.startedAt,
      endedAt: Date.now(),
      outcome,
    } as ResultRecord;
    if (!(await this.record(key, subject, result, startedSeq))) {
      const ran = outcome.ok ? `it ran (exit ${(outcome.result as { exitCode?: number }).exitCode ?? 'ok'})` : `it failed (${outcome.error.code})`;
      throw new ProtocolError('UNKNOWN_OUTCOME', `step ${key.step} of rollout ${key.rolloutId}: ${ran} but its result could not be recorded, so a replay cannot return it`, {
        detail: { rolloutId: key.rolloutId, step: key.step },
      });
    }
    if (!outcome.ok) {
      // The failure is this step's outcome now (a replay returns it): say which step it belongs to.
      const w = outcome.error;
      throw new ProtocolError(w.code, w.message, { cause: thrown, detail: { ...w.detail, rolloutId: key.rolloutId, step: key.step } });
    }
    return outcome.result;
  }

  /** Writes the result after its `started`; retried while NATS reconnects. False if it never got in. */
  private async record(key: StepKey, subject: string, rec: ResultRecord, startedSeq: number): Promise<boolean> {
    const data = encodeRecord(rec);
    const until = Date.now() + RESULT_RETRY_MS;
    for (let i = 0; ; i++) {
      try {
        await this.js.publish(subject, data, { expect: { lastSubjectSequence: startedSeq } });
        return true;
      } catch (e) {
        if (isWrongLastSequence(e)) {
          // Either an earlier try of ours got in (its ack was lost), or the rollout was deleted
          // meanwhile; nothing else can write after our `started`.
          const found = await this.lookup(key.rolloutId, key.step).catch(() => null);
          if (found && found.seq > startedSeq && found.record.kind === 'result') return true;
          this.o.log.warn({ rolloutId: key.rolloutId, step: key.step }, 'rollout deleted while its step ran; result not recorded');
          return true;
        }
        if (Date.now() > until) {
          this.o.log.error({ err: e, rolloutId: key.rolloutId, step: key.step }, 'could not record a step result');
          return false;
        }
        await sleep(Math.min(50 * 2 ** i, 1000));
      }
    }
  }

  /** Answers a step that is already recorded, from its last record. */
  private async settle(key: StepKey, found: StoredRecord, claim: Claim, input: DigestInput, again = false): Promise<object> {
    const rec = found.record;
    if (rec.kind === 'started' && this.abandoned.has(rec.claim)) throw new Retake(found.seq);
    assertSameRequest(rec, claim.op, input, claim.what);
    this.note(key.rolloutId, key.step);
    if (rec.kind === 'result') return recordedOutcome(rec);
    if (this.inflight.has(`${key.rolloutId}.${key.step}`)) throw conflict(key, rec);
    // Its runner is gone (this node restarted, or this very process failed to record the result)
    // or its deadline passed: unless a result arrived meanwhile, nobody will ever write one.
    if (rec.boot === this.boot || rec.node === this.o.nodeId || Date.now() > rec.deadline) {
      if (!again) {
        const now = await this.lookup(key.rolloutId, key.step);
        if (now && now.seq !== found.seq) return this.settle(key, now, claim, input, true);
      }
      throw new ProtocolError('UNKNOWN_OUTCOME', `step ${key.step} of rollout ${key.rolloutId} (${rec.what}) was in flight on node ${rec.node} when it went away: it may or may not have run, and it will not run again`, {
        detail: { rolloutId: key.rolloutId, step: key.step, node: rec.node, sandbox: rec.sandbox, startedAt: rec.startedAt },
      });
    }
    throw conflict(key, rec);
  }

  /** Deletes the logs of rollouts past their retention; returns their ids. */
  async sweep(now = Date.now()): Promise<string[]> {
    const gone: string[] = [];
    // One pass over the bucket (not a get per key); a value that is not a rollout record is left alone.
    for (const { key: k, value, revision } of await scanKv<unknown>(this.rollouts)) {
      let keepMs: number;
      let touchedAt: number;
      try {
        const r = asRolloutRecord(value);
        keepMs = r.retentionSec * 1000;
        touchedAt = r.touchedAt;
      } catch {
        continue;
      }
      if (touchedAt + keepMs > now) continue;
      const steps = await recordedSteps(this.jsm, k);
      const lastStep = steps[steps.length - 1];
      const last = lastStep === undefined ? null : await lastRecord(this.jsm, k, lastStep);
      if (last && last.time + keepMs > now) continue;
      // Attached (touched) since we read it: keep it.
      const deleted = await this.rollouts.delete(k, { previousSeq: revision }).then(
        () => true,
        () => false,
      );
      if (!deleted) continue;
      await purgeRollout(this.jsm, k);
      this.known.delete(k);
      gone.push(k);
    }
    return gone;
  }

  /**
   * Whether this node sweeps now: one sweep per period for the whole cluster, not one per node. A
   * scan of the bucket makes and deletes a consumer (on a cluster, a proposal to every server
   * each), and 160 nodes sweeping every minute kept an idle fleet's NATS making ~3 a second.
   */
  claimSweep(now = Date.now()): Promise<boolean> {
    return claimPeriod(this.rollouts, SWEEP_KEY, this.o.config.sweepMs, this.o.nodeId, now);
  }

  startSweeper(): void {
    const tick = async () => {
      try {
        const gone = (await this.claimSweep()) ? await this.sweep() : [];
        if (gone.length > 0) this.o.log.info({ rollouts: gone }, 'deleted rollouts past their retention');
      } catch (err) {
        this.o.log.warn({ err }, 'rollout retention sweep failed');
      }
      this.sweeper = setTimeout(() => void tick(), this.o.config.sweepMs);
      this.sweeper.unref();
    };
    this.sweeper = setTimeout(() => void tick(), Math.random() * this.o.config.sweepMs);
    this.sweeper.unref();
  }

  /** Stops sweeping and waits (a while) for steps in flight to record their results. */
  async close(waitMs = RESULT_RETRY_MS + 5000): Promise<void> {
    clearTimeout(this.sweeper);
    const pending = [...this.inflight.values()].map((c) => c.done);
    if (pending.length === 0) return;
    await Promise.race([Promise.allSettled(pending), sleep(waitMs)]);
  }
}

/** Thrown by `claim` when the step turned out to be recorded already. */
class Settled extends Error {
  constructor(readonly found: StoredRecord) {
    super('step already recorded');
  }
}

/** The step's last record is a claim of ours that never ran: claim it again over that record. */
class Retake extends Error {
  constructor(readonly seq: number) {
    super('step held by an abandoned claim');
  }
}

function conflict(key: StepKey, holder: { deadline: number; node: string }): ProtocolError {
  return new ProtocolError('STEP_CONFLICT', `step ${key.step} of rollout ${key.rolloutId} is being run by another request (on node ${holder.node}); its result will replay once recorded`, {
    detail: { rolloutId: key.rolloutId, step: key.step, inFlight: true, node: holder.node, deadline: holder.deadline },
  });
}

/**
 * A failure of the command log's stream as UNAVAILABLE, with natsFailure's `detail` (what, and why:
 * disk_full, no_quorum, timeout…) so that a caller can tell a full disk from a slow server.
 */
function logUnavailable(e: unknown, says: string): ProtocolError {
  const failure = natsFailure(e, 'the command log');
  const why = failure ? failure.message.replace(/^the command log is unavailable: /, '') : (e as Error).message;
  return new ProtocolError('UNAVAILABLE', `${says}: ${why}`, { cause: e, detail: failure?.detail ?? { what: 'the command log', reason: 'other' } });
}
