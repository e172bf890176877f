/**
 * The image benchmark's shaped link at small size: a node in a network namespace of its own loads
 * its layers lazily from a store in another, across a tbf-shaped veth; the namespaces are gone
 * when the run ends, when it is interrupted, and (left by a run killed outright) at the next start.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import { linkNamespaces } from '../ops/bench/link.ts';
import { run } from '../runtime/proc.ts';
import { SHARED_IMAGES } from './helpers/cluster.ts';

const BENCH = fileURLToPath(new URL('../ops/bench/images.ts', import.meta.url));

function bench(args: string[]): { child: ChildProcess; stdout: () => string; stderr: () => string; exited: Promise<number> } {
  const child = spawn(process.execPath, ['--import', 'tsx', BENCH, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, PADDOCK_IMAGES_DIR: SHARED_IMAGES } });
  let out = '';
  let err = '';
  child.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  child.stderr?.on('data', (d: Buffer) => {
    err += d.toString();
  });
  const exited = new Promise<number>((r) => child.on('exit', (c, s) => r(c ?? (s ? 128 : 1))));
  return { child, stdout: () => out, stderr: () => err, exited };
}

const ofPid = async (pid: number | undefined) => (await linkNamespaces()).filter((n) => n.startsWith(`pdklink-${pid}-`));

async function deadPid(): Promise<number> {
  const c = spawn('true');
  await new Promise((r) => c.on('exit', r));
  return c.pid as number;
}

test.serial('lazy loading works across a 1 Gbit/s link; its namespaces and a killed run’s are gone afterwards', async (t) => {
  t.timeout(300_000);
  // What a run killed with SIGKILL leaves: a namespace pair named after a process that is gone.
  const dead = await deadPid();
  for (const side of ['s', 'c']) await run('ip', ['netns', 'add', `pdklink-${dead}-0-${side}`]);
  const b = bench(['--n', '3', '--image', 'busybox', '--link', '1gbit', '--modes', 'lazy', '--json']);
  const code = await b.exited;
  t.is(code, 0, b.stderr());
  const last = b.stdout().trim().split('\n').pop() ?? '';
  const r = JSON.parse(last) as { link: string; lazy: { failures: number; fetchedBytes: number; linkBytes: number; readBytes: number; wallMs: number; diskWriteBytes: number } };
  t.is(r.link, '1gbit');
  t.is(r.lazy.failures, 0);
  t.true(r.lazy.fetchedBytes > 0, 'the node fetched layer bytes');
  t.true(r.lazy.readBytes > 0, 'the kernel read through the lazy loader');
  // Everything fetched came over the veth (plus TCP/IP and HTTP overhead).
  t.true(r.lazy.linkBytes >= r.lazy.fetchedBytes, `link ${r.lazy.linkBytes} < fetched ${r.lazy.fetchedBytes}`);
  t.deepEqual(await ofPid(b.child.pid), []);
  t.deepEqual(await ofPid(dead), [], 'the killed run’s namespaces were removed');
  t.regex(b.stderr(), new RegExp(`removed \\d+ network namespace\\(s\\) an earlier run left: .*pdklink-${dead}-0-s`));
});

test.serial('an interrupted run removes its namespaces', async (t) => {
  t.timeout(300_000);
  const b = bench(['--n', '2', '--image', 'busybox', '--link', '10gbit', '--modes', 'lazy,eager,local']);
  // Interrupt once the node is up behind the link.
  for (let i = 0; i < 600 && !b.stderr().includes('a) lazy'); i++) await new Promise((r) => setTimeout(r, 100));
  t.true(b.stderr().includes('a) lazy'), b.stderr());
  t.is((await ofPid(b.child.pid)).length, 2);
  b.child.kill('SIGINT');
  const code = await b.exited;
  t.not(code, 0);
  t.deepEqual(await ofPid(b.child.pid), []);
  t.regex(b.stderr(), /SIGINT: cleaning up/);
});

test('a link rate it cannot make is a usage error, before any namespace is made', async (t) => {
  const b = bench(['--link', '5gbit']);
  t.is(await b.exited, 1);
  t.regex(b.stderr(), /--link: one of 1gbit, 10gbit, none, got 5gbit/);
  t.deepEqual(await ofPid(b.child.pid), []);
});
