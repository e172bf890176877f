/**
 * The node's process spawner (runtime/spawner.c and .ts), against the real program: exit codes and
 * signals, captured and relayed output, stdin from a file, the reasons a command never ran, its
 * own mount namespace, kills and timeouts, and its death in the middle of commands.
 */
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { promisify } from 'node:util';
import test from 'ava';
import { loadConfig } from '../runtime/config.ts';
import { ByteBudget } from '../runtime/limit.ts';
import { Frames, resolveProgram, Spawner } from '../runtime/spawner.ts';

const sh = promisify(execFile);
const binDir = loadConfig().binDir;

async function spawner(t: { teardown: (fn: () => void) => void }): Promise<Spawner> {
  const s = await Spawner.build(binDir);
  t.teardown(() => s.close());
  return s;
}

test('exit codes, signals, and stderr captured or written to a file', async (t) => {
  const s = await spawner(t);
  t.deepEqual(await s.run({ argv: ['true'] }), { code: 0, stderr: '' });
  t.is((await s.run({ argv: ['sh', '-c', 'exit 7'] })).code, 7);
  t.is((await s.run({ argv: ['sh', '-c', 'kill -TERM $$'] })).code, 128 + 15);
  t.deepEqual(await s.run({ argv: ['sh', '-c', 'echo oops >&2; exit 1'], captureStderr: true }), { code: 1, stderr: 'oops\n' });
  // Capture keeps 64 KiB and drains the rest, so a chatty command cannot block on its pipe.
  const big = await s.run({ argv: ['sh', '-c', 'head -c 300000 /dev/zero | tr "\\0" x >&2'], captureStderr: true });
  t.is(big.code, 0);
  t.is(big.stderr.length, 65536);
  const dir = await mkdtemp(join(tmpdir(), 'paddock-spawn-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  await s.run({ argv: ['sh', '-c', 'echo out; echo err >&2'], stdoutFile: join(dir, 'o'), stderrFile: join(dir, 'e') });
  t.is(await readFile(join(dir, 'o'), 'utf8'), 'out\n');
  t.is(await readFile(join(dir, 'e'), 'utf8'), 'err\n');
  // The environment: given, it is all the command has; absent, the node's.
  t.is((await s.run({ argv: ['sh', '-c', 'test "$A" = 1 && test -z "$HOME"'], env: { A: '1', PATH: '/usr/bin:/bin' } })).code, 0);
});

test('relayed output arrives as it comes, in order, with stdin from a file; closed follows the exit', async (t) => {
  const s = await spawner(t);
  const dir = await mkdtemp(join(tmpdir(), 'paddock-spawn-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  await writeFile(join(dir, 'in'), 'hello\n');
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  const c = s.start({ argv: ['sh', '-c', 'cat; echo e >&2; head -c 200000 /dev/zero'], stdinFile: join(dir, 'in'), onOutput: (w, b) => (w === 'out' ? out : err).push(b) });
  t.deepEqual(await c.exited, { code: 0, stderr: '' });
  await c.closed;
  // Chunks may split or merge as the pipes fill; the bytes and their order are what count.
  t.deepEqual(Buffer.concat(out), Buffer.concat([Buffer.from('hello\n'), Buffer.alloc(200000)]));
  t.is(Buffer.concat(err).toString(), 'e\n');
  t.true(out.length > 1, 'more than one chunk: output is relayed as it comes, not at the end');

  // A background child holding the pipes: the exit comes first; release stops waiting for it.
  const bg = s.start({ argv: ['sh', '-c', 'sleep 30 & echo started'], onOutput: () => {} });
  t.is((await bg.exited).code, 0);
  const closedEarly = await Promise.race([bg.closed.then(() => true), new Promise((r) => setTimeout(() => r(false), 200))]);
  t.false(closedEarly);
  bg.release();
  await bg.closed;
  await sh('pkill', ['-f', '^sleep 30$']).catch(() => {});
});

test('held output is not read: the command blocks on its full pipe until it is let go, and nothing is lost', async (t) => {
  const s = await spawner(t);
  let got = 0;
  // 1 MiB: far more than two pipes hold, so the command cannot finish while held.
  const c = s.start({ argv: ['sh', '-c', 'head -c 1048576 /dev/zero'], onOutput: (_, b) => (got += b.length) });
  c.holdOutput(true);
  const early = await Promise.race([c.exited.then(() => 'exited'), new Promise((r) => setTimeout(() => r('blocked'), 1000))]);
  t.is(early, 'blocked', 'a held command waits on its pipe');
  t.true(got < 1048576, `only what came before the hold: ${got}`);
  c.holdOutput(false);
  t.is((await c.exited).code, 0);
  await c.closed;
  t.is(got, 1048576);
});

test('messages are cut whole from reads however they fall: a header or a body across reads, empty bodies, several in one read', (t) => {
  const msgs: Array<[string, string, number]> = [
    ['1 o 0', 'x'.repeat(70_000), 0],
    ['1 E 0', '', 0],
    ['2 x 0', 'done', 0],
    ['1 o 0', 'abc\n', 0],
  ];
  const stream = Buffer.concat(msgs.map(([h, b]) => Buffer.concat([Buffer.from(`${h} ${Buffer.byteLength(b)}\n`), Buffer.from(b)])));
  // Every cut of the stream into three reads (sampled), one byte at a time, and the whole at once.
  const cuts: number[][] = [[], Array.from({ length: stream.length - 1 }, (_, i) => i + 1)];
  for (let a = 1; a < 40; a++) for (const b of [a + 1, 70_003, 70_012, 70_020, stream.length - 3]) if (b > a && b < stream.length) cuts.push([a, b]);
  for (const cut of cuts) {
    const got: Array<[string, string]> = [];
    const f = new Frames((head, body) => got.push([head, body.toString()]));
    let from = 0;
    for (const c of [...cut, stream.length]) {
      f.feed(stream.subarray(from, c));
      from = c;
    }
    t.deepEqual(
      got,
      msgs.map(([h, b]) => [`${h} ${Buffer.byteLength(b)}`, b]),
      `cut at ${cut.length > 3 ? 'every byte' : cut.join(',')}`,
    );
  }
});

test('byte budgets: a burst at once, then the rate; keys apart', (t) => {
  const b = new ByteBudget(1000, 500);
  t.is(b.spend('a', 500, 0), 0);
  t.is(b.spend('a', 100, 0), 100, '100 bytes past the burst wait 100 ms at 1,000 bytes/s');
  t.is(b.spend('b', 400, 0), 0, 'another key has its own burst');
  t.is(b.spend('a', 0, 100), 0, 'refilled after the wait');
  t.is(b.spend('a', 100, 1000), 0, 'a full bucket holds no more than the burst');
  t.is(b.spend('a', 500, 1000), 100);
});

test('a command that never ran says why: exec, setup, and bad arguments', async (t) => {
  const s = await spawner(t);
  await t.throwsAsync(s.run({ argv: ['/no/such/program'] }), { message: /exec \/no\/such\/program: No such file or directory/ });
  await t.throwsAsync(s.run({ argv: ['true'], stdinFile: '/no/such/file' }), { message: /open \/no\/such\/file: No such file or directory/ });
  await t.throwsAsync(s.run({ argv: ['true'], stderrFile: '/no/such/dir/err' }), { message: /open \/no\/such\/dir\/err/ });
  await t.throwsAsync(s.run({ argv: ['echo', 'a\0b'] }), { message: /NUL byte/ });
  await t.throwsAsync(s.run({ argv: ['echo', 'x'.repeat(2 << 20)] }), { message: /too long for the spawner/ });
  await t.throwsAsync(s.run({ argv: ['echo', ...Array.from({ length: 9000 }, () => 'a')] }), { message: /too long for the spawner/ });
  // And it keeps serving.
  t.is((await s.run({ argv: ['true'] })).code, 0);
});

test('its own mount namespace: the mounts are the command\'s alone, and a failed mount says which', async (t) => {
  const s = await spawner(t);
  const dir = await mkdtemp(join(tmpdir(), 'paddock-spawn-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const lower = join(dir, 'lower');
  const rootfs = join(dir, 'rootfs');
  await mkdir(lower);
  await mkdir(rootfs);
  await writeFile(join(lower, 'f'), 'from the layer');
  // The layer is seen through an idmapped clone (l0 in the disk): its root-owned file belongs to the range 12345…
  // The namespace's maker sets its /proc/sys/user limits; one this kernel lacks is passed over.
  const ucounts = 'max_inotify_instances=7,max_fanotify_groups=0,max_no_such_counter=1';
  const mounts = { disk: join(dir, 'disk'), tmpfsOptions: 'size=1m,mode=0700', rootUid: 12345, idCount: 65536, msgqueueBytes: 65536, sigpending: 1024, ucounts, layers: [lower], overlayOptions: 'lowerdir=l0,upperdir=upper,workdir=work', rootfs };
  const userns = join(dir, 'disk/userns');
  const r = await s.run({ argv: ['sh', '-c', `cat ${rootfs}/f && stat -c '%u %g' ${join(dir, 'disk/upper')} ${rootfs}/f >&2 && grep -c ' - overlay .*lowerdir=l0,' /proc/self/mountinfo >&2 && grep -c '/disk/userns .* - nsfs ' /proc/self/mountinfo >&2 && nsenter --user=${userns} cat /proc/sys/user/max_inotify_instances >&2 && cat /proc/sys/user/max_inotify_instances >&2`], mounts, captureStderr: true, stdoutFile: join(dir, 'out') });
  t.is(r.code, 0, r.stderr);
  t.is(await readFile(join(dir, 'out'), 'utf8'), 'from the layer');
  const hostInstances = (await readFile('/proc/sys/user/max_inotify_instances', 'utf8')).trim();
  t.deepEqual(r.stderr.trim().split('\n'), ['12345 12345', '12345 12345', '1', '1', '7', hostInstances]);
  // A limit that is not name=value fails the run, naming it, before the command starts.
  await t.throwsAsync(s.run({ argv: ['true'], mounts: { ...mounts, disk: join(dir, 'disk2'), ucounts: 'max_inotify_instances' } }), { message: /bad limit max_inotify_instances/ });
  // An id map without a size, or a layer list that runs past the request, is refused whole.
  await t.throwsAsync(s.run({ argv: ['true'], mounts: { ...mounts, idCount: 0 } }), { message: /malformed request/ });
  // Nothing of it is in our namespace.
  t.false((await readFile('/proc/self/mountinfo', 'utf8')).includes(rootfs));
  // The disk directory exists now: mkdir fails, and the message names it.
  await t.throwsAsync(s.run({ argv: ['true'], mounts }), { message: /mkdir .*disk: File exists/ });
});

test('a sealed program runs from its in-memory copy, which cannot be written; other programs run from disk', async (t) => {
  const shell = resolveProgram('sh');
  if (!shell) return t.fail('no sh on PATH');
  t.is(resolveProgram('no-such-program-here'), undefined);
  const s = await Spawner.build(binDir, { seal: shell });
  t.teardown(() => s.close());
  const out = async (argv: string[]) => {
    const chunks: Buffer[] = [];
    const c = s.start({ argv, onOutput: (_w, b) => chunks.push(b) });
    const { code } = await c.exited;
    await c.closed;
    return { code, text: Buffer.concat(chunks).toString().trim() };
  };
  t.deepEqual(await out([shell, '-c', 'readlink /proc/$$/exe']), { code: 0, text: `/memfd:${basename(shell)} (deleted)` });
  const write = await out([shell, '-c', 'echo x >> /proc/$$/exe && echo written']);
  t.not(write.text, 'written');
  t.deepEqual(await out(['readlink', '/proc/self/exe']), { code: 0, text: resolveProgram('readlink') ?? '' });
});

test('kill, timeout, and a spawner that dies mid-command: the command fails clearly and the next one runs', async (t) => {
  const s = await spawner(t);
  const c = s.start({ argv: ['sleep', '30'] });
  c.kill(15);
  t.is((await c.exited).code, 128 + 15);
  t.is((await s.run({ argv: ['sleep', '30'], timeoutMs: 100 })).code, 128 + 9);

  const slow = s.run({ argv: ['sleep', '3'] });
  const pid = s.pid;
  if (pid === undefined) return t.fail('the spawner has no pid while a command runs');
  process.kill(pid, 'SIGKILL');
  await t.throwsAsync(slow, { message: /process spawner exited/ });
  t.is((await s.run({ argv: ['true'] })).code, 0);
});
