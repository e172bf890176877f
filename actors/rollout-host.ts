/**
 * The command log's calls on the wire (`pdk.v1.rollouts.<verb>`): start, attach, get, steps,
 * export, delete. Answered by any placement replica, so a client in any language needs only
 * request/reply to start a rollout, find it again after a restart and read its trajectory; the
 * `pdk_rollouts` records and the PDK_CHRONUS stream stay the server's business.
 */
import { type JetStreamManager, jetstreamManager } from '@nats-io/jetstream';
import { type KV, Kvm } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/transport-node';
import { Type } from '@sinclair/typebox';
import type { Logger } from 'pino';
import { stepLine } from '../chronus/export.ts';
import { purgeRollout, readRollout, recordedSteps } from '../chronus/log.ts';
import {
  Buckets,
  type CreateReply,
  check,
  decode,
  encode,
  isMap,
  newRolloutId,
  PLACEMENT_QUEUE,
  ProtocolError,
  type Reply,
  type RolloutRecord,
  type RolloutsStepsReply,
  type RolloutVerb,
  RolloutVerbs,
  type RolloutView,
  type SandboxInfo,
  Schema,
  subjects,
} from '../protocol/index.ts';
import { decodeRolloutRecord, type ResultRecord, type StartedRecord, type StepRecord } from '../protocol/records.ts';
import { traceHeaders } from '../protocol/trace.ts';
import { serve } from './bind.ts';
import type { DirectoryHost } from './directory-host.ts';

/** RolloutsStartRequest with its sandbox spec left to placement, which answers INVALID_SPEC for a bad one. */
const StartEnvelope = Type.Object({ ...Schema.RolloutsStartRequest.properties, sandbox: Type.Optional(Type.Record(Type.String(), Type.Unknown(), { errorMessage: 'must be a map (a sandbox spec)' })) });

/** A create waits for placement and the node, which wait up to 120 s for a slow image. */
const CREATE_TIMEOUT_MS = 130_000;
const PAGE_OVERHEAD = 64 * 1024;

export class RolloutHost {
  private kvp?: Promise<KV>;
  private jsmp?: Promise<JetStreamManager>;
  private readonly subs: Array<{ unsubscribe(): void }> = [];

  constructor(
    private readonly nc: NatsConnection,
    private readonly directory: DirectoryHost,
    private readonly log: Logger,
    /** The connection the bucket and the log are read over (default `nc`). */
    private readonly store: NatsConnection = nc,
  ) {}

  start(): void {
    const handlers: Record<RolloutVerb, (body: unknown) => Promise<unknown>> = {
      start: (b) => this.startRollout(b),
      attach: (b) => this.attach(b),
      get: (b) => this.get(b),
      steps: (b) => this.steps(b),
      export: (b) => this.export(b),
      delete: (b) => this.delete(b),
    };
    for (const verb of RolloutVerbs) {
      this.subs.push(serve(this.nc, subjects.rollouts(verb), { queue: PLACEMENT_QUEUE, log: this.log, name: `rollouts.${verb}` }, (req) => handlers[verb](req.body)));
    }
  }

  stop(): void {
    for (const s of this.subs) s.unsubscribe();
  }

  private kv(): Promise<KV> {
    this.kvp ??= new Kvm(this.store).open(Buckets.rollouts).catch((err: unknown) => {
      this.kvp = undefined;
      throw new ProtocolError('UNAVAILABLE', `no command log here (bucket ${Buckets.rollouts}): ${(err as Error).message}`);
    });
    return this.kvp;
  }

  private jsm(): Promise<JetStreamManager> {
    this.jsmp ??= jetstreamManager(this.store).catch((err: unknown) => {
      this.jsmp = undefined;
      throw new ProtocolError('UNAVAILABLE', `JetStream is not available: ${(err as Error).message}`);
    });
    return this.jsmp;
  }

  private async record(rolloutId: string): Promise<{ rec: RolloutRecord; revision: number } | null> {
    const e = await (await this.kv()).get(rolloutId);
    return e?.operation === 'PUT' ? { rec: decodeRolloutRecord(e.value), revision: e.revision } : null;
  }

