/**
 * The pool of killed sandboxes' cgroups (runtime/container/cgroup-pool.ts), on a real node: a kill
 * keeps the empty cgroups, the next create takes them with limits of its own and none of the
 * counters its predecessor left, and a stopping node removes what it kept. Under cgroup v2 there
 * is no pool: a kill removes the cgroups.
 */
import { existsSync, readdirSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { detectCgroups } from '../runtime/cgroups.ts';
import { clusterTest, startTestCluster, stopTestCluster } from './helpers/cluster.ts';

const test = clusterTest();
const v1 = detectCgroups() !== 'v2';
const read = (p: string) => readFile(p, 'utf8').then((s) => s.trim());
/** The node's cgroups in the pids hierarchy (v1) or the unified one (v2). */
const nodeDir = (node: string) => (v1 ? `/sys/fs/cgroup/pids/paddock/${node}` : `/sys/fs/cgroup/paddock/${node}`);
const pooled = (node: string) => (existsSync(nodeDir(node)) ? readdirSync(nodeDir(node)).filter((n) => /^pool-\d+$/.test(n)) : []);

test.serial('a killed sandbox leaves its cgroups to the next create, which gets its own limits and none of its counters', async (t) => {
  const { pdk } = t.context;
  const a = await pdk.sandboxes.create({ cpu: 0.5, memoryMiB: 128, pidsLimit: 64, qos: 'be' });
  const node = a.info.node;
  // CPU time, so that a counter the next tenant could read through lxcfs is not zero.
  await a.exec(['sh', '-c', 'i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done']);
  const before = pooled(node).length;
  await a.kill();
  if (!v1) {
    t.is(pooled(node).length, 0, 'cgroup v2: nothing is pooled');
    t.false(existsSync(`${nodeDir(node)}/${a.id}`));
    return;
  }
  t.is(pooled(node).length, before + 1, 'the killed sandbox cgroups are kept');
  for (const h of ['memory', 'pids', 'cpu', 'cpuacct', 'freezer']) t.false(existsSync(`/sys/fs/cgroup/${h}/paddock/${node}/${a.id}`), h);

  const b = await pdk.sandboxes.create({ cpu: 1, memoryMiB: 256, pidsLimit: 100 });
  t.teardown(() => b.kill().catch(() => {}));
  t.is(pooled(node).length, before, 'the create took them');
  const cg = (h: string, f: string) => read(`/sys/fs/cgroup/${h}/paddock/${node}/${b.id}/${f}`);
  t.is(await cg('memory', 'memory.limit_in_bytes'), String(256 * 1024 * 1024));
  t.is(await cg('memory', 'memory.memsw.limit_in_bytes').catch(() => String(256 * 1024 * 1024)), String(256 * 1024 * 1024));
  t.is(await cg('pids', 'pids.max'), '100');
  t.is(await cg('cpu', 'cpu.shares'), '1024', 'not the best-effort weight its predecessor had');
  t.is(await cg('cpu', 'cpu.cfs_quota_us'), '100000');
  t.true(Number(await cg('cpuacct', 'cpuacct.usage')) < 50_000_000, 'the CPU time its predecessor used is not counted as its own');
  t.is(await cg('freezer', 'freezer.state'), 'THAWED');
  const procs = (await cg('pids', 'cgroup.procs')).split('\n').filter(Boolean);
  t.true(procs.length >= 1, 'its init lives there');
  t.is((await b.exec(['echo', 'reused'])).stdout, 'reused\n');
  // Its limits hold: a memory hog past 256 MiB is MEMORY_LIMIT in the reused cgroup.
  const hog = await b.exec(['sh', '-c', 'a=x; while true; do a="$a$a"; done'], { timeoutMs: 60_000 });
  t.is(hog.verdict, 'MEMORY_LIMIT');
});

test.serial('a stopping node removes the cgroups it kept', async (t) => {
  // A cluster of its own: stopped here, with nothing left for the file's own teardown to stop again.
  const own = await startTestCluster();
  let stopped = false;
  t.teardown(() => (stopped ? undefined : stopTestCluster(own)));
  const sb = await own.pdk.sandboxes.create({});
  const node = sb.info.node;
  await sb.kill();
  if (v1) t.true(pooled(node).length >= 1);
  await stopTestCluster(own);
  stopped = true;
  t.false(existsSync(nodeDir(node)), 'no cgroup of the node is left');
});
