import { readFile, rm } from 'node:fs/promises';
import { connect } from '@nats-io/transport-node';
import { decode, type SandboxInfo, subjects } from '../protocol/index.ts';
import { run } from '../runtime/proc.ts';
import { InvalidStateError } from '../sdk/index.ts';
import type { ExecutionContext } from 'ava';
import { clusterTest, nodeRunPath } from './helpers/cluster.ts';
import { eventually } from './helpers/wait.ts';

const test = clusterTest({ nodes: 2 });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const cgroupFile = (node: string, id: string, ctrl: string, file: string) => `/sys/fs/cgroup/${ctrl}/paddock/${node}/${id}/${file}`;

/** Polls until the state is reached; the bound only catches a hang (how fast is a benchmark's business). */
async function waitState(get: () => Promise<SandboxInfo>, state: string, ms = 60_000): Promise<SandboxInfo> {
  const until = Date.now() + ms;
  for (;;) {
    const info = await get();
    if (info.state === state || Date.now() > until) return info;
    await sleep(50);
  }
}

test('pause freezes the processes and keeps them; resume continues where they were', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  await sb.exec(['sh', '-c', 'sleep 1000 > /dev/null 2>&1 & echo $! > /tmp/pid; (while :; do echo x >> /tmp/ticks; sleep 0.05; done) > /dev/null 2>&1 &']);
  const pid = (await sb.files.readText('/tmp/pid')).trim();
  t.is((await sb.pause()).state, 'paused');
  t.is((await readFile(cgroupFile(sb.info.node, sb.id, 'freezer', 'freezer.state'), 'utf8')).trim(), 'FROZEN');
  // Frozen: the ticker does not tick. (Read from the host side, which does not wake it.)
  // The rootfs is mounted only in the sandbox's own mount namespace: reach it through its init's root.
  const node = t.context.cluster.nodes.find((n) => n.id === sb.info.node)!;
  const init = (await readFile(nodeRunPath(t.context.home, node, 'sandboxes', sb.id, 'init.pid'), 'utf8')).trim();
  const ticks = `/proc/${init}/root/tmp/ticks`;
  const before = (await readFile(ticks, 'utf8')).length;
  await sleep(300);
  const after = (await readFile(ticks, 'utf8')).length;
  t.is(after, before);
  await t.throwsAsync(sb.pause(), { instanceOf: InvalidStateError });
  t.is((await sb.resume()).state, 'running');
  await t.throwsAsync(sb.resume(), { instanceOf: InvalidStateError }, 'resume while running is refused');
  const ps = await sb.exec(['ps', '-o', 'pid,args']);
  t.regex(ps.stdout, new RegExp(`^\\s*${pid}\\s+sleep 1000`, 'm'));
  // Thawed, it ticks again (as soon as the machine gives it a turn: no fixed wait).
  const later = await eventually(async () => {
    const n = (await sb.files.readText('/tmp/ticks')).length;
    return n > after ? n : 0;
  });
  t.true(later > after);
});

test('exec on a paused or hibernated sandbox wakes it; with autoResume off it is refused', async (t) => {
  const { pdk } = t.context;
  const sb = await pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  await sb.pause();
  t.is((await sb.exec(['echo', 'awake'])).stdout, 'awake\n');
  t.is((await sb.refresh()).state, 'running');
  await sb.hibernate();
  t.is((await sb.files.readText('/etc/hostname')).trim(), 'sandbox');
  t.is((await sb.refresh()).state, 'running');

  const strict = await pdk.sandboxes.create({ autoResume: false });
  t.teardown(() => strict.kill());
  await strict.pause();
  const err = await t.throwsAsync(strict.exec(['true']), { instanceOf: InvalidStateError });
  t.regex(err?.message ?? '', /paused.*autoResume/);
  await strict.resume();
  t.is((await strict.exec(['true'])).exitCode, 0);
});

/**
 * Swap for the node, as a host that hibernates sandboxes would have it: their writable layers are
 * tmpfs and their heaps anonymous memory, and both leave RAM only through swap.
 */
