/** Attacks on resources: each one ends in a verdict, the sandbox survives it, the neighbour does not notice. */
import { spawnSync } from 'node:child_process';
import { readdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { createInbox } from '@nats-io/transport-node';
import type { ExecutionContext } from 'ava';
import { decode, encode, subjects } from '../../protocol/index.ts';
import { connectionOf } from '../../sdk/client.ts';
import { PaddockError, type Sandbox } from '../../sdk/index.ts';
import { type AdvContext, advTest, only, probeBinary, stillWorks, sustained, underAttack } from './harness.ts';

const test = advTest();


test.serial('yes flood: output is capped, the exec ends with OUTPUT_LIMIT', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  await underAttack(t, 'yes flood', 'OUTPUT_LIMIT', async () => only(await sustained(2000, async () => (await sb.exec(['yes'], { timeoutMs: 20_000 })).verdict)));
  t.true(await stillWorks(sb));
});

test.serial('fork bomb: the pids limit ends it with PIDS_LIMIT and the sandbox lives on', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1, pidsLimit: 64 });
  t.teardown(() => sb.kill());
  await underAttack(t, 'fork bomb', 'PIDS_LIMIT', async () => only(await sustained(1500, async () => (await sb.exec(['sh', '-c', 'bomb() { bomb | bomb & }; bomb; sleep 30'], { timeoutMs: 30_000 })).verdict)));
  t.true(await stillWorks(sb));
  // Killed processes whose parent was the exec's crun (outside the sandbox) are adopted by its
  // init once crun is gone, and reaped there: give that a moment.
  let ps = '';
  for (let i = 0; i < 50; i++) {
    ps = (await sb.exec(['ps', '-o', 'pid,args'])).stdout;
    if (ps.trim().split('\n').length < 8) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  t.true(ps.trim().split('\n').length < 8, ps.slice(0, 400));
});

test.serial('memory hog: the OOM kill is reported as MEMORY_LIMIT and the sandbox lives on', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1, memoryMiB: 64 });
  t.teardown(() => sb.kill());
  const hog = `awk 'BEGIN { s = "x"; while (1) s = s s }'`;
  await underAttack(t, 'memory hog', 'MEMORY_LIMIT', async () => only(await sustained(1500, async () => (await sb.exec(['sh', '-c', hog], { timeoutMs: 30_000 })).verdict)));
  t.true(await stillWorks(sb));
});

test.serial('disk filler: the writable layer fills, the exec ends with DISK_LIMIT, the node disk is untouched', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1, memoryMiB: 256, diskMiB: 64 });
  t.teardown(() => sb.kill());
  // What the node keeps on disk (its home: state, logs, NATS data), not the whole filesystem's free
  // space, which anything else on the machine moves.
  // du exits 1 when a file goes away during its walk; the total it prints still stands.
  const used = () => Number(spawnSync('du', ['-skx', t.context.home]).stdout.toString().split('\t')[0]) * 1024;
  const before = used();
  await underAttack(t, 'disk filler (yes > file)', 'DISK_LIMIT', async () =>
    only(
      await sustained(1500, async () => {
        const r = await sb.exec(['sh', '-c', 'rm -f /tmp/fill; yes > /tmp/fill'], { timeoutMs: 30_000 });
        return r.verdict;
      }),
    ),
  );
  const df = await sb.exec(['sh', '-c', "df -k / | tail -1 | awk '{print $2}'"]);
  t.true(Number(df.stdout.trim()) <= 64 * 1024, `the sandbox sees its own disk size: ${df.stdout}`);
  // The layer is not on the node's disk: tens of MiB written inside cost it nothing.
  const grew = used() - before;
  t.true(grew < 32 * 1024 * 1024, `the node's home grew by ${grew} bytes`);
  // A later command on the full layer is not blamed for it.
  t.is((await sb.exec(['ls', '/'])).verdict, 'OK');
  await sb.exec(['rm', '-f', '/tmp/fill']);
  t.is((await sb.exec(['sh', '-c', 'echo fits > /tmp/small && cat /tmp/small'])).stdout, 'fits\n');
});

test.serial('a 1 GiB write through the files API stops at the disk quota with DISK_LIMIT', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1, diskMiB: 64 });
  t.teardown(() => sb.kill());
  const gib = Buffer.alloc(1024 * 1024 * 1024, 0x61);
  await underAttack(t, '1 GiB files.write', 'DISK_LIMIT', async () => {
    try {
      await sb.files.write('/work/huge.bin', gib);
      return 'OK';
    } catch (e) {
      return e instanceof PaddockError ? e.code : String(e);
    }
  });
  const size = Number((await sb.exec(['sh', '-c', 'wc -c < /work/huge.bin'])).stdout.trim());
  t.true(size > 0 && size <= 64 * 1024 * 1024, `partial file of ${size} bytes`);
  // The files API's own writes are the sandbox root's.
  t.is((await sb.exec(['stat', '-c', '%u:%g', '/work/huge.bin'])).stdout.trim(), '0:0');
});

