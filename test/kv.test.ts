/**
 * The directory scan against a real nats-server: every key once, the latest value, deletes gone,
 * and an end while it is written; the removal of ended sandboxes' records past their retention.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { jetstreamManager } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import { connect } from '@nats-io/transport-node';
import test, { type ExecutionContext } from 'ava';
import pino from 'pino';
import { DirectoryHost } from '../actors/directory-host.ts';
import { ENDED_SWEEP_KEY, PlacementHost } from '../actors/placement-host.ts';
import { Buckets, claimPeriod, encode, ensureBucket, scanKv, scanKvEntries } from '../protocol/index.ts';
import { Paddock } from '../sdk/index.ts';
import { natsFor } from './helpers/nats.ts';

test('scanKv: the last value of every live key, also while the bucket is written; cancel and deadline end it', async (t) => {
  const { nc } = await natsFor(t);
  const kv = await new Kvm(nc).create('scan', { history: 1 });
  t.deepEqual(await scanKv(kv), []);
  for (let i = 0; i < 500; i++) await kv.put(`k${i}`, encode({ i, v: 1 }));
  await kv.put('k7', encode({ i: 7, v: 2 }));
  await kv.delete('k5');
  await kv.purge('k6');
  // A writer beside the scans, as nodes write the directory while a listing runs.
  let writing = true;
  const writer = (async () => {
    for (let i = 0; writing; i++) {
      await kv.put(`w${i % 5}`, encode({ w: i }));
      await kv.delete(`w${(i + 2) % 5}`);
    }
  })();
  for (let round = 0; round < 10; round++) {
    const got = (await scanKv<{ i: number; v: number }>(kv)).filter((e) => e.key.startsWith('k'));
    t.is(got.length, 498);
    t.is(new Set(got.map((e) => e.key)).size, 498);
    t.false(got.some((e) => e.key === 'k5' || e.key === 'k6'));
    t.is(got.find((e) => e.key === 'k7')?.value.v, 2);
  }
  writing = false;
  await writer;
  const ac = new AbortController();
  ac.abort();
  await t.throwsAsync(scanKv(kv, { signal: ac.signal }), { message: /cancelled/ });
  await t.throwsAsync(scanKv(kv, { deadline: Date.now() - 1 }), { message: /did not finish in time/ });
  // Every scan deleted its consumer (the last ones a moment after they returned): the server keeps
  // one 5 minutes otherwise, and signals each on every write to the stream.
  const jsm = await jetstreamManager(nc);
  let left = -1;
  for (let i = 0; i < 50 && left !== 0; i++) {
    left = (await jsm.streams.info('KV_scan')).state.consumer_count;
    if (left !== 0) await new Promise((r) => setTimeout(r, 100));
  }
  t.is(left, 0);
});

test('the directory keeps an ended sandbox for its retention, then removes it, and its marker a sweep later', async (t) => {
  const { nats, nc } = await natsFor(t);
  const directory = await ensureBucket(nc, Buckets.sandboxes, { history: 1, replicas: 1 });
  const nodes = await ensureBucket(nc, Buckets.nodes, { history: 1, replicas: 1 });
  const host = new PlacementHost(nc, nodes, pino({ level: 'silent' }), undefined, { ms: 0, maxWaiting: 0, endedRetentionMs: 60_000, endedSweepMs: 10_000 });
  const now = Date.now();
  const rec = (id: string, state: string, endedAt?: number) => encode({ id, node: 'n1', state, createdAt: now - 3_600_000, ...(endedAt === undefined ? {} : { endedAt }) });
  await directory.put('old-stopped', rec('old-stopped', 'stopped', now - 120_000));
  await directory.put('old-failed', rec('old-failed', 'failed', now - 61_000));
  await directory.put('new-stopped', rec('new-stopped', 'stopped', now - 1000));
  await directory.put('running', rec('running', 'running'));
  await directory.put('paused-long', rec('paused-long', 'paused'));
  t.is(await host.sweepEnded(now), 2);
  const left = async () => (await scanKv<{ state: string }>(directory)).map((e) => e.key).sort();
  t.deepEqual(await left(), ['new-stopped', 'paused-long', 'running']);
  t.is((await directory.get('old-stopped'))?.operation, 'DEL');
  // The markers stay one sweep period (a reader that saw the record sees it go), then go too.
  const markers = async () => (await scanKvEntries(directory)).filter((e) => e.deleted).length;
  t.is(await host.sweepEnded(now + 1000), 0);
  t.is(await markers(), 2);
  t.is(await host.sweepEnded(Date.now() + 10_000), 0);
  t.is(await markers(), 0);
  t.deepEqual(await left(), ['new-stopped', 'paused-long', 'running']);
  // The recent one goes once its time comes; a live one never.
  t.is(await host.sweepEnded(now + 60_000), 1);
  t.deepEqual(await left(), ['paused-long', 'running']);
  // Once an hour for the cluster: the replica that claims the period sweeps, the others do not.
  t.true(await claimPeriod(directory, ENDED_SWEEP_KEY, 3_600_000, 'a'));
  t.false(await claimPeriod(directory, ENDED_SWEEP_KEY, 3_600_000, 'b'));
  t.true(await claimPeriod(directory, ENDED_SWEEP_KEY, 3_600_000, 'b', Date.now() + 3_600_000));
  // The mark is the directory's, not a sandbox: listings do not show it, and a sweep leaves it.
  const dh = new DirectoryHost(nc, pino({ level: 'silent' }));
  dh.start();
  t.teardown(() => dh.stop());
  const pdk = await Paddock.connect({ servers: nats.url });
  t.teardown(() => pdk.close());
  t.deepEqual((await pdk.sandboxes.list({ all: true })).map((s) => s.id).sort(), ['paused-long', 'running']);
  t.is(await host.sweepEnded(Date.now() + 86_400_000), 0);
  t.is((await directory.get(ENDED_SWEEP_KEY))?.operation, 'PUT');
});
