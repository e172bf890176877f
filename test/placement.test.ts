import { readdir, readFile } from 'node:fs/promises';
import { ImageStore } from '../runtime/images/store.ts';
import { BackendError, TimeoutError } from '../sdk/index.ts';
import { clusterTest, nodeRunPath, SHARED_IMAGES } from './helpers/cluster.ts';
import { eventually } from './helpers/wait.ts';

const byString = (a: string, b: string) => a.localeCompare(b);
// A simulated backend beside the containers, whose creates take 3 s: what a slow image pull looks like to placement.
const test = clusterTest({ nodes: 2, env: { PADDOCK_BACKENDS: 'container,sim', PADDOCK_SIM_LATENCY_MS: 'create=3000' } });

test.serial('placement spreads sandboxes over both nodes', async (t) => {
  const { pdk, cluster } = t.context;
  const sbs = [];
  for (let i = 0; i < 12; i++) sbs.push(await pdk.sandboxes.create({ labels: { spread: '1' } }));
  const nodes = new Set(sbs.map((s) => s.info.node));
  t.deepEqual([...nodes].sort(byString), cluster.nodes.map((n) => n.id).sort(byString));
  await Promise.all(sbs.map((s) => s.kill()));
});

test.serial('a node pin places the sandbox there', async (t) => {
  const { pdk, cluster } = t.context;
  const target = cluster.nodes[1]!.id;
  const sb = await pdk.sandboxes.create({ node: target });
  t.is(sb.info.node, target);
  await sb.kill();
});

test.serial('50 sandboxes created concurrently all run, then all go', async (t) => {
  const { pdk, cluster, home } = t.context;
  const results = await Promise.allSettled(Array.from({ length: 50 }, () => pdk.sandboxes.create({ memoryMiB: 64, labels: { burst: '50' } })));
  const failed = results.filter((r) => r.status === 'rejected');
  t.deepEqual(
    failed.map((f) => String((f as PromiseRejectedResult).reason)),
    [],
  );
  const sbs = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  t.is(new Set(sbs.map((s) => s.id)).size, 50);
  const outs = await Promise.all(sbs.map((s) => s.exec(['echo', s.id])));
  t.deepEqual(
    outs.map((o) => o.stdout),
    sbs.map((s) => `${s.id}\n`),
  );
  t.is((await pdk.sandboxes.list({ labels: { burst: '50' } })).length, 50);
  await Promise.all(sbs.map((s) => s.kill()));
  t.is((await pdk.sandboxes.list({ labels: { burst: '50' } })).length, 0);
  // Nothing left behind on either node: bundles, cgroups, mounts.
  for (const n of cluster.nodes) {
    t.deepEqual(await readdir(nodeRunPath(home, n, 'sandboxes')), []);
    const mounts = await readFile(`/proc/${n.proc.pid}/mountinfo`, 'utf8');
    t.notRegex(mounts, /\/sandboxes\/sb-/);
  }
});

test.serial('a create the backend cannot complete fails cleanly, leaving nothing behind', async (t) => {
  const { pdk, cluster, home } = t.context;
  const store = new ImageStore(SHARED_IMAGES);
  const busybox = await store.get('busybox');
  await store.putManifest({ ...busybox!, name: 'broken-init', init: ['/no/such/init'] });
  t.teardown(() => store.removeManifest('broken-init'));
  // Wait for every node's heartbeat to announce the new image (seconds on a loaded host).
  for (let i = 0; i < 100; i++) {
    const nodes = await pdk.nodes.list();
    if (nodes.length === cluster.nodes.length && nodes.every((n) => n.images.includes('broken-init'))) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  const err = await t.throwsAsync(pdk.sandboxes.create({ image: 'broken-init' }), { instanceOf: BackendError });
  t.is(err?.code, 'BACKEND_FAILED');
  t.regex(err?.message ?? '', /no\/such\/init|crun/);
  for (const n of cluster.nodes) {
    t.deepEqual(await readdir(nodeRunPath(home, n, 'sandboxes')), []);
    const mounts = await readFile(`/proc/${n.proc.pid}/mountinfo`, 'utf8');
    t.notRegex(mounts, /\/sandboxes\/sb-/);
  }
  const failed = (await pdk.sandboxes.list({ all: true })).filter((s) => s.image === 'broken-init');
  t.true(failed.length >= 1);
  t.true(failed.every((s) => s.state === 'failed' && s.reason === 'create_failed'));
});

test.serial("placement waits for the node as long as the create's caller waits, and its TIMEOUT says which node was late", async (t) => {
  const { pdk } = t.context;
  const labels = { slow: 'create' };
  // 1.5 s against a 3 s create: placement answers first (its wait is the caller's less a second),
  // not the SDK's own clock, which would say only that nothing answered.
  const err = await t.throwsAsync(pdk.sandboxes.create({ backend: 'sim', labels }, { timeoutMs: 1500 }), { instanceOf: TimeoutError });
  t.regex(err?.message ?? '', /node \S+ did not answer the create of sb-\S+ in time/);
  const sb = await pdk.sandboxes.create({ backend: 'sim', labels }, { timeoutMs: 20_000 });
  t.is(sb.info.state, 'running');
  // The create that timed out still finishes on its node: it is there to be found and killed.
  const running = () => pdk.sandboxes.list({ labels, state: ['running'] });
  const ok = await eventually(async () => (await running()).length === 2);
  t.true(ok, JSON.stringify((await pdk.sandboxes.list({ labels, all: true })).map((s) => [s.id, s.state, s.reason])));
  await Promise.all((await running()).map(async (s) => (await pdk.sandboxes.get(s.id)).kill()));
});
