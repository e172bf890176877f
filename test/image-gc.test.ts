/**
 * `paddock image gc` against a running Paddock: a layer that lost its last manifest (a deleted
 * snapshot's) stays while a sandbox still reads it lazily from the store, and goes once that
 * sandbox has ended; a node that does not say what its sandboxes read makes gc refuse. The
 * cluster has a store of its own: a collection of the store the other test files share would
 * race their pushes.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, rm, utimes } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Kvm } from '@nats-io/kv';
import test from 'ava';
import { startLocalCluster } from '../ops/local.ts';
import { Buckets, encode, type NodeRecord } from '../protocol/index.ts';
import { ImageStore } from '../runtime/images/store.ts';
import { connectionOf } from '../sdk/client.ts';
import { Paddock } from '../sdk/index.ts';
import { eventually } from './helpers/wait.ts';

const run = promisify(execFile);
const CLI = fileURLToPath(new URL('../ops/bin/paddock.js', import.meta.url));

test('image gc keeps a layer running sandboxes read, whatever names it, and refuses past a silent node', async (t) => {
  const home = await mkdtemp(join(tmpdir(), 'paddock-gc-'));
  const imagesDir = join(home, 'images');
  const cluster = await startLocalCluster({ home, nodes: 2, prefix: `gc${process.pid}n`, imagesDir, env: { PADDOCK_HEARTBEAT_MS: '500' } });
  const pdk = await Paddock.connect({ servers: cluster.url, timeoutMs: 60_000 });
  t.teardown(async () => {
    await pdk.close().catch(() => {});
    await cluster.stop();
    await rm(home, { recursive: true, force: true });
  });
  const store = new ImageStore(imagesDir);
  /** Every blob older than gc's default grace (1 h): only what names or reads a layer keeps it. */
  const age = async () => {
    const old = new Date(Date.now() - 2 * 3600_000);
    for (const b of await store.listBlobs()) await utimes(store.blobPath(b.digest), old, old);
  };
  const gc = async (...flags: string[]) => {
    const r = await run(process.execPath, [CLI, '--nats', cluster.url, 'image', 'gc', '--json', ...flags], { env: { ...process.env, PADDOCK_HOME: home } });
    return JSON.parse(r.stdout) as { removed: string[]; inUse: number };
  };

  const [n1, n2] = cluster.nodes;
  if (!n1 || !n2) return t.fail('two nodes');
  const parent = await pdk.sandboxes.create({ node: n1.id });
  t.is((await parent.exec(['sh', '-c', 'dd if=/dev/urandom of=/work/blob bs=1M count=6 2>/dev/null && md5sum /work/blob > /work/sum'])).exitCode, 0);
  const before = new Set((await store.listBlobs()).map((b) => b.digest));
  const snap = await parent.snapshot();
  const layer = (await store.listBlobs()).map((b) => b.digest).find((d) => !before.has(d));
  t.truthy(layer, "the snapshot's layer is in the store");
  // On the other node, which reads the layer lazily from the store (16 KiB chunks): none of the
  // 6 MiB file yet. (The node that made the snapshot holds the whole layer in its cache.)
  const child = await pdk.sandboxes.create({ fromSnapshot: snap.id, node: n2.id });
  await parent.kill();
  t.true(await pdk.snapshots.delete(snap.id));
  t.false((await store.list()).some((n) => n.includes(snap.id)), 'no manifest names the layer');

  await age();
  const first = await gc();
  t.false(first.removed.includes(layer as string), 'a layer a running sandbox reads stays');
  t.true(first.inUse >= 1);
  const sum = await child.exec(['md5sum', '-c', '/work/sum']);
  t.is(sum.exitCode, 0, `the whole file reads back after the collection: ${sum.stdout}${sum.stderr}`);

  // A node record that is not marked lost, of a node that does not answer: gc refuses.
  const nodes = await new Kvm(connectionOf(pdk)).open(Buckets.nodes);
  const ghost: NodeRecord = { node: `ghost${process.pid}`, backends: ['container'], images: [], capacity: { cpu: 1, memoryMiB: 1024, sandboxes: 1 }, allocated: { cpu: 0, memoryMiB: 0, sandboxes: 0 }, sandboxes: 1, heartbeatMs: 500, ts: Date.now(), state: 'serving' } as NodeRecord;
  await nodes.put(ghost.node, encode(ghost));
  const refused = await t.throwsAsync(gc());
  t.regex(String((refused as { stderr?: string }).stderr), new RegExp(`UNAVAILABLE|${ghost.node}`));
  t.regex(String((refused as { stderr?: string }).stderr), /--force/);
  const forced = await gc('--force');
  t.false(forced.removed.includes(layer as string), 'with --force, the layers of the nodes that answered still stay');
  await nodes.delete(ghost.node);

  // Once its last reader has ended, the layer goes.
  await child.kill();
  const gone = await eventually(async () => {
    await age();
    const r = await gc();
    return r.removed.includes(layer as string) ? r : undefined;
  }, 30_000);
  t.truthy(gone, 'the layer is collected once no sandbox reads it');
  t.false((await store.listBlobs()).some((b) => b.digest === layer));
});
