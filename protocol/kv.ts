/** Reading a whole JetStream KV bucket: the one scan every directory reader uses. */
import { DeliverPolicy, type JsMsg } from '@nats-io/jetstream';
import { Bucket, type KV, Kvm } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/transport-node';
import { decode, encode } from './codec.ts';
import { ProtocolError } from './errors.ts';

export interface ScanOptions {
  /** Stop with TIMEOUT past this moment (ms since the epoch; default: a minute from now). */
  deadline?: number;
  signal?: AbortSignal;
}

const SCAN_TIMEOUT_MS = 60_000;

/**
 * The last entry of every key of a bucket (delete markers included), decoded, in one pass of an
 * ordered consumer over the last value of each key. Not `kv.keys()` + a get per key: that is a
 * request per key, and its key iterator ends on a message whose `pending` is 0 or else on the
 * consumer's idle heartbeat, so a bucket written while it runs (sandboxes changing state) held a
 * listing for 30 s. This one also ends once it has seen the stream's last sequence as of just
 * after the consumer was made: every key's last value at that moment comes at or before it, in
 * stream order.
 */
export async function scanKvEntries<T>(kv: KV, opts: ScanOptions = {}): Promise<Array<KvEntry<T>>> {
  if (!(kv instanceof Bucket)) throw new TypeError('scanKv: not a JetStream KV bucket');
  const deadline = opts.deadline ?? Date.now() + SCAN_TIMEOUT_MS;
  if (opts.signal?.aborted) throw new ProtocolError('CANCELLED', 'the listing was cancelled');
  if (Date.now() > deadline) throw new ProtocolError('TIMEOUT', 'the listing did not finish in time (0 keys read)');
  const prefix = `$KV.${kv.bucket}.`;
  const consumer = await kv.js.consumers.get(kv.stream, { filter_subjects: `${prefix}>`, deliver_policy: DeliverPolicy.LastPerSubject });
  const latest = new Map<string, JsMsg>();
  let why: ProtocolError | undefined;
  try {
    const info = await consumer.info();
    if (info.num_pending === 0) return [];
    const fence = (await kv.jsm.streams.info(kv.stream)).state.last_seq;
    const iter = await consumer.consume({ max_messages: 512 });
    const stop = (e: ProtocolError) => {
      why = e;
      void iter.close();
    };
    const timer = setTimeout(() => stop(new ProtocolError('TIMEOUT', `the listing did not finish in time (${latest.size} keys read)`)), Math.max(0, deadline - Date.now()));
    const onAbort = () => stop(new ProtocolError('CANCELLED', 'the listing was cancelled'));
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      for await (const m of iter) {
        // A key written while the scan runs comes again: its later value wins.
        latest.set(m.subject.slice(prefix.length), m);
        if (m.info.pending === 0 || m.seq >= fence) break;
      }
    } finally {
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      await iter.close().catch(() => {});
    }
  } finally {
    // The server keeps an ordered consumer 5 minutes after its last use unless it is deleted: one
    // left by each scan (each node's at start, each `sandboxes.list`, each retention sweep) kept
    // ~160 per bucket on the servers of a 160-node fleet, each signalled on every write.
    void consumer.delete().catch(() => {});
  }
  if (why) throw why;
  const out: Array<KvEntry<T>> = [];
  for (const [key, m] of latest) {
    const op = m.headers?.get('KV-Operation');
    const at = Math.floor(m.info.timestampNanos / 1e6);
    if (op === 'DEL' || op === 'PURGE') out.push({ key, revision: m.seq, at, deleted: true });
    else out.push({ key, value: decode(m.data) as T, revision: m.seq, at });
  }
  return out;
}

/** A key's last entry: its value, or the marker of its deletion. `at`: when it was written (ms since the epoch). */
export type KvEntry<T> = { key: string; value: T; revision: number; at: number; deleted?: undefined } | { key: string; value?: undefined; revision: number; at: number; deleted: true };

