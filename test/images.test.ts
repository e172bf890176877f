/**
 * Images as layers: the store over HTTP, lazy loading through FUSE on a real node, composition,
 * and the bad cases (corrupt bytes, a store that goes away, a full cache).
 */
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestFn } from 'ava';
import anyTest from 'ava';
import { chunkCount, DEFAULT_CHUNK, indexFile, verifyChunk } from '../runtime/images/chunks.ts';
import { httpRequest } from '../runtime/images/http.ts';
import { compose } from '../runtime/images/node-images.ts';
import { copyImage, HttpLayerStore, LocalLayerStore } from '../runtime/images/remote.ts';
import { parseRange, StoreServer } from '../runtime/images/server.ts';
import { type ImageManifest, ImageStore } from '../runtime/images/store.ts';
import { BackendError, type Paddock } from '../sdk/index.ts';
import { type ClusterContext, SHARED_IMAGES, startTestCluster, stopTestCluster } from './helpers/cluster.ts';
import { eventually, nodesHaveImages } from './helpers/wait.ts';

interface Ctx {
  store: ImageStore;
  busybox: ImageManifest;
  scratch: string;
  /** Image names this file made, removed at the end. */
  made: string[];
}
const test = anyTest as TestFn<Ctx>;
const tag = `t${process.pid}`;

/** A one-layer image on top of busybox: `files` become the layer's tree. */
async function layered(t: { context: Ctx }, name: string, files: Record<string, Buffer | string>, extra: Partial<ImageManifest> = {}, store = t.context.store): Promise<ImageManifest> {
  const dir = await mkdtemp(join(t.context.scratch, 'layer-'));
  for (const [p, data] of Object.entries(files)) {
    await mkdir(join(dir, p, '..'), { recursive: true });
    await writeFile(join(dir, p), data);
  }
  const layer = await store.buildLayer(dir);
  const m = await store.putManifest({ ...t.context.busybox, name, layers: [layer], env: [], cwd: '/', ...extra });
  t.context.made.push(name);
  return m;
}

test.before(async (t) => {
  const store = new ImageStore(SHARED_IMAGES);
  await store.init();
  const { ensureBusyboxImage } = await import('../runtime/images/busybox.ts');
  t.context.store = store;
  t.context.busybox = await ensureBusyboxImage(store);
  t.context.scratch = await mkdtemp(join(tmpdir(), 'paddock-images-test-'));
  t.context.made = [];
});

test.after.always(async (t) => {
  for (const n of t.context.made ?? []) await t.context.store.removeManifest(n);
  if (t.context.scratch) await rm(t.context.scratch, { recursive: true, force: true });
});

async function layerStats(pdk: Paddock, node: string) {
  const info = await pdk.nodes.info(node);
  if (!info.layers) throw new Error('no layer stats');
  return info.layers;
}

test('layer digests are reproducible: the same tree gives the same digest, built twice or copied', async (t) => {
  const store = new ImageStore(join(t.context.scratch, 'repro-store'));
  await store.init();
  const tree = async (dir: string) => {
    await mkdir(join(dir, 'sub'), { recursive: true });
    await writeFile(join(dir, 'a.txt'), 'alpha\n');
    await writeFile(join(dir, 'sub', 'b.bin'), Buffer.alloc(70_000, 7));
    await chmod(join(dir, 'sub', 'b.bin'), 0o755);
  };
  const one = join(t.context.scratch, 'repro-1');
  const two = join(t.context.scratch, 'repro-2');
  await tree(one);
  // Another directory, made later, with other mtimes and inode numbers: the same content.
  await new Promise((r) => setTimeout(r, 1100));
  await tree(two);
  const a = await store.buildLayer(one);
  const b = await store.buildLayer(one);
  const c = await store.buildLayer(two);
  t.is(a.digest, b.digest);
  t.is(a.digest, c.digest);
  await writeFile(join(two, 'a.txt'), 'beta\n');
  t.not((await store.buildLayer(two)).digest, a.digest, 'other content, another digest');
});

