/** Host-facing pure logic: cgroup layout detection and the OCI config. */
import test from 'ava';
import { validateSpec } from '../protocol/index.ts';
import { EXEC_KILLED, verdictOf } from '../runtime/backend.ts';
import { detectCgroups } from '../runtime/cgroups.ts';
import { loadConfig } from '../runtime/config.ts';
import { cfsBandwidth, MASKED_PATHS, ociConfig } from '../runtime/container/oci.ts';

const line = (id: number, target: string, fstype: string) => `${id} 1 0:${id} / ${target} rw,nosuid - ${fstype} ${fstype} rw`;

test('cgroups: pure v2, hybrid and v1 hosts are told apart', (t) => {
  t.is(detectCgroups([line(1, '/', 'ext4'), line(2, '/sys/fs/cgroup', 'cgroup2')].join('\n')), 'v2');
  const v1 = [line(1, '/', 'ext4'), line(2, '/sys/fs/cgroup', 'tmpfs'), line(3, '/sys/fs/cgroup/memory', 'cgroup')];
  t.is(detectCgroups(v1.join('\n')), 'v1');
  t.is(detectCgroups([...v1, line(4, '/sys/fs/cgroup/unified', 'cgroup2')].join('\n')), 'hybrid');
});

test('oci: limits, namespaces and masked paths follow the spec', (t) => {
  const spec = validateSpec({ cpu: 1.5, memoryMiB: 300, pidsLimit: 99, env: { A: 'b', PATH: '/custom' }, cwd: '/work' });
  const image = { name: 'busybox', layers: [], env: ['PATH=/bin', 'HOME=/root'], cwd: '/', user: { uid: 0, gid: 0 }, init: ['/bin/sleep', 'infinity'] };
  const c = ociConfig({ spec, image, rootfs: '/r', cgroupsPath: '/paddock/n/x', cgroupMode: 'v1' }) as {
    process: { env: string[]; cwd: string; noNewPrivileges: boolean; args: string[] };
    linux: { resources: { memory: { limit: number }; cpu: { quota: number; period: number }; pids: { limit: number } }; namespaces: { type: string }[]; maskedPaths: string[] };
  };
  t.deepEqual(c.process.env, ['PATH=/custom', 'HOME=/root', 'A=b']);
  t.is(c.process.cwd, '/work');
  t.true(c.process.noNewPrivileges);
  t.deepEqual(c.process.args, ['/bin/sleep', 'infinity']);
  t.is(c.linux.resources.memory.limit, 300 * 1024 * 1024);
  t.deepEqual([c.linux.resources.cpu.quota, c.linux.resources.cpu.period], [150_000, 100_000]);
  t.is(c.linux.resources.pids.limit, 99);
  t.true(c.linux.namespaces.some((n) => n.type === 'network'));
  t.false(c.linux.namespaces.some((n) => n.type === 'cgroup'));
  t.true(MASKED_PATHS.includes('/proc/kpagecgroup'));
  const v2 = ociConfig({ spec, image, rootfs: '/r', cgroupsPath: '/p', cgroupMode: 'v2' }) as { linux: { namespaces: { type: string }[] } };
  t.true(v2.linux.namespaces.some((n) => n.type === 'cgroup'));
});

test('oci: a small CPU share gets a longer CFS period, so that each period holds at least 10 ms', (t) => {
  t.deepEqual(cfsBandwidth(1), { quota: 100_000, period: 100_000 });
  t.deepEqual(cfsBandwidth(0.1), { quota: 10_000, period: 100_000 });
  t.deepEqual(cfsBandwidth(0.05), { quota: 10_000, period: 200_000 });
  t.deepEqual(cfsBandwidth(0.03), { quota: 10_020, period: 334_000 });
  t.deepEqual(cfsBandwidth(0.01), { quota: 10_000, period: 1_000_000 });
  for (const cpu of [0.01, 0.013, 0.07, 0.25, 2, 64]) {
    const b = cfsBandwidth(cpu);
    t.true(b.period >= 100_000 && b.period <= 1_000_000, `period of ${cpu}`);
    t.true(b.quota >= 10_000, `quota of ${cpu}`);
    t.true(Math.abs(b.quota / b.period - cpu) / cpu < 0.01, `share of ${cpu}`);
  }
});

test('config: PADDOCK_BIN_DIR must be an absolute path outside /proc, /sys and /dev', (t) => {
  t.is(loadConfig({ PADDOCK_BIN_DIR: '/var/cache/elsewhere' }).binDir, '/var/cache/elsewhere');
  t.is(loadConfig({}).binDir, '/var/cache/paddock/bin');
  t.throws(() => loadConfig({ PADDOCK_BIN_DIR: 'relative/bin' }), { message: /must be an absolute path/ });
  for (const dir of ['/proc/1/bin', '/sys', '//dev/shm/bin']) t.throws(() => loadConfig({ PADDOCK_BIN_DIR: dir }), { message: /not be under \/proc, \/sys or \/dev/ });
});

test('config: how long placement waits on a silent node before it marks its sandboxes node_lost', (t) => {
  t.is(loadConfig({}).nodeLostMs, undefined, "placement's own default");
  t.is(loadConfig({ PADDOCK_NODE_LOST_MS: '120000' }).nodeLostMs, 120_000);
  for (const bad of ['0', '-5', 'soon']) t.throws(() => loadConfig({ PADDOCK_NODE_LOST_MS: bad }), { message: /PADDOCK_NODE_LOST_MS/ });
});

test('verdicts: a limit says why; a killed sandbox is KILLED even though its torn-down layer reads as full', (t) => {
  const quiet = { pidsMax: 0, oomKills: 0 };
  const failed = { exitCode: 1, timedOut: false, truncated: false };
  t.is(verdictOf(failed, quiet, { pidsMax: 0, oomKills: 1 }, false), 'MEMORY_LIMIT');
  t.is(verdictOf(failed, quiet, quiet, true), 'DISK_LIMIT');
  t.is(verdictOf({ ...failed, exitCode: 0 }, quiet, quiet, true), 'OK', 'a full layer matters only to a command that failed');
  const killed = new AbortController();
  killed.abort(EXEC_KILLED);
  t.is(verdictOf({ ...failed, noSpace: true }, quiet, quiet, true, killed.signal), 'KILLED');
  const cancelled = new AbortController();
  cancelled.abort();
  t.is(verdictOf(failed, quiet, quiet, false, cancelled.signal), 'CANCELLED');
});