test.serial('a command past its timeout ends with TIMEOUT', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  await underAttack(t, 'busy loop past timeout', 'TIMEOUT', async () => (await sb.exec(['sh', '-c', 'while :; do :; done'], { timeoutMs: 2000 })).verdict);
  t.true(await stillWorks(sb));
});

test.serial('open files: the nofile limit cannot be raised', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  const r = await sb.exec(['sh', '-c', 'ulimit -n; ulimit -n 100000 && echo raised']);
  t.is(r.stdout.split('\n')[0], '1024');
  t.notRegex(r.stdout, /raised/);
});

test.serial('honest resources: nproc and /proc/meminfo show the sandbox its own limits', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1, memoryMiB: 192 });
  t.teardown(() => sb.kill());
  t.is((await sb.exec(['nproc'])).stdout.trim(), '1');
  const mem = await sb.exec(['sh', '-c', "awk '/MemTotal/ {print $2}' /proc/meminfo"]);
  t.is(Number(mem.stdout.trim()), 192 * 1024);
});

test.serial('a sandbox of 3,000 processes, killed, leaves no cgroup in any hierarchy: REMOVED', async (t) => {
  const { pdk, cluster } = t.context;
  const sb = await pdk.sandboxes.create({ cpu: 1, memoryMiB: 1024, pidsLimit: 4096 });
  const nodeId = cluster.nodes[0]?.id as string;
  const hierarchies = (await readdir('/sys/fs/cgroup')).filter((h) => h !== 'unified');
  await underAttack(t, '3,000 processes, then kill', 'REMOVED', async () => {
    await sb.files.write('/usr/local/bin/probe', await probeBinary(), { mode: 0o755 });
    const r = await sb.exec(['/usr/local/bin/probe', 'procs', '3000'], { timeoutMs: 120_000 });
    if (r.stdout !== 'started 3000\n') return `not started: ${r.verdict} ${r.stdout} ${r.stderr.slice(0, 200)}`;
    const n = Number((await readFile(`/sys/fs/cgroup/pids/paddock/${nodeId}/${sb.id}/pids.current`, 'utf8')).trim());
    if (n < 3000) return `only ${n} processes`;
    await sb.kill();
    const left = [];
    for (const h of hierarchies) if (await stat(`/sys/fs/cgroup/${h}/paddock/${nodeId}/${sb.id}`).catch(() => null)) left.push(h);
    return left.length === 0 ? 'REMOVED' : `LEAKED in ${left.join(' ')}`;
  });
});

test.serial('a writable layer out of inodes (empty files) ends the exec with DISK_LIMIT', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1, memoryMiB: 256, diskMiB: 64 });
  t.teardown(() => sb.kill());
  await underAttack(t, 'inode exhaustion (empty files)', 'DISK_LIMIT', async () =>
    only(await sustained(1000, async () => (await sb.exec(['sh', '-c', 'mkdir -p /tmp/i && cd /tmp/i && n=0; while : > f$n; do n=$((n+1)); done; echo $n; exit 1'], { timeoutMs: 60_000 })).verdict)),
  );
  await sb.exec(['rm', '-rf', '/tmp/i']);
  t.is((await sb.exec(['sh', '-c', 'echo fits > /tmp/small && cat /tmp/small'])).stdout, 'fits\n');
});

test.serial('fallocate past diskMiB ends with DISK_LIMIT', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1, memoryMiB: 256, diskMiB: 64 });
  t.teardown(() => sb.kill());
  await underAttack(t, 'fallocate past diskMiB', 'DISK_LIMIT', async () => only(await sustained(1000, async () => (await sb.exec(['fallocate', '-l', '100M', '/tmp/big'], { timeoutMs: 30_000 })).verdict)));
});

test.serial('with the default spec a disk filler ends in DISK_LIMIT (not MEMORY_LIMIT) and the sandbox still runs commands', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  await underAttack(t, 'disk filler, default spec', 'DISK_LIMIT', async () => only(await sustained(1500, async () => (await sb.exec(['sh', '-c', 'rm -f /tmp/fill; yes > /tmp/fill'], { timeoutMs: 30_000 })).verdict)));
  t.is((await sb.exec(['echo', 'ok'])).stdout, 'ok\n');
});