test('chunk index: every chunk checks, a flipped byte does not', async (t) => {
  const f = join(t.context.scratch, 'blob');
  const data = randomBytes(3 * DEFAULT_CHUNK + 123);
  await writeFile(f, data);
  const { size, index } = await indexFile(f);
  t.is(size, data.length);
  t.is(index.length, chunkCount(size, DEFAULT_CHUNK) * 32);
  t.true(verifyChunk(index, 3, data.subarray(3 * DEFAULT_CHUNK)));
  const bad = Buffer.from(data.subarray(DEFAULT_CHUNK, 2 * DEFAULT_CHUNK));
  bad[7] = (bad[7] ?? 0) ^ 1;
  t.false(verifyChunk(index, 1, bad));
});

test('ranges: one range, suffixes, and unsatisfiable ones', (t) => {
  t.deepEqual(parseRange('bytes=0-9', 100), { start: 0, end: 9 });
  t.deepEqual(parseRange('bytes=90-', 100), { start: 90, end: 99 });
  t.deepEqual(parseRange('bytes=-10', 100), { start: 90, end: 99 });
  t.deepEqual(parseRange('bytes=50-500', 100), { start: 50, end: 99 });
  t.is(parseRange('bytes=100-', 100), 'bad');
  t.is(parseRange('bytes=0-1,5-6', 100), 'bad');
  t.is(parseRange(undefined, 100), null);
});

test('composition: base at the bottom, workspace on top, shared layers once, env merged, workspace cwd', (t) => {
  const l = (c: string) => ({ digest: `sha256:${c.repeat(64)}`, size: 1 });
  const base: ImageManifest = { name: 'b', layers: [l('a')], env: ['PATH=/bin', 'A=1'], cwd: '/', user: { uid: 0, gid: 0 }, init: ['/bin/sleep', 'infinity'] };
  const tk: ImageManifest = { ...base, name: 'tk', layers: [l('a'), l('b')], env: ['A=2'] };
  const ws: ImageManifest = { ...base, name: 'ws', layers: [l('c')], env: [], cwd: '/work' };
  const m = compose(base, tk, ws);
  t.deepEqual(
    m.layers.map((x) => x.digest[7]),
    ['a', 'b', 'c'],
  );
  t.deepEqual(m.env, ['PATH=/bin', 'A=2']);
  t.is(m.cwd, '/work');
  t.deepEqual(m.init, base.init);
});

test('store over HTTP: push, stat, list, pull, range reads, gc; bytes that do not match their digest are refused', async (t) => {
  const remoteDir = await mkdtemp(join(t.context.scratch, 'remote-'));
  const server = new StoreServer(new ImageStore(remoteDir));
  const url = await server.listen();
  t.teardown(() => server.close());
  const remote = new HttpLayerStore(url);
  t.teardown(() => remote.close());
  const local = new LocalLayerStore(SHARED_IMAGES);
  const img = await layered(t, `${tag}-push`, { 'data/x': randomBytes(200_000) });

  await copyImage(img.name, local, remote);
  t.deepEqual(await remote.list(), [img.name]);
  const ref = img.layers[0]!;
  t.is((await remote.statBlob(ref.digest))?.size, ref.size);
  const r = await httpRequest(`${url}/blobs/sha256/${ref.digest.slice(7)}.erofs`, { headers: { range: 'bytes=4096-8191' }, timeoutMs: 5000 });
  t.is(r.status, 206);
  t.is(r.headers['content-range'], `bytes 4096-8191/${ref.size}`);
  const whole = await readFile(t.context.store.blobPath(ref.digest));
  t.deepEqual(r.body, whole.subarray(4096, 8192));

  // Pulling into another directory checks every layer against its digest.
  const pulledDir = await mkdtemp(join(t.context.scratch, 'pulled-'));
  const pulled = new LocalLayerStore(pulledDir);
  await copyImage(img.name, remote, pulled);
  t.deepEqual(await readFile(pulled.store.blobPath(ref.digest)), whole);

  // A push whose bytes are not what the digest says is refused and leaves nothing.
  const liar = `sha256:${'0'.repeat(64)}`;
  const fake = join(t.context.scratch, 'fake');
  await writeFile(fake, randomBytes(10_000));
  await t.throwsAsync(remote.pushBlob({ digest: liar, size: 10_000 }, fake), { message: /digest mismatch/ });
  t.is(await remote.statBlob(liar), null);
  // A manifest naming a layer the store lacks is refused.
  await t.throwsAsync(remote.put({ ...img, name: `${tag}-dangling`, layers: [{ digest: liar, size: 1 }] }), { message: /not in the store/ });

  // gc: referenced layers stay; once the image is gone, its layers go.
  t.deepEqual((await remote.gc(0)).removed, []);
  await remote.remove(img.name);
  const gc = await remote.gc(0);
  t.deepEqual(gc.removed, [ref.digest]);
  t.is(gc.freedBytes, ref.size);
  t.is(await remote.statBlob(ref.digest), null);
});