  private async mustRecord(rolloutId: string): Promise<{ rec: RolloutRecord; revision: number }> {
    const r = await this.record(rolloutId);
    if (!r) throw new ProtocolError('NOT_FOUND', `rollout ${rolloutId} does not exist`, { detail: { rolloutId } });
    return r;
  }

  /** Creates a sandbox (through placement) and the rollout's record. ALREADY_EXISTS if the id is taken. */
  private async startRollout(body: unknown): Promise<RolloutView<StepRecord>> {
    const q = check(StartEnvelope, body, 'INVALID_REQUEST', 'rollouts.start');
    const rolloutId = q.rolloutId ?? newRolloutId();
    if (await this.record(rolloutId)) throw taken(rolloutId);
    const labels = q.sandbox?.labels ?? {};
    // Labels that are not a map go to placement as they are, which refuses them (INVALID_SPEC).
    const spec = { ...q.sandbox, labels: isMap(labels) ? { ...labels, 'paddock.rollout': rolloutId } : labels };
    const m = await this.nc.request(subjects.placeCreate, encode({ spec }), { timeout: CREATE_TIMEOUT_MS, headers: traceHeaders() });
    const r = decode(m.data) as Reply<CreateReply>;
    if (!r.ok) throw new ProtocolError(r.error.code, r.error.message, { detail: r.error.detail });
    const sandbox = r.result.sandbox;
    const now = Date.now();
    const rec: RolloutRecord = { v: 1, rolloutId, sandbox: sandbox.id, createdAt: now, touchedAt: now, retentionSec: q.retentionSec };
    try {
      await (await this.kv()).create(rolloutId, encode(rec));
    } catch (err) {
      // Another trainer started the same id a moment ago: it keeps it.
      await this.kill(sandbox.id);
      if (await this.record(rolloutId).catch(() => null)) throw taken(rolloutId);
      throw new ProtocolError('UNAVAILABLE', `could not record rollout ${rolloutId}: ${(err as Error).message}`);
    }
    return { rollout: rec, sandbox, lastStep: -1, steps: [] };
  }

  /**
   * The rollout, its sandbox (whatever its state: an exec wakes a sleeping one), its highest
   * recorded step and, with `prefetch`, the last record of each step (first page). An attach
   * restarts the retention clock.
   */
  private async attach(body: unknown): Promise<RolloutView<StepRecord>> {
    const q = check(Schema.RolloutsAttachRequest, body, 'INVALID_REQUEST', 'rollouts.attach');
    const { rec, revision } = await this.mustRecord(q.rolloutId);
    const sandbox: SandboxInfo = await this.directory.lookup(rec.sandbox);
    const view: RolloutView<StepRecord> = { rollout: rec, sandbox, lastStep: -1 };
    if (q.prefetch) {
      const page = await this.page(q.rolloutId, 'last', -1);
      view.steps = page.records;
      view.lastStep = page.lastStep;
      if (page.next !== undefined) view.next = page.next;
    } else {
      view.lastStep = (await this.readLog(() => this.jsm().then((jsm) => recordedSteps(jsm, q.rolloutId)), q.rolloutId)).at(-1) ?? -1;
    }
    const touched = { ...rec, touchedAt: Date.now() };
    // Best effort: a racing attach restarts the clock as well.
    await (await this.kv()).update(q.rolloutId, encode(touched), revision).catch(() => {});
    view.rollout = touched;
    return view;
  }

  private async get(body: unknown): Promise<RolloutRecord> {
    const q = check(Schema.RolloutsGetRequest, body, 'INVALID_REQUEST', 'rollouts.get');
    return (await this.mustRecord(q.rolloutId)).rec;
  }

  private async steps(body: unknown): Promise<RolloutsStepsReply<StepRecord>> {
    const q = check(Schema.RolloutsStepsRequest, body, 'INVALID_REQUEST', 'rollouts.steps');
    await this.mustRecord(q.rolloutId);
    const { records, next } = await this.page(q.rolloutId, q.which, q.after);
    return next === undefined ? { records } : { records, next };
  }

