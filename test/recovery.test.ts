import { readFileSync } from 'node:fs';
import { readdir, readFile } from 'node:fs/promises';
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

test('a node killed with SIGKILL cleans up its leftovers when it starts again', async (t) => {
  const c = await startTestCluster({ env: { PADDOCK_PLACEMENT: '1' } });
  t.teardown(() => stopTestCluster(c));
  const { pdk, cluster, home } = c;
  const first = cluster.nodes[0]!;
  const sbs = await Promise.all([1, 2, 3].map(() => pdk.sandboxes.create({ labels: { crash: '1' } })));
  // Give each a background process too, so there is more than the init to find.
  await Promise.all(sbs.map((s) => s.exec(['sh', '-c', 'sleep 1000 > /dev/null 2>&1 &'])));
  const pids = (await Promise.all(sbs.map((s) => cgroupPids(first.id, s.id)))).flat();
  t.true(pids.length >= 6, `pids: ${pids}`);
  const crunRoot = nodeRunPath(home, first, 'crun');
  t.is((await run('crun', ['--root', crunRoot, 'list', '-q'])).stdout.trim().split('\n').length, 3);

  first.proc.kill('SIGKILL');
  await first.exited;
  // The containers outlive their node: these are the leftovers. Its runtime state (bundles, crun's
  // state) was a tmpfs in its mount namespace and went with it; their cgroups are what is left.
  t.true(pids.every(alive));
  t.deepEqual(await readdir(join(home, 'nodes', first.id, 'run')), []);

  const again = await restartNode({ cluster, home }, first.id);
  cluster.nodes[0] = again;
  t.deepEqual(await survivors(pids), []);
  t.is((await run('crun', ['--root', nodeRunPath(home, again, 'crun'), 'list', '-q'])).stdout.trim(), '');
  t.deepEqual(await readdir(nodeRunPath(home, again, 'sandboxes')), []);
  for (const s of sbs) {
    t.deepEqual(await cgroupPids(first.id, s.id), []);
    await t.throwsAsync(readdir(`/sys/fs/cgroup/memory/paddock/${first.id}/${s.id}`));
  }
  // The directory tells what happened to them.
  for (const s of sbs) {
    const info = (await pdk.sandboxes.get(s.id)).info;
    t.is(info.state, 'failed');
    t.is(info.reason, 'node_restarted');
  }
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
  await node.stop();
  t.deepEqual(await survivors(pids), []);
  // Nothing of the runtime state is left on the host's disk.
  t.deepEqual(await readdir(join(home, 'nodes', node.id, 'run')), []);
  for (const s of sbs) t.is((await pdk.sandboxes.get(s.id)).info.state, 'stopped');
  // With no node left to answer, the listing reads the directory bucket: the same records, filtered.
  const ended = await pdk.sandboxes.list({ state: ['stopped'] });
  t.deepEqual(ended.map((i) => i.id).sort(), sbs.map((s) => s.id).sort());
  t.deepEqual(await pdk.sandboxes.list({}), [], 'ended sandboxes are not listed by default');
});
