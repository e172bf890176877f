/** The simulated backend's own behaviour, without a node (the contract test drives it through one). */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'ava';
import { validateSpec } from '../protocol/index.ts';
import { parseLatencies, SimBackend } from '../runtime/sim/backend.ts';
import { parse } from '../runtime/sim/script.ts';

async function sim() {
  const dir = await mkdtemp(join(tmpdir(), 'paddock-sim-'));
  const b = new SimBackend({ nodeDir: dir });
  return { b, done: () => rm(dir, { recursive: true, force: true }) };
}

const run = (b: SimBackend, id: string, script: string, o: { timeoutMs?: number; maxOutputBytes?: number } = {}) =>
  b.exec(id, { cmd: ['sh', '-c', script], timeoutMs: o.timeoutMs ?? 5000, maxOutputBytes: o.maxOutputBytes ?? 1 << 20 });

test('script: statements, quotes, redirections', (t) => {
  t.deepEqual(
    parse(`echo 'a b' "c";exit 2 && true || false >&2`).map((s) => [s.words, s.sep, s.to]),
    [
      [['echo', 'a b', 'c'], ';', undefined],
      [['exit', '2'], '&&', undefined],
      [['true'], '||', undefined],
      [['false'], ';', 'err'],
    ],
  );
  t.deepEqual(parse('echo x > /tmp/f')[0]?.to, { path: '/tmp/f', append: false });
});

test('exec: echo, exit codes, && and ||, files written by redirection, unknown commands', async (t) => {
  const { b, done } = await sim();
  t.teardown(done);
  await b.create('s1', validateSpec({ backend: 'sim' }));
  const r = await run(b, 's1', 'echo hi; false || echo fallback; false && echo never; echo -n x > /tmp/f; echo y >> /tmp/f; cat /tmp/f; nosuch; exit 7');
  t.is(r.stdout.toString(), 'hi\nfallback\nxy\n');
  t.regex(r.stderr.toString(), /nosuch: command not found/);
  t.is(r.exitCode, 7);
  t.is(Buffer.from((await b.files('s1').read('/tmp/f')).data).toString(), 'xy\n');
  t.is((await b.exec('s1', { cmd: ['printenv', 'HOME'], env: { HOME: '/root' }, timeoutMs: 1000, maxOutputBytes: 100 })).stdout.toString(), '/root\n');
});

test('exec: sleeps honour the timeout and cancel; output sizes honour the cap', async (t) => {
  const { b, done } = await sim();
  t.teardown(done);
  await b.create('s1', validateSpec({ backend: 'sim' }));
  const slow = await run(b, 's1', 'echo before; sleep 10; echo after', { timeoutMs: 50 });
  t.true(slow.timedOut);
  t.is(slow.verdict, 'TIMEOUT');
  t.is(slow.stdout.toString(), 'before\n');
  const ctl = new AbortController();
  const p = b.exec('s1', { cmd: ['sleep', '10'], timeoutMs: 60_000, maxOutputBytes: 10, signal: ctl.signal });
  ctl.abort();
  t.is((await p).exitCode, 137);
  const big = await run(b, 's1', 'out 1m; echo unreachable', { maxOutputBytes: 4096 });
  t.true(big.truncated);
  t.is(big.stdout.length, 4096);
  t.is(big.verdict, 'OUTPUT_LIMIT');
  t.is((await run(b, 's1', 'err 3k')).stderr.length, 3072);
});

test('files: in memory, bounded by the sandbox disk; fork copies them, later writes stay apart', async (t) => {
  const { b, done } = await sim();
  t.teardown(done);
  await b.create('s1', validateSpec({ backend: 'sim', diskMiB: 16 }));
  const f = b.files('s1');
  await f.write('/work/a.txt', Buffer.from('one'));
  await f.write('/work/a.txt', Buffer.from('ONE'), { offset: 0 });
  t.deepEqual((await f.list('/work')).map((e) => e.name), ['a.txt']);
  const mib = new Uint8Array(1024 * 1024);
  for (let i = 0; i < 15; i++) await f.write(`/fill/${i}`, mib);
  await t.throwsAsync(f.write('/fill/last', mib), { message: /disk of 16777216 bytes is full/ });
  await b.fork('s1', 's2', validateSpec({ backend: 'sim' }));
  await b.files('s2').write('/work/a.txt', Buffer.from('two'));
  t.is(Buffer.from((await f.read('/work/a.txt')).data).toString(), 'ONE');
  await t.throwsAsync(f.remove('/work', false), { message: /not empty/ });
  await f.remove('/work', true);
  await t.throwsAsync(f.read('/work/a.txt'), { message: /no such file/ });
});

test('lifecycle: state, stats, idempotent destroy, leftovers after a crash', async (t) => {
  const { b, done } = await sim();
  t.teardown(done);
  await b.create('s1', validateSpec({ backend: 'sim', memoryMiB: 100 }));
  t.true(((await b.stats('s1')).memoryBytes ?? 0) > 0);
  await b.pause('s1');
  await t.throwsAsync(run(b, 's1', 'true'), { message: /paused/ });
  const h = await b.hibernate('s1');
  t.true((h.releasedBytes ?? 0) > 0);
  t.is((await b.stats('s1')).memoryBytes, 0);
  await b.restore('s1');
  await b.destroy('s1');
  await b.destroy('s1');
  await b.create('s3', validateSpec({ backend: 'sim' }));
  // A new process on the same node directory (the node crashed) finds s3's marker.
  const after = new SimBackend({ nodeDir: (b as unknown as { o: { nodeDir: string } }).o.nodeDir });
  t.deepEqual(await after.recover(), ['s3']);
  t.deepEqual(await after.recover(), []);
});

test('latencies: parsed per verb, unknown verbs refused', (t) => {
  t.deepEqual(parseLatencies('create=15, exec=1.5'), { create: 15, exec: 1.5 });
  t.throws(() => parseLatencies('boot=3'), { message: /expected verb=ms/ });
});