/**
 * Whether the caller does a cluster-wide chore now: once per `periodMs` for the whole cluster, not
 * once per process that could. When it was last done is `key` of `kv` (a key no record can have),
 * taken by a write at its revision: of callers that look at once, one wins. A mark from the future
 * (a clock ahead) is taken over rather than obeyed.
 */
export async function claimPeriod(kv: KV, key: string, periodMs: number, by: string, now = Date.now()): Promise<boolean> {
  const e = await kv.get(key);
  const mark = encode({ at: now, by });
  const won = (p: Promise<unknown>) =>
    p.then(
      () => true,
      () => false,
    );
  if (e?.operation !== 'PUT') return won(kv.create(key, mark));
  const last = (decode(e.value) as { at?: unknown }).at;
  if (typeof last === 'number' && last <= now && now - last < periodMs) return false;
  return won(kv.update(key, mark, e.revision));
}

/** Removes a key's delete marker for good (a deleted key leaves one in the stream, read by every scan). */
export async function dropMarker(kv: KV, key: string): Promise<void> {
  if (!(kv instanceof Bucket)) throw new TypeError('dropMarker: not a JetStream KV bucket');
  await kv.jsm.streams.purge(kv.stream, { filter: `$KV.${kv.bucket}.${key}`, keep: 0 });
}

/** Every live entry of a bucket, decoded, in one pass (scanKvEntries without the delete markers). */
export async function scanKv<T>(kv: KV, opts: ScanOptions = {}): Promise<Array<{ key: string; value: T; revision: number }>> {
  const out: Array<{ key: string; value: T; revision: number }> = [];
  for (const e of await scanKvEntries<T>(kv, opts)) if (!e.deleted) out.push({ key: e.key, value: e.value, revision: e.revision });
  return out;
}

/**
 * How many replicas Paddock's buckets and streams get: `PADDOCK_REPLICAS` when set, else 3 when
 * the server is one of a cluster of three or more (its INFO lists the cluster's client URLs),
 * else 1. JetStream refuses more replicas than there are servers.
 */
export function replicasFor(info: { cluster?: string; connect_urls?: string[] } | undefined, env: NodeJS.ProcessEnv = process.env): number {
  const set = env.PADDOCK_REPLICAS;
  if (set !== undefined && set !== '') {
    const n = Number(set);
    if (!Number.isInteger(n) || n < 1 || n > 5) throw new Error(`PADDOCK_REPLICAS: must be an integer from 1 to 5, got ${JSON.stringify(set)}`);
    return n;
  }
  return info?.cluster && (info.connect_urls?.length ?? 0) >= 3 ? 3 : 1;
}

/** A bucket kept with fewer replicas than asked for (it existed before): reported, since JetStream keeps the old setting. */
export interface FewerReplicas {
  /** The JetStream stream (a bucket's is `KV_<bucket>`). */
  stream: string;
  replicas: number;
  wanted: number;
}

/** The warning for a bucket with fewer replicas than wanted: what it is, and how to fix it. */
export function fewerReplicasWarning(f: FewerReplicas): string {
  return `JetStream stream ${f.stream} has ${f.replicas} replica${f.replicas === 1 ? '' : 's'}, not ${f.wanted}: it was made before this cluster was (or with fewer PADDOCK_REPLICAS), and its data goes with the one server that holds it. Raise it with \`nats stream edit ${f.stream} --replicas ${f.wanted}\`, or set PADDOCK_REPLICAS=${f.replicas} to accept it`;
}

/**
 * Opens `name`, creating it with `replicas` when it does not exist. nats.js keeps an existing
 * bucket's stream as it is: one made with a single replica on a lone server stays at one after
 * the server joins a cluster, so a bucket with fewer replicas than wanted goes to `onFewer`.
 */
export async function ensureBucket(nc: NatsConnection, name: string, opts: { history: number; replicas: number }, onFewer?: (f: FewerReplicas) => void): Promise<KV> {
  const kv = await new Kvm(nc).create(name, opts);
  if (onFewer && opts.replicas > 1) {
    const have = (await kv.status()).replicas;
    if (have < opts.replicas) onFewer({ stream: `KV_${name}`, replicas: have, wanted: opts.replicas });
  }
  return kv;
}
