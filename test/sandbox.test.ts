import { readFile } from 'node:fs/promises';
import { ForbiddenError, InvalidRequestError, NotFoundError } from '../sdk/index.ts';
import { clusterTest, nodeRunPath } from './helpers/cluster.ts';
import { eventually } from './helpers/wait.ts';

const byString = (a: string, b: string) => a.localeCompare(b);
const test = clusterTest();

test('create, exec, kill: a trainer drives a container sandbox end to end', async (t) => {
  const { pdk } = t.context;
  const sb = await pdk.sandboxes.create({ backend: 'container', image: 'busybox', cpu: 1, memoryMiB: 256, ttlSec: 600, labels: { job: 'spine' } });
  t.is(sb.info.state, 'running');
  t.regex(sb.id, /^sb-[a-z2-7]{16}$/);
  const r = await sb.exec(['sh', '-c', 'echo hi; echo oops >&2; exit 3'], { timeoutMs: 5000 });
  t.is(r.exitCode, 3);
  t.is(r.stdout, 'hi\n');
  t.is(r.stderr, 'oops\n');
  t.false(r.truncated);
  t.false(r.timedOut);
  t.true(r.durationMs > 0);
  const killed = await sb.kill();
  t.is(killed.state, 'stopped');
  t.is(killed.reason, 'killed');
  // Gone for good: exec on it says so, get still reports how it ended.
  const err = await t.throwsAsync(sb.exec(['true']), { instanceOf: NotFoundError });
  t.is(err?.code, 'NOT_FOUND');
  t.is((await pdk.sandboxes.get(sb.id)).info.state, 'stopped');
  // Killing twice is harmless.
  t.is((await sb.kill()).state, 'stopped');
});

test('exec takes cwd, env and stdin; a string runs under sh -c', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ env: { FROM_SPEC: 'spec' } });
  t.teardown(() => sb.kill());
  const r = await sb.exec(['sh', '-c', 'pwd; echo $FROM_SPEC $FROM_EXEC; cat'], { cwd: '/tmp', env: { FROM_EXEC: 'exec' }, stdin: 'piped\n' });
  t.is(r.stdout, '/tmp\nspec exec\npiped\n');
  t.is((await sb.exec('echo $((6*7))')).stdout, '42\n');
  // The image's PATH survives an exec that sets its own env.
  t.is((await sb.exec(['sh', '-c', 'echo $PATH'], { env: { X: '1' } })).exitCode, 0);
  const missing = await sb.exec(['no-such-program']);
  t.not(missing.exitCode, 0);
});

test('output past the cap comes back truncated, and the command is killed', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const r = await sb.exec(['yes'], { timeoutMs: 20_000 });
  t.true(r.truncated);
  t.false(r.timedOut);
  t.is(r.stdout.length, 1024 * 1024);
  t.is(r.signal, 'SIGKILL');
  const small = await sb.exec(['sh', '-c', 'yes | head -c 5000; echo done >&2'], { maxOutputBytes: 100 });
  t.true(small.truncated);
  t.is(small.stdout.length, 100);
  // Nothing of `yes` survives in the sandbox (its zombie lasts until the sandbox's init reaps it).
  let ps = '';
  for (let i = 0; i < 50; i++) {
    ps = (await sb.exec(['ps'])).stdout;
    if (!/\byes\b/.test(ps)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  t.notRegex(ps, /\byes\b/);
});

test('a timeout kills the whole process tree and returns the partial output', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  // Long enough for `echo` to run however slow this host is: scaled by what an exec takes here
  // (a loaded 2-core machine once took over 2 s to start one). The sleeps outlast it by far.
  const probe = await sb.exec(['echo']);
  // Capped well under the sleeps: a slow first exec must not stretch the timeout past them.
  const timeoutMs = Math.min(60_000, Math.max(2000, Math.ceil(20 * probe.durationMs)));
  const r = await sb.exec(['sh', '-c', 'echo started; sleep 600 & sleep 601; echo never'], { timeoutMs });
  t.true(r.timedOut);
  t.is(r.stdout, 'started\n');
  t.is(r.exitCode, 137);
  t.true(r.durationMs >= timeoutMs, `durationMs ${r.durationMs}`);
  const ps = await sb.exec(['ps']);
  t.notRegex(ps.stdout, /sleep 60[01]/);
});

test('execStream yields output as it comes, then the exit', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const seen: string[] = [];
  let exit: number | undefined;
  for await (const ev of sb.execStream(['sh', '-c', 'echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three; exit 5'])) {
    if (ev.type === 'exit') exit = ev.exitCode;
    else if (ev.type !== 'gap') seen.push(`${ev.type}:${ev.text.trim()}`);
  }
  t.deepEqual(seen, ['stdout:one', 'stderr:two', 'stdout:three']);
  t.is(exit, 5);
});