async function withSwap(t: ExecutionContext<unknown>): Promise<void> {
  if ((await readFile('/proc/swaps', 'utf8')).trim().split('\n').length > 1) return;
  const file = '/var/tmp/paddock-test.swap';
  await run('fallocate', ['-l', '512M', file]);
  await run('chmod', ['600', file]);
  await run('mkswap', [file]);
  await run('swapon', [file]);
  t.teardown(async () => {
    await run('swapoff', [file], { allowFail: true });
    await rm(file, { force: true });
  });
}

test.serial('hibernate gives memory back and reports it; restore finds everything in place', async (t) => {
  await withSwap(t);
  const sb = await t.context.pdk.sandboxes.create({ memoryMiB: 512 });
  t.teardown(() => sb.kill());
  // 64 MiB in the writable layer (tmpfs: it leaves RAM only through swap), charged to the sandbox.
  await sb.exec(['sh', '-c', 'dd if=/dev/zero of=/tmp/big bs=1M count=64 2>/dev/null; sleep 1000 > /dev/null 2>&1 &']);
  const usage = Number(await readFile(cgroupFile(sb.info.node, sb.id, 'memory', 'memory.usage_in_bytes'), 'utf8'));
  t.true(usage > 60 * 1024 * 1024, `usage ${usage}`);
  const info = await sb.hibernate();
  t.is(info.state, 'hibernated');
  t.true(info.released?.swapped);
  t.true((info.released?.bytes ?? 0) > 50 * 1024 * 1024, `released ${JSON.stringify(info.released)}`);
  const now = Number(await readFile(cgroupFile(sb.info.node, sb.id, 'memory', 'memory.usage_in_bytes'), 'utf8'));
  t.true(now < usage - 50 * 1024 * 1024);
  // The limit is back where it was, for when it wakes.
  t.is((await readFile(cgroupFile(sb.info.node, sb.id, 'memory', 'memory.limit_in_bytes'), 'utf8')).trim(), String(512 * 1024 * 1024));
  await t.throwsAsync(sb.pause(), { instanceOf: InvalidStateError });
  t.is((await sb.restore()).state, 'running');
  t.is((await sb.exec(['sh', '-c', 'wc -c < /tmp/big'])).stdout.trim(), String(64 * 1024 * 1024));
  t.regex((await sb.exec(['ps'])).stdout, /sleep 1000/);
});

test('idle timeout: pause after T without calls, never during a long exec; idle kill says so in its event', async (t) => {
  const { pdk, cluster } = t.context;
  const sb = await pdk.sandboxes.create({ idleTimeoutSec: 1, idleAction: 'pause' });
  t.teardown(() => sb.kill());
  // A call longer than the idle timeout is activity, not idleness.
  t.is((await sb.exec(['sleep', '1.5'])).exitCode, 0);
  t.is((await sb.refresh()).state, 'running');
  const paused = await waitState(() => sb.refresh(), 'paused');
  t.is(paused.state, 'paused');
  t.is(paused.sleepReason, 'idle');

  const nc = await connect({ servers: cluster.url });
  t.teardown(() => nc.close());
  const doomed = await pdk.sandboxes.create({ idleTimeoutSec: 1, idleAction: 'kill' });
  const events = nc.subscribe(subjects.event(doomed.id, 'stopped'), { max: 1 });
  const [ev] = await Promise.all([
    (async () => {
      for await (const m of events) return decode(m.data) as SandboxInfo;
      return undefined;
    })(),
  ]);
  t.is(ev?.state, 'stopped');
  t.is(ev?.reason, 'idle');
  t.is((await pdk.sandboxes.get(doomed.id)).info.reason, 'idle');
});

