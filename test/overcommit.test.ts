import { readFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import test from 'ava';
import { NoCapacityError, type Sandbox } from '../sdk/index.ts';
import { startTestCluster, stopTestCluster } from './helpers/cluster.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('admission: capacity is physical × the overcommit ratio; beyond it NO_CAPACITY, retryable', async (t) => {
  // CPU ×1 on this host: exactly `cores` one-CPU sandboxes fit.
  const c = await startTestCluster({ env: { PADDOCK_CPU_OVERCOMMIT: '1' } });
  t.teardown(() => stopTestCluster(c));
  const n = cpus().length;
  const sbs: Sandbox[] = [];
  for (let i = 0; i < n; i++) sbs.push(await c.pdk.sandboxes.create({ cpu: 1 }));
  const err = await t.throwsAsync(c.pdk.sandboxes.create({ cpu: 1 }), { instanceOf: NoCapacityError });
  t.is(err?.code, 'NO_CAPACITY');
  t.true(err?.retryable);
  t.regex(err?.message ?? '', /cpu: need 1, free 0/);
  // A kill frees its share at once.
  await sbs.pop()?.kill();
  const again = await c.pdk.sandboxes.create({ cpu: 1 });
  sbs.push(again);
  await Promise.all(sbs.map((s) => s.kill()));
});

test('memory pressure hibernates idle best-effort sandboxes, longest idle first, and never latency-sensitive ones', async (t) => {
  // A threshold above the machine's memory: the node is "under pressure" from the start.
  const c = await startTestCluster({
    env: { PADDOCK_PRESSURE_MIN_AVAILABLE_MIB: String(10 * 1024 * 1024), PADDOCK_PRESSURE_MIN_IDLE_SEC: '0.3', PADDOCK_PRESSURE_INTERVAL_MS: '100' },
  });
  t.teardown(() => stopTestCluster(c));
  const ls = await c.pdk.sandboxes.create({ qos: 'ls' });
  const be1 = await c.pdk.sandboxes.create({ qos: 'be' });
  const be2 = await c.pdk.sandboxes.create({ qos: 'be' });
  // Bounded only against a hang: how soon the pressure loop acts depends on the machine.
  const until = Date.now() + 60_000;
  while (Date.now() < until && ((await be1.refresh()).state !== 'hibernated' || (await be2.refresh()).state !== 'hibernated')) await sleep(100);
  t.is(be1.info.state, 'hibernated');
  t.is(be1.info.sleepReason, 'pressure');
  t.is(be2.info.state, 'hibernated');
  t.is((await ls.refresh()).state, 'running');
  // Still usable: a call wakes it (and it may be put back to sleep once idle again).
  t.is((await be1.exec(['echo', 'up'])).stdout, 'up\n');
  // The node says why it did it, with the reading that made it.
  const log = await readFile(c.cluster.nodes[0]!.logFile!, 'utf8');
  t.regex(log, /"msg":"memory pressure: hibernating idle best-effort sandboxes"/);
  t.regex(log, /"availableMiB":\d+.*"msg":"hibernated under memory pressure"/);
});