test('a streamed exec carries every byte in order, each stream apart, over many messages', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  // ~2.6 MiB of stdout in pipe-sized writes, read by the node across many reads and sent in
  // several events; stderr between them.
  const n = 400_000;
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  for await (const ev of sb.execStream(['sh', '-c', `seq 1 ${n}; seq 1 1000 >&2; seq ${n + 1} ${n + 1000}`], { maxOutputBytes: 8 << 20 })) {
    if (ev.type === 'stdout') out.push(Buffer.from(ev.data));
    if (ev.type === 'stderr') err.push(Buffer.from(ev.data));
  }
  const lines = (from: number, to: number) => `${Array.from({ length: to - from + 1 }, (_, i) => from + i).join('\n')}\n`;
  const got = Buffer.concat(out);
  const want = Buffer.from(lines(1, n + 1000));
  t.is(got.length, want.length);
  t.true(got.equals(want), 'stdout byte for byte');
  t.is(Buffer.concat(err).toString(), lines(1, 1000));
});

test('a streamed exec whose reader waits holds its command back; once it reads, every byte comes', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const big = 48 * 1024 * 1024;
  let n = 0;
  let stalled = false;
  let exit: number | undefined;
  for await (const ev of sb.execStream(['sh', '-c', `head -c ${big} /dev/zero; touch /tmp/wrote`], { maxOutputBytes: big })) {
    if (ev.type === 'exit') exit = ev.exitCode;
    if (ev.type !== 'stdout') continue;
    n += ev.data.length;
    if (stalled) continue;
    stalled = true;
    // 5 s unread: the node's output budget alone (16 MiB/s after a 16 MiB burst) would let it all out.
    await new Promise((r) => setTimeout(r, 5000));
    t.is((await sb.exec(['test', '-e', '/tmp/wrote'])).exitCode, 1, 'the command still waits on its pipe');
  }
  t.is(exit, 0);
  t.is(n, big);
  t.is((await sb.exec(['test', '-e', '/tmp/wrote'])).exitCode, 0);
});

test('breaking out of execStream kills the command', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  for await (const ev of sb.execStream(['sh', '-c', 'echo tick; exec sleep 123'])) {
    if (ev.type === 'stdout') break;
  }
  // The cancel is asynchronous: wait for the sleeper to go.
  let left = '';
  for (let i = 0; i < 50; i++) {
    left = (await sb.exec(['ps'])).stdout;
    if (!/sleep 123/.test(left)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  t.notRegex(left, /sleep 123/);
});

test('files: write, read, list, remove; parents are created; big files move in chunks', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  await sb.files.write('/work/a.py', 'print("hi")\n');
  t.is(await sb.files.readText('/work/a.py'), 'print("hi")\n');
  t.is((await sb.exec(['cat', '/work/a.py'])).stdout, 'print("hi")\n');
  const bytes = new Uint8Array(3 * 1024 * 1024 + 17).map((_, i) => (i * 31) % 256);
  await sb.files.write('/deep/er/blob.bin', bytes);
  t.deepEqual(new Uint8Array(await sb.files.read('/deep/er/blob.bin')), bytes);
  t.is((await sb.exec(['sh', '-c', 'wc -c < /deep/er/blob.bin'])).stdout.trim(), String(bytes.length));
  const entries = await sb.files.list('/work');
  t.deepEqual(
    entries.map((e) => [e.name, e.type, e.size]),
    [['a.py', 'file', 12]],
  );
  await sb.files.write('/work/x', 'x', { mode: 0o755 });
  t.is((await sb.files.list('/work')).find((e) => e.name === 'x')?.mode, 0o755);
  await sb.files.remove('/deep', { recursive: true });
  await t.throwsAsync(sb.files.read('/deep/er/blob.bin'), { instanceOf: NotFoundError });
  await t.throwsAsync(sb.files.list('/nope'), { instanceOf: NotFoundError });
  await t.throwsAsync(sb.files.read('/work'), { instanceOf: InvalidRequestError });
  // Files written by exec are visible to the API and the other way round.
  await sb.exec(['sh', '-c', 'echo from-exec > /tmp/e.txt']);
  t.is(await sb.files.readText('/tmp/e.txt'), 'from-exec\n');
});