  /** The trajectory as JSON lines (one per step, as `paddock rollouts export` writes them), paged. */
  private async export(body: unknown): Promise<{ lines: string[]; next?: number }> {
    const q = check(Schema.RolloutsExportRequest, body, 'INVALID_REQUEST', 'rollouts.export');
    const all = await this.readLog(() => readRollout(this.store, q.rolloutId, 'all'), q.rolloutId);
    // A log outlives its record when the record is deleted by hand: it still exports.
    if (all.length === 0) await this.mustRecord(q.rolloutId);
    const steps = new Map<number, { started?: StartedRecord; result?: ResultRecord }>();
    for (const { record } of all) {
      if (record.step <= q.after) continue;
      const s = steps.get(record.step) ?? {};
      if (record.kind === 'started') s.started = record;
      else s.result = record;
      steps.set(record.step, s);
    }
    const budget = this.budget();
    const lines: string[] = [];
    let bytes = 0;
    const order = [...steps.keys()].sort((a, b) => a - b);
    for (const step of order) {
      const s = steps.get(step) as { started?: StartedRecord; result?: ResultRecord };
      const line = JSON.stringify(stepLine(s.started, s.result));
      if (lines.length > 0 && bytes + line.length > budget) return { lines, next: order[lines.length - 1] };
      lines.push(line);
      bytes += line.length;
    }
    return { lines };
  }

  private async delete(body: unknown): Promise<{ purged: number }> {
    const q = check(Schema.RolloutsDeleteRequest, body, 'INVALID_REQUEST', 'rollouts.delete');
    const found = await this.record(q.rolloutId);
    const purged = await purgeRollout(await this.jsm(), q.rolloutId);
    await (await this.kv()).delete(q.rolloutId);
    if (q.kill && found) await this.kill(found.rec.sandbox);
    return { purged };
  }

  /** Kills a sandbox if it still runs (an ended one has no actor: nothing to do). */
  private async kill(id: string): Promise<void> {
    try {
      const m = await this.nc.request(subjects.sandbox(id, 'kill'), encode({}), { timeout: 60_000, headers: traceHeaders() });
      const r = decode(m.data) as Reply<unknown>;
      if (!r.ok && r.error.code !== 'NOT_FOUND') throw new ProtocolError(r.error.code, r.error.message);
    } catch (err) {
      if (err instanceof ProtocolError) throw err;
      this.log.debug({ err, id }, 'kill: the sandbox has no actor');
    }
  }

  private budget(): number {
    return (this.nc.info?.max_payload ?? 1024 * 1024) - PAGE_OVERHEAD;
  }

  /** Records of steps above `after`, whole steps, as many as fit one reply; `next` (the last step given) when more follow. */
  private async page(rolloutId: string, which: 'last' | 'all', after: number): Promise<{ records: StepRecord[]; lastStep: number; next?: number }> {
    const all = await this.readLog(() => readRollout(this.store, rolloutId, which), rolloutId);
    const bySteps = new Map<number, StepRecord[]>();
    for (const { record } of all) {
      if (record.step <= after) continue;
      const list = bySteps.get(record.step) ?? [];
      list.push(record);
      bySteps.set(record.step, list);
    }
    const lastStep = all.reduce((m, r) => Math.max(m, r.record.step), -1);
    const budget = this.budget();
    const records: StepRecord[] = [];
    let bytes = 0;
    let given = after;
    for (const step of [...bySteps.keys()].sort((a, b) => a - b)) {
      const recs = bySteps.get(step) as StepRecord[];
      const size = recs.reduce((n, r) => n + encode(r).length, 0);
      if (records.length > 0 && bytes + size > budget) return { records, lastStep, next: given };
      records.push(...recs);
      bytes += size;
      given = step;
    }
    return { records, lastStep };
  }

  private async readLog<T>(read: () => Promise<T>, rolloutId: string): Promise<T> {
    try {
      return await read();
    } catch (err) {
      if (err instanceof ProtocolError) throw err;
      throw new ProtocolError('UNAVAILABLE', `cannot read the log of rollout ${rolloutId}: ${(err as Error).message}`);
    }
  }
}

function taken(rolloutId: string): ProtocolError {
  return new ProtocolError('ALREADY_EXISTS', `rollout ${rolloutId} already exists: attach to it`, { detail: { rolloutId } });
}