/** A streamed exec driven on the wire, so the test can cancel or kill it and still read its exit. */
async function streamedVerdict(t: ExecutionContext<AdvContext>, sb: Sandbox, stop: (execId: string) => Promise<unknown>): Promise<string> {
  const nc = connectionOf(t.context.pdk);
  const inbox = createInbox();
  const sub = nc.subscribe(inbox);
  const execId = `x${Math.random().toString(36).slice(2, 10)}`;
  nc.publish(subjects.sandbox(sb.id, 'exec'), encode({ cmd: ['sh', '-c', 'echo started; sleep 30'], timeoutMs: 60_000, stream: true, execId }), { reply: inbox });
  const timer = setTimeout(() => sub.unsubscribe(), 30_000);
  try {
    for await (const m of sub) {
      const ev = decode(m.data) as { t?: string; verdict?: string; d?: Uint8Array; error?: { code: string } };
      if (ev.t === 'out') void stop(execId);
      if (ev.t === 'exit') return ev.verdict as string;
      if (ev.t === 'error') return `error ${ev.error?.code}`;
    }
    return 'no exit';
  } finally {
    clearTimeout(timer);
    sub.unsubscribe();
  }
}

test.serial('a streamed exec cancelled with exec.cancel ends with CANCELLED', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  const nc = connectionOf(t.context.pdk);
  await underAttack(t, 'streamed exec, exec.cancel', 'CANCELLED', async () =>
    only(await sustained(1000, () => streamedVerdict(t, sb, (execId) => nc.request(subjects.sandbox(sb.id, 'exec.cancel'), encode({ execId }), { timeout: 10_000 })))),
  );
});

test.serial('a streamed exec whose sandbox is killed ends with KILLED', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  await underAttack(t, 'streamed exec, sandbox killed', 'KILLED', () => streamedVerdict(t, sb, () => sb.kill()));
});

test.serial("files.write is charged to the sandbox's memory cgroup, not the node's: CHARGED", async (t) => {
  const { pdk, cluster } = t.context;
  const sb = await pdk.sandboxes.create({ cpu: 1, memoryMiB: 128, diskMiB: 64 });
  t.teardown(() => sb.kill());
  const usage = async () => Number((await readFile(`/sys/fs/cgroup/memory/paddock/${cluster.nodes[0]?.id}/${sb.id}/memory.usage_in_bytes`, 'utf8')).trim());
  await underAttack(t, '48 MiB files.write, memory cgroup', 'CHARGED', async () => {
    const before = await usage();
    await sb.files.write('/tmp/upload.bin', Buffer.alloc(48 * 1024 * 1024, 0x61));
    const grew = (await usage()) - before;
    return grew >= 40 * 1024 * 1024 ? 'CHARGED' : `UNCHARGED (+${Math.round(grew / 1024)} KiB)`;
  });
  t.is((await sb.exec(['sh', '-c', 'wc -c < /tmp/upload.bin'])).stdout.trim(), String(48 * 1024 * 1024));
  // Past the layer: DISK_LIMIT, and the sandbox goes on.
  const code = await sb.files.write('/tmp/more.bin', Buffer.alloc(32 * 1024 * 1024)).then(
    () => 'OK',
    (e: { code?: string }) => e.code,
  );
  t.is(code, 'DISK_LIMIT');
  t.is((await sb.exec(['echo', 'ok'])).stdout, 'ok\n');
});

test.serial('a sandbox reading its lxcfs /proc files in a loop: lxcfs runs under a CPU quota of its own: BOUNDED', async (t) => {
  const { pdk, cluster, home } = t.context;
  const sb = await pdk.sandboxes.create({ cpu: 0.25 });
  t.teardown(() => sb.kill());
  const nodeId = cluster.nodes[0]?.id as string;
  const pid = (await readFile(join(home, 'nodes', nodeId, 'lxcfs.pid'), 'utf8')).trim();
  await underAttack(t, '/proc/meminfo, stat, cpuinfo read in a loop (lxcfs)', 'BOUNDED', async () => {
    await sb.exec(['sh', '-c', 'end=$(( $(date +%s) + 6 )); while [ $(date +%s) -lt $end ]; do cat /proc/meminfo /proc/stat /proc/cpuinfo /proc/uptime /proc/loadavg > /dev/null; done'], { timeoutMs: 30_000 });
    const cgroup = (await readFile(`/proc/${pid}/cgroup`, 'utf8')).split('\n').find((l) => /:cpu[,:]|^0::/.test(l)) ?? '';
    const path = cgroup.slice(cgroup.lastIndexOf(':') + 1);
    const quota = await readFile(`/sys/fs/cgroup/cpu${path}/cpu.cfs_quota_us`, 'utf8').catch(() => '-1');
    return Number(quota) > 0 ? 'BOUNDED' : `UNBOUNDED (lxcfs in ${path})`;
  });
  t.is((await sb.exec(['sh', '-c', "awk '/MemTotal/ {print $2}' /proc/meminfo"])).stdout.trim(), String(256 * 1024));
});