/** A node that reads from the embedded store, lazily, with a small cache. */
async function lazyCluster(t: { teardown(f: () => Promise<void>): void }, env: Record<string, string> = {}): Promise<ClusterContext> {
  const c = await startTestCluster({ env: { PADDOCK_LAYER_IDLE_MS: '200', ...env } });
  t.teardown(() => stopTestCluster(c));
  return c;
}

test('lazy loading: a sandbox starts having fetched a fraction of its layers; concurrent first reads fetch once', async (t) => {
  const big = randomBytes(4 * 1024 * 1024);
  const img = await layered(t, `${tag}-lazy`, { 'data/big': big, 'data/small': 'hello\n' });
  const c = await lazyCluster(t);
  await nodesHaveImages(c.pdk, ['busybox', img.name]);
  const node = c.cluster.nodes[0]!.id;
  const ws = img.layers[0]!;
  const [a, b] = await Promise.all([c.pdk.sandboxes.create({ image: 'busybox', workspace: img.name }), c.pdk.sandboxes.create({ image: 'busybox', workspace: img.name })]);
  t.like(a.info, { image: 'busybox', workspace: img.name }, 'the record names what the sandbox was composed of');
  const before = (await layerStats(c.pdk, node)).layers.find((l) => l.digest === ws.digest)!;
  t.true(before.fetchedBytes < ws.size / 4, `fetched ${before.fetchedBytes} of ${ws.size} before reading`);

  const reads = await Promise.all([a, b].map((sb) => sb.exec(['sh', '-c', 'md5sum /data/big | cut -c1-32'])));
  const { createHash } = await import('node:crypto');
  for (const r of reads) t.is(Buffer.from(r.stdout).toString().trim(), createHash('md5').update(big).digest('hex'));
  const after = (await layerStats(c.pdk, node)).layers.find((l) => l.digest === ws.digest)!;
  // Each chunk came from the store once, however many readers wanted it at the same time.
  t.true(after.misses <= chunkCount(ws.size, ws.chunk!), `misses ${after.misses}`);
  t.true(after.fetchedBytes <= ws.size + 64 * 1024, `fetched ${after.fetchedBytes} of ${ws.size}`);
  // A kernel read spans several chunks (128 KiB of read-ahead, 16 KiB chunks): those missing come in one range request.
  t.true(after.fetches * 2 <= after.misses, `${after.fetches} range requests for ${after.misses} chunks`);
  t.is(after.errors, 0);
  const stats = await layerStats(c.pdk, node);
  t.is(stats.mode, 'lazy');
  t.true(stats.mounted.some((m) => m.digest === ws.digest && m.sandboxes === 2 && m.lazy));
  await Promise.all([a.kill(), b.kill()]);
});

test('composition: m base updates are m layer builds, and every environment picks the new base up', async (t) => {
  const c = await lazyCluster(t);
  // Its own store object: other tests of this file build layers at the same time.
  const store = new ImageStore(SHARED_IMAGES);
  const envs = 3;
  const updates = 2;
  for (let i = 0; i < envs; i++) await layered(t, `${tag}-ws${i}`, { [`task/${i}.txt`]: `task ${i}\n` }, { cwd: '/task' }, store);
  for (let u = 1; u <= updates; u++) {
    await layered(t, `${tag}-base`, { 'etc/base-version': `v${u}\n` }, {}, store);
    // A node keeps a manifest it read for a moment (a burst of creates reads it once): until then a create may get the old base.
    const fresh = await eventually(async () => {
      const sb = await c.pdk.sandboxes.create({ image: 'busybox', toolkit: `${tag}-base`, workspace: `${tag}-ws0` });
      const out = Buffer.from((await sb.exec(['cat', '/etc/base-version'])).stdout).toString();
      await sb.kill();
      return out === `v${u}\n`;
    });
    t.true(fresh, `the nodes picked base v${u} up`);
    for (let i = 0; i < envs; i++) {
      const sb = await c.pdk.sandboxes.create({ image: 'busybox', toolkit: `${tag}-base`, workspace: `${tag}-ws${i}` });
      const r = await sb.exec(['sh', '-c', `cat /etc/base-version ${i}.txt; pwd`]);
      t.is(Buffer.from(r.stdout).toString(), `v${u}\ntask ${i}\n/task\n`);
      await sb.kill();
    }
  }
  t.is(store.builds, envs + updates);
});