test('files cannot leave the sandbox: symlinks, .., FIFOs', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  await sb.exec(['sh', '-c', 'ln -s / /tmp/root; ln -s ../../../../etc/hostname /tmp/up; ln -s /etc /tmp/etc; mkfifo /tmp/fifo']);
  // Resolved inside the sandbox: /etc/hostname of the image, never the host's.
  t.is(await sb.files.readText('/tmp/up'), 'sandbox\n');
  t.is(await sb.files.readText('/tmp/root/etc/hostname'), 'sandbox\n');
  t.is(await sb.files.readText('/../../../etc/hostname'), 'sandbox\n');
  await sb.files.write('/tmp/etc/written-through-link', 'x');
  t.is((await sb.exec(['cat', '/etc/written-through-link'])).stdout, 'x');
  const fifo = await t.throwsAsync(sb.files.read('/tmp/fifo'));
  t.is((fifo as { code?: string }).code, 'FORBIDDEN');
  const fifoW = await t.throwsAsync(sb.files.write('/tmp/fifo', 'x'));
  t.is((fifoW as { code?: string }).code, 'FORBIDDEN');
  const host = await readFile('/etc/hostname', 'utf8').catch(() => '');
  t.not(await sb.files.readText('/tmp/root/etc/hostname'), host);
});

test('cgroup limits are applied: memory, cpu and pids read back from the cgroup', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 0.5, memoryMiB: 128, pidsLimit: 64 });
  t.teardown(() => sb.kill());
  const cg = `/paddock/${sb.info.node}/${sb.id}`;
  const read = (p: string) => readFile(p, 'utf8').then((s) => s.trim());
  const v2 = await read('/sys/fs/cgroup/cgroup.controllers').then(
    () => true,
    () => false,
  );
  if (v2) {
    t.is(await read(`/sys/fs/cgroup${cg}/memory.max`), String(128 * 1024 * 1024));
    t.is(await read(`/sys/fs/cgroup${cg}/pids.max`), '64');
    t.is(await read(`/sys/fs/cgroup${cg}/cpu.max`), '50000 100000');
  } else {
    t.is(await read(`/sys/fs/cgroup/memory${cg}/memory.limit_in_bytes`), String(128 * 1024 * 1024));
    t.is(await read(`/sys/fs/cgroup/pids${cg}/pids.max`), '64');
    t.is(await read(`/sys/fs/cgroup/cpu${cg}/cpu.cfs_quota_us`), '50000');
  }
  // The sandbox's processes live in that cgroup.
  const procs = await read(`/sys/fs/cgroup/${v2 ? '' : 'pids'}${cg}/cgroup.procs`);
  t.true(procs.split('\n').length >= 1);
});

test('the sandbox has its own network namespace with only lo', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const r = await sb.exec(['sh', '-c', "ip -o link | awk -F': ' '{print $2}'"]);
  t.is(r.stdout.trim(), 'lo');
});

test('get and list: by id, by labels; ended sandboxes only with all', async (t) => {
  const { pdk } = t.context;
  const tag = `l${Date.now()}`;
  const a = await pdk.sandboxes.create({ labels: { suite: tag, role: 'a' } });
  const b = await pdk.sandboxes.create({ labels: { suite: tag, role: 'b' }, group: 'job-1' });
  t.is((await pdk.sandboxes.get(a.id)).info.labels.role, 'a');
  t.deepEqual((await pdk.sandboxes.list({ labels: { suite: tag } })).map((s) => s.id).sort(byString), [a.id, b.id].sort(byString));
  t.deepEqual((await pdk.sandboxes.list({ labels: { suite: tag, role: 'b' } })).map((s) => s.id), [b.id]);
  t.deepEqual((await pdk.sandboxes.list({ group: 'job-1' })).map((s) => s.id), [b.id]);
  await a.kill();
  t.deepEqual((await pdk.sandboxes.list({ labels: { suite: tag } })).map((s) => s.id), [b.id]);
  const all = await pdk.sandboxes.list({ labels: { suite: tag }, all: true });
  t.is(all.find((s) => s.id === a.id)?.state, 'stopped');
  await b.kill();
  await t.throwsAsync(pdk.sandboxes.get('sb-doesnotexist00000'), { instanceOf: NotFoundError });
});

test('a sandbox past its ttl is killed and says so', async (t) => {
  const { pdk } = t.context;
  const sb = await pdk.sandboxes.create({ ttlSec: 1 });
  t.true(sb.info.expiresAt - sb.info.createdAt === 1000);
  // Killed by its node once the ttl is up: how soon depends on the machine, so wait for the state.
  const info = await eventually(async () => {
    const i = (await pdk.sandboxes.get(sb.id)).info;
    return i.state === 'running' || i.state === 'stopping' ? undefined : i;
  }, 60_000);
  if (!info) {
    // Seen once in CI and not since: what the node said of this sandbox, and what the directory has.
    t.log('directory:', JSON.stringify((await pdk.sandboxes.get(sb.id)).info));
    for (const n of t.context.cluster.nodes) for (const l of (await readFile(n.logFile ?? '', 'utf8').catch(() => '')).split('\n')) if (l.includes(sb.id)) t.log(l.slice(0, 400));
  }
  t.is(info?.state, 'stopped');
  t.is(info?.reason, 'ttl');
  const err = await t.throwsAsync(sb.exec(['true']), { instanceOf: NotFoundError });
  t.regex(err?.message ?? '', /ttl/);
});

