/**
 * The object-store path: a layer store kept in a bucket-like remote through rclone. Here the remote
 * is a WebDAV server (rclone's own, on loopback: no S3 endpoint is reachable from this machine);
 * an S3 bucket is the same code with `rclone::s3,provider=…:bucket/prefix`.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'ava';
import { copyImage, LocalLayerStore, openStore } from '../runtime/images/remote.ts';
import { ImageStore } from '../runtime/images/store.ts';
import { SHARED_IMAGES, startTestCluster, stopTestCluster } from './helpers/cluster.ts';

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

/** Until the server accepts connections on the port (rclone takes a while to start on a busy machine). */
async function listening(port: number, p: ChildProcess): Promise<void> {
  for (const until = Date.now() + 60_000; ; await new Promise((r) => setTimeout(r, 100))) {
    if (p.exitCode !== null) throw new Error(`rclone serve exited (${p.exitCode}) before it listened`);
    const ok = await new Promise<boolean>((resolve) => {
      const s = connect(port, '127.0.0.1', () => {
        s.destroy();
        resolve(true);
      });
      s.once('error', () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > until) throw new Error(`rclone serve did not listen on ${port} within a minute`);
  }
}

test('rclone: push to an object store, nodes load lazily from it, pull back, gc', async (t) => {
  const bucket = await mkdtemp(join(tmpdir(), 'paddock-bucket-'));
  t.teardown(() => rm(bucket, { recursive: true, force: true }));
  const port = await freePort();
  const dav: ChildProcess = spawn('rclone', ['serve', 'webdav', bucket, '--addr', `127.0.0.1:${port}`], { stdio: 'ignore' });
  t.teardown(() => {
    dav.kill('SIGTERM');
  });
  await listening(port, dav);
  const location = `rclone::webdav,url='http://127.0.0.1:${port}':paddock`;
  const remote = openStore(location);
  t.teardown(() => remote.close());

  const local = new LocalLayerStore(SHARED_IMAGES);
  await new ImageStore(SHARED_IMAGES).init();
  const m = await copyImage('busybox', local, remote);
  t.deepEqual(await remote.list(), ['busybox']);
  t.is((await remote.statBlob(m.layers[0]!.digest))?.size, m.layers[0]!.size);

  const c = await startTestCluster({ env: { PADDOCK_STORE_URL: location } });
  t.teardown(() => stopTestCluster(c));
  const sb = await c.pdk.sandboxes.create({ image: 'busybox' });
  const r = await sb.exec(['echo', 'from the bucket']);
  t.is(Buffer.from(r.stdout).toString(), 'from the bucket\n');
  const info = await c.pdk.nodes.info(c.cluster.nodes[0]!.id);
  t.true((info.layers?.fetchedBytes ?? 0) > 0);
  t.regex(info.layers?.store ?? '', /^http:\/\/127\.0\.0\.1:/);
  await sb.kill();

  const back = new LocalLayerStore(await mkdtemp(join(tmpdir(), 'paddock-pulled-')));
  t.teardown(() => rm(back.location, { recursive: true, force: true }));
  await copyImage('busybox', remote, back);
  t.truthy(await back.statBlob(m.layers[0]!.digest));

  await remote.remove('busybox');
  const gc = await remote.gc(0);
  t.deepEqual(gc.removed, [m.layers[0]!.digest]);
});