test('groups: pause, resume, hibernate and kill a training job on every node at once', async (t) => {
  const { pdk } = t.context;
  const g = `job-${Date.now()}`;
  const sbs = await Promise.all(Array.from({ length: 6 }, () => pdk.sandboxes.create({ group: g, memoryMiB: 64 })));
  const other = await pdk.sandboxes.create({ group: `${g}-other` });
  t.teardown(() => other.kill());
  t.is(new Set(sbs.map((s) => s.info.node)).size, 2, 'the group spans both nodes');
  const p = await pdk.groups.pause(g);
  t.like(p, { group: g, verb: 'pause', total: 6, ok: 6, failed: [], unreachable: [] });
  for (const s of sbs) t.is((await s.refresh()).state, 'paused');
  t.is((await other.refresh()).state, 'running', 'other groups are untouched');
  t.like(await pdk.groups.pause(g), { total: 6, ok: 6 }, 'pausing again is a no-op, not a failure');
  t.like(await pdk.groups.resume(g), { total: 6, ok: 6 });
  for (const s of sbs) t.is((await s.refresh()).state, 'running');
  const h = await pdk.groups.hibernate(g);
  t.like(h, { total: 6, ok: 6 });
  let released = 0;
  for (const s of sbs) {
    const info = await s.refresh();
    t.is(info.state, 'hibernated');
    released += info.released?.bytes ?? 0;
  }
  t.is(h.releasedBytes, released, 'the summary adds up what each sandbox gave back');
  t.is((await pdk.groups.hibernate(g)).releasedBytes, 0, 'sandboxes already asleep give nothing more');
  t.like(await pdk.groups.restore(g), { total: 6, ok: 6 });
  t.like(await pdk.groups.kill(g), { total: 6, ok: 6 });
  for (const s of sbs) t.is((await pdk.sandboxes.get(s.id)).info.state, 'stopped');
  t.like(await pdk.groups.pause('no-such-group'), { total: 0, ok: 0 });
});

test('QoS: best-effort processes run under SCHED_IDLE with a low CPU weight; latency-sensitive ones do not', async (t) => {
  const { pdk } = t.context;
  const be = await pdk.sandboxes.create({ qos: 'be' });
  const ls = await pdk.sandboxes.create({ qos: 'ls', cpu: 2 });
  t.teardown(() => Promise.all([be.kill(), ls.kill()]));
  const policy = async (sb: typeof be) => {
    const { stdout } = await sb.exec(['sh', '-c', 'sleep 30 > /dev/null 2>&1 & echo started']);
    t.is(stdout, 'started\n');
    const procs = (await readFile(cgroupFile(sb.info.node, sb.id, 'pids', 'cgroup.procs'), 'utf8')).trim().split('\n');
    const out = await Promise.all(procs.map((pid) => run('chrt', ['-p', pid], { allowFail: true }).then((r) => r.stdout)));
    return out.filter((o) => o.includes('policy')).map((o) => /policy: (\S+)/.exec(o)?.[1]);
  };
  const bePolicies = await policy(be);
  t.true(bePolicies.length >= 2);
  t.true(bePolicies.every((p) => p === 'SCHED_IDLE'), `be: ${bePolicies}`);
  const lsPolicies = await policy(ls);
  t.true(lsPolicies.every((p) => p === 'SCHED_OTHER'), `ls: ${lsPolicies}`);
  t.is((await readFile(cgroupFile(be.info.node, be.id, 'cpu', 'cpu.shares'), 'utf8')).trim(), '2');
  t.is((await readFile(cgroupFile(ls.info.node, ls.id, 'cpu', 'cpu.shares'), 'utf8')).trim(), '2048');
});

test('a streamed exec longer than the idle timeout is activity too', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ idleTimeoutSec: 1, idleAction: 'pause' });
  t.teardown(() => sb.kill());
  const seen: string[] = [];
  for await (const ev of sb.execStream(['sh', '-c', 'echo a; sleep 1.6; echo b'])) {
    if (ev.type === 'stdout' || ev.type === 'stderr') seen.push(ev.text.trim());
    else if (ev.type === 'exit') t.is(ev.exitCode, 0);
  }
  t.deepEqual(seen, ['a', 'b']);
  t.is((await sb.refresh()).state, 'running');
});
