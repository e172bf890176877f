/**
 * FnCall ready after a first start: a node whose own store lacks the language images makes them
 * in the background (here copied from another store, as from the host's default one), and until
 * they are there an invocation is refused with how long is left, never with a bare "build it".
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'ava';
import { startLocalCluster } from '../ops/local.ts';
import { Paddock, PaddockError } from '../sdk/index.ts';
import { SHARED_IMAGES } from './helpers/cluster.ts';
import { ensureFnImages } from './helpers/fncall.ts';

test.before(async (t) => {
  // The images this node copies: built here the first time on a machine (minutes each).
  t.timeout(20 * 60_000);
  await ensureFnImages();
});

test('a fresh node makes its FnCall images in the background; until then fn calls say how long is left', async (t) => {
  t.timeout(600_000);
  const home = await mkdtemp(join(tmpdir(), 'paddock-fn-first-'));
  const cluster = await startLocalCluster({
    home,
    nodes: 1,
    prefix: `t${process.pid}ff`,
    imagesDir: join(home, 'images'),
    env: { PADDOCK_FN_BUILD: '1', PADDOCK_FN_IMAGES_FROM: SHARED_IMAGES, PADDOCK_HEARTBEAT_MS: '500' },
  });
  const pdk = await Paddock.connect({ servers: cluster.url, timeoutMs: 60_000 });
  t.teardown(async () => {
    await pdk.close().catch(() => {});
    await cluster.stop();
    await rm(home, { recursive: true, force: true });
  });
  const refusals: string[] = [];
  let out = '';
  for (let i = 0; i < 600 && out === ''; i++) {
    try {
      out = (await pdk.fn.invoke({ language: 'python', code: 'print(6 * 7)' })).stdout;
    } catch (e) {
      if (!(e instanceof PaddockError) || e.code !== 'UNAVAILABLE') throw e;
      refusals.push(e.message);
      await new Promise((r) => setTimeout(r, 500));
    }
  }
  t.is(out, '42\n');
  t.log(`${refusals.length} refusal(s) while the images were made; the first: ${refusals[0] ?? '-'}`);
  for (const m of refusals) t.regex(m, /still making \(its first start\): about \d+ s left|FnCall is starting/);
  // The images are made one after the other: gcc's may still be under way once python answers.
  let log = '';
  for (let i = 0; i < 600 && !log.includes(`"msg":"FnCall: the 'gcc' image is ready`); i++) {
    if (i > 0) await new Promise((r) => setTimeout(r, 200));
    log = await readFile(cluster.nodes[0]!.logFile!, 'utf8');
  }
  t.regex(log, /"msg":"FnCall: the 'python' image is ready/);
  t.regex(log, /"msg":"FnCall: the 'gcc' image is ready/);
  t.notRegex(log, /could not start a pool member/, 'a missing image is no warning with a stack per retry');
});