test('a sandbox mounts its root in namespaces of its own: the node mount table does not grow, the files API stays on the root', async (t) => {
  const { pdk, cluster, home } = t.context;
  const sb = await pdk.sandboxes.create({ diskMiB: 32 });
  t.teardown(() => sb.kill());
  const node = cluster.nodes.find((n) => n.id === sb.info.node);
  const nodeMounts = await readFile(`/proc/${node?.proc.pid}/mountinfo`, 'utf8');
  t.false(nodeMounts.includes(sb.id), 'neither the overlay nor the writable layer is in the node\'s namespace');
  const init = (await readFile(nodeRunPath(home, node as NonNullable<typeof node>, 'sandboxes', sb.id, 'init.pid'), 'utf8')).trim();
  const own = await readFile(`/proc/${init}/mountinfo`, 'utf8');
  t.regex(own, /^\S+ \S+ \S+ \S+ \/ \S+.* - overlay /m, 'the container\'s / is the overlay');
  // The writable layer's size is what the sandbox sees at /.
  t.regex((await sb.exec(['sh', '-c', "df -k / | tail -1 | awk '{print $2}'"])).stdout, /^3\d{4}\n$/);
  // Through the init's root the container's /proc, /dev and /sys are mounted: the files API never goes there.
  await sb.exec(['sh', '-c', 'ln -s /proc/1 /tmp/p1']);
  for (const path of ['/proc/1/environ', '/tmp/p1/environ', '/dev/null', '/sys/kernel/hostname']) {
    await t.throwsAsync(sb.files.read(path), { instanceOf: ForbiddenError }, path);
  }
  await t.throwsAsync(sb.files.write('/proc/1/oom_score_adj', Buffer.from('-1000')), { instanceOf: ForbiddenError });
  await t.throwsAsync(sb.files.remove('/dev', { recursive: true }), { instanceOf: ForbiddenError });
  t.is((await sb.exec(['ls', '/dev/null'])).exitCode, 0);
  // And ordinary files work as before.
  await sb.files.write('/work/a/b.txt', 'fine');
  t.is(await sb.files.readText('/work/a/b.txt'), 'fine');
});

test('a sandbox whose init dies (an OOM kill, say): the files API still reaches only its own root', async (t) => {
  const { pdk, cluster, home } = t.context;
  const sb = await pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  await sb.files.write('/etc/hostname', 'still-mine\n');
  const node = cluster.nodes.find((n) => n.id === sb.info.node);
  const init = Number((await readFile(nodeRunPath(home, node as NonNullable<typeof node>, 'sandboxes', sb.id, 'init.pid'), 'utf8')).trim());
  process.kill(init, 'SIGKILL');
  // Reaped (the node's spawner is its subreaper), not left a zombie: waited for, not timed.
  await eventually(async () => !(await readFile(`/proc/${init}/stat`).then(() => true, () => false)));
  // Whatever holds that pid next, the node goes on through the root it opened at create.
  const seen = await sb.files.readText('/etc/hostname').catch((e: { code?: string }) => e.code ?? 'ERROR');
  t.not(seen, await readFile('/etc/hostname', 'utf8'));
  t.true(seen === 'still-mine\n' || /^[A-Z_]+$/.test(seen), seen);
  // And the sandbox is over: failed, reason crashed, without anyone killing it.
  const info = await eventually(async () => {
    const r = await sb.refresh();
    return r.state === 'failed' ? r : undefined;
  });
  t.is(info?.state, 'failed');
  t.is(info?.reason, 'crashed');
});

test('pid 1 of a sandbox reaps orphans at once and is the only idle process', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  // No idle `sleep` beside it (busybox's own init would be a shell and a sleep).
  t.is((await sb.exec(['sh', '-c', 'cat /proc/1/comm; cat /proc/[0-9]*/comm | grep -c sleep'])).stdout, 'init\n0\n');
  // Orphans of a finished exec: their parent is gone, so pid 1 must reap them.
  await sb.exec(['sh', '-c', 'for i in 1 2 3 4 5; do (sleep 0.2 &) ; done']);
  await new Promise((r) => setTimeout(r, 700));
  const zombies = await sb.exec(['sh', '-c', "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l"]);
  t.is(zombies.stdout.trim(), '0');
  // Nothing inside can end the sandbox by signalling its init.
  await sb.exec(['sh', '-c', 'kill -TERM 1; kill -INT 1; kill -HUP 1; true']);
  t.is((await sb.exec(['echo', 'alive'])).stdout, 'alive\n');
  // And the fd it was started from is closed.
  t.is((await sb.exec(['sh', '-c', 'ls /proc/1/fd 2>&1 | wc -l'])).exitCode, 0);
});