test('an unknown toolkit or workspace is a clear INVALID_SPEC, and nothing starts', async (t) => {
  const c = await lazyCluster(t);
  const err = await t.throwsAsync(c.pdk.sandboxes.create({ image: 'busybox', workspace: `${tag}-nope` }));
  t.is((err as { code?: string }).code, 'INVALID_SPEC');
  t.regex(err?.message ?? '', /nope/);
});

const vmReady = existsSync('/usr/bin/qemu-system-x86_64') && readdirSync('/boot').some((n) => /^vmlinuz-.*-cloud-amd64$/.test(n));
(vmReady ? test : test.skip)('lazy loading for microVMs: the guest reads its layer disks through the same FUSE files, fetched as it reads them', async (t) => {
  const big = randomBytes(4 * 1024 * 1024);
  const img = await layered(t, `${tag}-lazyvm`, { 'data/big': big, 'data/small': 'hello\n' });
  const c = await lazyCluster(t, { PADDOCK_BACKENDS: 'container,microvm' });
  await nodesHaveImages(c.pdk, ['busybox', img.name]);
  const node = c.cluster.nodes[0]!.id;
  const ws = img.layers[0]!;
  const vm = await c.pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 256, image: 'busybox', workspace: img.name });
  t.teardown(() => vm.kill().catch(() => {}));
  const before = (await layerStats(c.pdk, node)).layers.find((l) => l.digest === ws.digest)!;
  t.true(before.fetchedBytes < ws.size / 4, `fetched ${before.fetchedBytes} of ${ws.size} before the guest read its file`);
  t.is((await vm.exec(['cat', '/data/small'])).stdout, 'hello\n');
  const r = await vm.exec(['sh', '-c', 'md5sum /data/big | cut -c1-32']);
  const { createHash } = await import('node:crypto');
  t.is(r.stdout.trim(), createHash('md5').update(big).digest('hex'));
  const after = (await layerStats(c.pdk, node)).layers.find((l) => l.digest === ws.digest)!;
  t.true(after.fetchedBytes >= big.length && after.fetchedBytes <= ws.size + 64 * 1024, `fetched ${after.fetchedBytes} of ${ws.size}`);
  t.is(after.errors, 0);
});

test('bad bytes: eager refuses a corrupt blob before mounting; lazy gives the reader EIO for a corrupt chunk', async (t) => {
  const good = randomBytes(512 * 1024);
  const img = await layered(t, `${tag}-corrupt`, { 'data/x': good });
  const ref = img.layers[0]!;
  // Corrupt the store's copy from byte 256 KiB on (past EROFS's metadata, inside the file data).
  const blob = t.context.store.blobPath(ref.digest);
  const orig = await readFile(blob);
  const bad = Buffer.from(orig);
  for (let i = 256 * 1024; i < bad.length; i++) bad[i] = (bad[i] ?? 0) ^ 0xff;
  await chmod(blob, 0o644);
  await writeFile(blob, bad);
  t.teardown(() => writeFile(blob, orig));

  const eager = await lazyCluster(t, { PADDOCK_LAYER_MODE: 'eager' });
  await nodesHaveImages(eager.pdk, ['busybox', img.name]);
  const e = await t.throwsAsync(eager.pdk.sandboxes.create({ image: 'busybox', workspace: img.name }), { instanceOf: BackendError });
  t.regex(e?.message ?? '', /refusing to mount/);
  const mounts = await readFile(`/proc/${eager.cluster.nodes[0]!.proc.pid}/mountinfo`, 'utf8');
  t.false(mounts.includes(ref.digest.slice(7)), 'the corrupt layer was never mounted');

  const lazy = await lazyCluster(t);
  await nodesHaveImages(lazy.pdk, ['busybox', img.name]);
  const sb = await lazy.pdk.sandboxes.create({ image: 'busybox', workspace: img.name });
  const r = await sb.exec(['dd', 'if=/data/x', 'of=/dev/null', 'bs=65536'], { timeoutMs: 20_000 });
  t.not(r.exitCode, 0);
  t.regex(Buffer.from(r.stderr).toString(), /Input\/output error|I\/O error/);
  const st = (await layerStats(lazy.pdk, lazy.cluster.nodes[0]!.id)).layers.find((l) => l.digest === ref.digest)!;
  t.true(st.corrupt >= 1);
  await sb.kill();
});

