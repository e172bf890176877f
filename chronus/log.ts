/**
 * The command log in JetStream: setting up the stream and the rollouts bucket, and reading a
 * rollout's records back. Shared by the node (journal, retention), the SDK (rollouts) and export.
 */
import { AckPolicy, DeliverPolicy, DiscardPolicy, type JetStreamManager, jetstream, jetstreamManager, StorageType } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/transport-node';
import { Buckets, ensureBucket, type FewerReplicas, PREFIX, replicasFor, Streams, subjects } from '../protocol/index.ts';
import type { ChronusConfig } from './config.ts';
import { decodeRecord, type StepRecord } from './record.ts';

const STREAM = Streams.chronus;
const ms = (x: number) => Math.round(x * 1e6);

/**
 * Creates (or brings up to date) the log stream and the rollouts bucket. Idempotent: every node
 * calls it at start. `allow_direct` is what makes a step lookup one cheap request.
 */
export async function ensureChronus(nc: NatsConnection, cfg: ChronusConfig, onFewer?: (f: FewerReplicas) => void): Promise<{ jsm: JetStreamManager; rollouts: KV }> {
  const jsm = await jetstreamManager(nc);
  const replicas = cfg.replicas ?? replicasFor(nc.info);
  const want = {
    subjects: [subjects.chronusAll],
    storage: StorageType.File,
    max_age: ms(cfg.maxAgeSec * 1000),
    discard: DiscardPolicy.Old,
    allow_direct: true,
    num_replicas: replicas,
  };
  const have = await jsm.streams.info(STREAM).catch(() => null);
  if (!have) {
    await jsm.streams.add({ name: STREAM, ...want }).catch(async (e: unknown) => {
      // Another node created it first.
      if (!(await jsm.streams.info(STREAM).catch(() => null))) throw e;
    });
  } else if (have.config.max_age !== want.max_age || !have.config.allow_direct) {
    await jsm.streams.update(STREAM, { ...have.config, max_age: want.max_age, allow_direct: true });
  }
  if (have && have.config.num_replicas < replicas) onFewer?.({ stream: STREAM, replicas: have.config.num_replicas, wanted: replicas });
  const rollouts = await ensureBucket(nc, Buckets.rollouts, { history: 1, replicas }, onFewer);
  return { jsm, rollouts };
}

/** `pdk.v1.chronus.<rolloutId>.<step>` → its parts; null for anything else. */
export function parseStepSubject(subject: string): { rolloutId: string; step: number } | null {
  const head = `${PREFIX}.chronus.`;
  if (!subject.startsWith(head)) return null;
  const rest = subject.slice(head.length);
  const dot = rest.lastIndexOf('.');
  const step = Number(rest.slice(dot + 1));
  if (dot <= 0 || !Number.isSafeInteger(step) || step < 0) return null;
  return { rolloutId: rest.slice(0, dot), step };
}

export interface StoredRecord {
  seq: number;
  record: StepRecord;
}

/**
 * A rollout's records in the order they were written: every record (`all`), or only the last
 * of each step (`last`: where each step stands, what a replay needs). One ephemeral consumer,
 * read to its end and deleted.
 */
export async function readRollout(nc: NatsConnection, rolloutId: string, which: 'all' | 'last', jsm?: JetStreamManager): Promise<StoredRecord[]> {
  const m = jsm ?? (await jetstreamManager(nc));
  const ci = await m.consumers.add(STREAM, {
    ack_policy: AckPolicy.None,
    deliver_policy: which === 'last' ? DeliverPolicy.LastPerSubject : DeliverPolicy.All,
    filter_subject: subjects.chronusRollout(rolloutId),
    inactive_threshold: ms(60_000),
    mem_storage: true,
  });
  const out: StoredRecord[] = [];
  try {
    let left = ci.num_pending;
    const consumer = await jetstream(nc).consumers.get(STREAM, ci.name);
    while (left > 0) {
      let got = 0;
      const batch = await consumer.fetch({ max_messages: Math.min(left, 1024), expires: 5000 });
      for await (const msg of batch) {
        got++;
        left = msg.info.pending;
        out.push({ seq: msg.seq, record: decodeRecord(msg.data) });
        if (left === 0) break;
      }
      // Records purged after the consumer was made: nothing more will come.
      if (got === 0) break;
    }
  } finally {
    await m.consumers.delete(STREAM, ci.name).catch(() => {});
  }
  return out;
}

/** The steps of a rollout that have records, ascending (from the stream's per-subject counts). */
export async function recordedSteps(jsm: JetStreamManager, rolloutId: string): Promise<number[]> {
  const si = await jsm.streams.info(STREAM, { subjects_filter: subjects.chronusRollout(rolloutId) });
  const steps: number[] = [];
  for (const subject of Object.keys(si.state.subjects ?? {})) {
    const p = parseStepSubject(subject);
    if (p) steps.push(p.step);
  }
  return steps.sort((a, b) => a - b);
}

/** The last record of one step, or null; one direct get. */
export async function lastRecord(jsm: JetStreamManager, rolloutId: string, step: number): Promise<(StoredRecord & { time: number }) | null> {
  const m = await jsm.direct.getMessage(STREAM, { last_by_subj: subjects.chronusStep(rolloutId, step) });
  return m ? { seq: m.seq, time: m.time.getTime(), record: decodeRecord(m.data) } : null;
}

/** Deletes every record of a rollout. */
export async function purgeRollout(jsm: JetStreamManager, rolloutId: string): Promise<number> {
  const r = await jsm.streams.purge(STREAM, { filter: subjects.chronusRollout(rolloutId) });
  return r.purged;
}
