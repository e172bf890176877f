import { existsSync, readFileSync } from 'node:fs';
import { readdir, readFile, readlink } from 'node:fs/promises';
import { join } from 'node:path';
import test from 'ava';
import { run } from '../runtime/proc.ts';
import { nodeRunPath, restartNode, startTestCluster, stopTestCluster } from './helpers/cluster.ts';

/** Running, not a zombie waiting for the host's init to reap it. */
const alive = (pid: number) => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
};

/** The pids still alive after up to `ms` (killing is asynchronous: SIGKILL, then the exit). */
async function survivors(pids: number[], ms = 30_000): Promise<number[]> {
  const until = Date.now() + ms;
  for (;;) {
    const left = pids.filter(alive);
    if (left.length === 0 || Date.now() > until) return left;
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function cgroupPids(node: string, id: string): Promise<number[]> {
  const text = await readFile(`/sys/fs/cgroup/pids/paddock/${node}/${id}/cgroup.procs`, 'utf8').catch(() =>
    readFile(`/sys/fs/cgroup/paddock/${node}/${id}/cgroup.procs`, 'utf8').catch(() => ''),
  );
  return text
    .split('\n')
    .filter(Boolean)
    .map((s) => Number(s));
}

test('a node killed with SIGKILL takes up its running containers when it starts again, and again after a second crash; one whose init died meanwhile is removed', async (t) => {
  const c = await startTestCluster({ env: { PADDOCK_PLACEMENT: '1' } });
  t.teardown(() => stopTestCluster(c));
  const { pdk, cluster, home } = c;
  const first = cluster.nodes[0]!;
  const sbs = await Promise.all([1, 2, 3].map(() => pdk.sandboxes.create({ labels: { crash: '1' } })));
  // Give each a background process too, so there is more than the init to keep.
  await Promise.all(sbs.map((s) => s.exec(['sh', '-c', 'sleep 1000 > /dev/null 2>&1 &'])));
  const pidsOf = await Promise.all(sbs.map((s) => cgroupPids(first.id, s.id)));
  t.true(pidsOf.flat().length >= 6, `pids: ${pidsOf}`);
  // The runtime state is on a tmpfs the whole host sees (/dev/shm), linked from the node's directory.
  const runDir = join(home, 'nodes', first.id, 'run');
  const crunRoot = join(runDir, 'crun');
  t.is((await run('crun', ['--root', crunRoot, 'list', '-q'])).stdout.trim().split('\n').length, 3);

  first.proc.kill('SIGKILL');
  await first.exited;
  // The containers outlive their node, and so does their state.
  t.true(pidsOf.flat().every(alive));
  t.deepEqual((await readdir(join(runDir, 'sandboxes'))).sort(), sbs.map((s) => s.id).sort());
  // The third one's init dies while its node is away: nothing of it is left to take up.
  const lost = sbs[2]!;
  const state = JSON.parse((await run('crun', ['--root', crunRoot, 'state', lost.id])).stdout) as { pid: number };
  process.kill(state.pid, 'SIGKILL');
  t.deepEqual(await survivors(pidsOf[2]!), []);

  const again = await restartNode({ cluster, home }, first.id);
  cluster.nodes[0] = again;
  const kept = sbs.slice(0, 2);
  // The same processes, not new ones, and their sandboxes answer as before.
  t.true(pidsOf.slice(0, 2).flat().every(alive), 'the kept sandboxes ran through the restart');
  for (const [i, s] of kept.entries()) {
    const info = (await pdk.sandboxes.get(s.id)).info;
    t.is(info.state, 'running');
    t.is(info.createdAt, s.info.createdAt);
    t.deepEqual((await cgroupPids(first.id, s.id)).sort((a, b) => a - b), [...(pidsOf[i] ?? [])].sort((a, b) => a - b));
    t.is((await s.exec(['echo', 'still here'])).stdout, 'still here\n');
  }
  t.is((await run('crun', ['--root', crunRoot, 'list', '-q'])).stdout.trim().split('\n').sort().join(' '), kept.map((s) => s.id).sort().join(' '));
  // The one that died is gone from the host, and its record says why.
  t.deepEqual(await cgroupPids(first.id, lost.id), []);
  await t.throwsAsync(readdir(`/sys/fs/cgroup/memory/paddock/${first.id}/${lost.id}`));
  const info = (await pdk.sandboxes.get(lost.id)).info;
  t.is(info.state, 'failed');
  t.is(info.reason, 'node_restarted');
  // A second crash: they are taken up again (their lxcfs and layer daemon are still the first
  // node's), and a snapshot reaches the writable layer through the init's hold.
  await kept[0]!.files.write('/tmp/mark', 'twice');
  again.proc.kill('SIGKILL');
  await again.exited;
  const third = await restartNode({ cluster, home }, first.id);
  cluster.nodes[0] = third;
  t.true(pidsOf.slice(0, 2).flat().every(alive), 'the kept sandboxes ran through a second restart');
  t.is((await kept[0]!.exec(['cat', '/tmp/mark'])).stdout, 'twice');
  t.regex((await kept[1]!.exec(['head', '-1', '/proc/meminfo'])).stdout, /^MemTotal/);
  const snap = await kept[0]!.snapshot();
  await pdk.snapshots.delete(snap.id);
  // Killing a taken-up sandbox leaves nothing of it.
  for (const s of kept) t.is((await s.kill()).state, 'stopped');
  t.deepEqual(await survivors(pidsOf.flat()), []);
  t.is((await run('crun', ['--root', crunRoot, 'list', '-q'])).stdout.trim(), '');
  t.deepEqual(await readdir(join(runDir, 'sandboxes')), []);
  for (const s of sbs) await t.throwsAsync(readdir(`/sys/fs/cgroup/memory/paddock/${first.id}/${s.id}`));
  // And the node serves again.
  const fresh = await pdk.sandboxes.create({});
  t.is((await fresh.exec(['echo', 'back'])).stdout, 'back\n');
  await fresh.kill();
});

test('a clean stop kills every sandbox of the node', async (t) => {
  const c = await startTestCluster();
  t.teardown(() => stopTestCluster(c));
  const { pdk, cluster, home } = c;
  const node = cluster.nodes[0]!;
  const sbs = await Promise.all([1, 2].map(() => pdk.sandboxes.create({})));
  const pids = (await Promise.all(sbs.map((s) => cgroupPids(node.id, s.id)))).flat();
  t.true(pids.length >= 2);
  const bundles = nodeRunPath(home, node, 'sandboxes');
  t.is((await readdir(bundles)).length, 2);
  const runDir = await readlink(join(home, 'nodes', node.id, 'run'));
  await node.stop();
  t.deepEqual(await survivors(pids), []);
  // Nothing of the runtime state is left on the host.
  t.false(existsSync(join(home, 'nodes', node.id, 'run')));
  t.false(existsSync(runDir));
  for (const s of sbs) t.is((await pdk.sandboxes.get(s.id)).info.state, 'stopped');
  // With no node left to answer, the listing reads the directory bucket: the same records, filtered.
  const ended = await pdk.sandboxes.list({ state: ['stopped'] });
  t.deepEqual(ended.map((i) => i.id).sort(), sbs.map((s) => s.id).sort());
  t.deepEqual(await pdk.sandboxes.list({}), [], 'ended sandboxes are not listed by default');
});