test('the store going away mid-read gives the reader EIO within the timeout and the node keeps serving', async (t) => {
  const img = await layered(t, `${tag}-away`, { 'data/late': randomBytes(1024 * 1024) });
  const storeDir = await mkdtemp(join(t.context.scratch, 'away-'));
  await copyImage('busybox', new LocalLayerStore(SHARED_IMAGES), new LocalLayerStore(storeDir));
  await copyImage(img.name, new LocalLayerStore(SHARED_IMAGES), new LocalLayerStore(storeDir));
  const server = new StoreServer(new ImageStore(storeDir));
  const url = await server.listen();
  t.teardown(() => server.close());
  const c = await lazyCluster(t, { PADDOCK_STORE_URL: url, PADDOCK_STORE_TIMEOUT_MS: '1000' });
  // A second image the node lists but has never fetched.
  const img2 = await layered(t, `${tag}-away2`, { 'x/y': 'z' });
  await copyImage(img2.name, new LocalLayerStore(SHARED_IMAGES), new LocalLayerStore(storeDir));
  await nodesHaveImages(c.pdk, ['busybox', img.name, img2.name]);
  const sb = await c.pdk.sandboxes.create({ image: 'busybox', workspace: img.name });
  // The tools the test runs must be whole on the node before the store goes.
  t.is((await sb.exec(['dd', 'if=/bin/busybox', 'of=/dev/null', 'bs=65536'])).exitCode, 0);
  await server.close();
  // dd reads with read(2): the error arrives as EIO (a reader that mmaps the file gets SIGBUS).
  const r = await sb.exec(['dd', 'if=/data/late', 'of=/dev/null', 'bs=65536'], { timeoutMs: 30_000 });
  t.not(r.exitCode, 0, JSON.stringify({ ...r, stdout: r.stdout.length }));
  t.regex(Buffer.from(r.stderr).toString(), /Input\/output error|I\/O error/, `exit ${r.exitCode} ${r.signal ?? ''} ${r.durationMs} ms`);
  const st = await layerStats(c.pdk, c.cluster.nodes[0]!.id);
  t.true(st.layers.some((l) => l.errors > 0));
  // A new sandbox needing a layer the node never fetched fails with the store named as the cause.
  const e = await t.throwsAsync(c.pdk.sandboxes.create({ image: 'busybox', workspace: img2.name }));
  t.regex(e?.message ?? '', /layer store .* cannot be read|unreachable/);
  t.is((await sb.exec(['echo', 'alive'])).exitCode, 0);
  await sb.kill();
});

test('a full cache evicts layers no sandbox uses instead of failing', async (t) => {
  const one = await layered(t, `${tag}-evict1`, { 'd/a': randomBytes(1536 * 1024) });
  const two = await layered(t, `${tag}-evict2`, { 'd/b': randomBytes(1536 * 1024) });
  // Room for busybox (2 MiB) and one of the two, not both.
  const c = await lazyCluster(t, { PADDOCK_LAYER_CACHE_BYTES: String(4 * 1024 * 1024) });
  await nodesHaveImages(c.pdk, ['busybox', one.name, two.name]);
  const node = c.cluster.nodes[0]!.id;
  for (const img of [one, two, one]) {
    const sb = await c.pdk.sandboxes.create({ image: 'busybox', workspace: img.name });
    const r = await sb.exec(['sh', '-c', 'cat /d/* | wc -c']);
    t.is(Buffer.from(r.stdout).toString().trim(), String(1536 * 1024));
    await sb.kill();
    await new Promise((r2) => setTimeout(r2, 400));
  }
  const st = await layerStats(c.pdk, node);
  t.true(st.evictions >= 1, `evictions ${st.evictions}`);
  t.true(st.cachedBytes <= st.budgetBytes);
});
