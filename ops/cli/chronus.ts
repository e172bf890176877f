/** `paddock chronus export`: a rollout's trajectory (its command log) as JSONL. */
import { createWriteStream } from 'node:fs';
import type { Writable } from 'node:stream';
import { Kvm } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/transport-node';
import { exportRollout } from '../../chronus/export.ts';
import { Buckets, isToken } from '../../protocol/index.ts';
import { InvalidRequestError, NotFoundError } from '../../sdk/index.ts';
import { type Args, positionals } from './args.ts';
import { note, UsageError, withClient } from './common.ts';

function writeLine(w: Writable, line: string): Promise<void> | undefined {
  if (w.write(`${line}\n`)) return undefined;
  return new Promise((resolve, reject) => {
    w.once('drain', resolve);
    w.once('error', reject);
  });
}

/**
 * `chronus export <rolloutId> [file|-]`: the rollout's trajectory as JSONL, to `dest` (default
 * stdout). NOT_FOUND when there is neither a rollout by that id nor a record of one.
 */
export async function exportCommand(nc: NatsConnection, rolloutId: string, dest?: string): Promise<number> {
  if (!isToken(rolloutId)) throw new InvalidRequestError('INVALID_REQUEST', `rolloutId: must be 1-64 characters of [A-Za-z0-9_-], got ${JSON.stringify(rolloutId)}`);
  const toStdout = dest === undefined || dest === '-';
  const w: Writable = toStdout ? process.stdout : createWriteStream(dest, { flags: 'w' });
  const opened = toStdout ? Promise.resolve() : new Promise((resolve, reject) => w.once('open', resolve).once('error', reject));
  await opened;
  let n: number;
  try {
    n = await exportRollout(nc, rolloutId, (line) => writeLine(w, line));
  } finally {
    if (!toStdout) await new Promise<void>((resolve, reject) => w.end((e?: Error | null) => (e ? reject(e) : resolve())));
  }
  if (n === 0) {
    const kv = await new Kvm(nc).open(Buckets.rollouts).catch(() => null);
    const e = await kv?.get(rolloutId);
    if (e?.operation !== 'PUT') throw new NotFoundError('NOT_FOUND', `rollout ${rolloutId} does not exist (no rollout and no recorded step)`);
  }
  return n;
}

/** `chronus export <rolloutId> [file|-]`. */
export async function chronusCli(a: Args): Promise<number> {
  const [verb, id, dest] = a.positionals;
  if (verb !== 'export' || id === undefined) throw new UsageError('usage: paddock chronus export <rolloutId> [file|-]', verb !== 'export');
  positionals(a, 2, 3, 'chronus export <rolloutId> [file|-]');
  return withClient(a.values, async (pdk) => {
    const n = await exportCommand(pdk.nc, id, dest);
    if (dest !== undefined && dest !== '-') note(`wrote ${n} steps of rollout ${id} to ${dest}`);
    return 0;
  });
}
