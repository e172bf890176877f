/** Reading a whole JetStream KV bucket: the one scan every directory reader uses. */
import type { KV } from '@nats-io/kv';
import { decode } from './codec.ts';
import { ProtocolError } from './errors.ts';

export interface ScanOptions {
  /** Stop with TIMEOUT past this moment (ms since the epoch). */
  deadline?: number;
  signal?: AbortSignal;
}

/**
 * Every live entry of a bucket, decoded, in batches of parallel gets. Keys are collected first
 * into a set: a key written while the scan runs (a sandbox changing state) is listed again by
 * the key iterator.
 */
export async function scanKv<T>(kv: KV, opts: ScanOptions = {}): Promise<Array<{ key: string; value: T }>> {
  const keys = new Set<string>();
  for await (const k of await kv.keys()) keys.add(k);
  const all = [...keys];
  const out: Array<{ key: string; value: T }> = [];
  const batch = 64;
  for (let i = 0; i < all.length; i += batch) {
    if (opts.signal?.aborted) throw new ProtocolError('CANCELLED', 'the listing was cancelled');
    if (opts.deadline !== undefined && Date.now() > opts.deadline) throw new ProtocolError('TIMEOUT', `the listing did not finish in time (${i} of ${all.length} read)`);
    const got = await Promise.all(all.slice(i, i + batch).map((k) => kv.get(k)));
    for (const e of got) if (e?.operation === 'PUT') out.push({ key: e.key, value: decode(e.value) as T });
  }
  return out;
}
