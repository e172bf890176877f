/**
 * The resource attacks of limits.test.ts and escape.test.ts that apply to a microVM, against one:
 * each ends in the same verdict as on a container, the VM survives it, the node serves on and the
 * neighbour (a container) does not notice. What a VM is not asked: masked /proc files (the guest's
 * kernel is its own; its /proc/kpage* describe only guest memory) and per-user host counters (the
 * guest has no host user; its VMM does, jail.ts). Network probes are in network.test.ts. Skipped
 * where QEMU or the guest kernel is missing (ops/setup.sh installs both).
 */
import { existsSync, readdirSync } from 'node:fs';
import { advTest, only, stillWorks, sustained, underAttack } from './harness.ts';

const ready = existsSync('/usr/bin/qemu-system-x86_64') && readdirSync('/boot').some((n) => /^vmlinuz-.*-cloud-amd64$/.test(n));
if (!ready) console.log('microVM attacks skipped: needs qemu-system-x86 and linux-image-cloud-amd64');
const base = advTest({ env: { PADDOCK_BACKENDS: 'container,microvm' } });
const test = ready ? base.serial : base.skip;

const vm = { backend: 'microvm' as const, cpu: 1, memoryMiB: 256 };

test('microvm yes flood: output is capped, the exec ends with OUTPUT_LIMIT', async (t) => {
  const sb = await t.context.pdk.sandboxes.create(vm);
  t.teardown(() => sb.kill());
  await underAttack(t, 'microvm: yes flood', 'OUTPUT_LIMIT', async () => only(await sustained(2000, async () => (await sb.exec(['yes'], { timeoutMs: 20_000 })).verdict)));
  t.true(await stillWorks(sb));
});

test('microvm fork bomb: the pids limit ends it with PIDS_LIMIT, every process of it goes, and the VM lives on', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ ...vm, pidsLimit: 64 });
  t.teardown(() => sb.kill());
  await underAttack(t, 'microvm: fork bomb', 'PIDS_LIMIT', async () => only(await sustained(1500, async () => (await sb.exec(['sh', '-c', 'bomb() { bomb | bomb & }; bomb; sleep 30'], { timeoutMs: 30_000 })).verdict)));
  t.true(await stillWorks(sb));
  // The bomb's cgroup was killed whole (cgroup.kill); its last processes may take a moment to be reaped.
  let left = '';
  for (let i = 0; i < 50; i++) {
    left = (await sb.exec(['sh', '-c', 'ps -o args | grep -c "[b]omb" || true'])).stdout.trim();
    if (left === '0') break;
    await new Promise((r) => setTimeout(r, 100));
  }
  t.is(left, '0', 'no process of the bomb is left');
});

test('microvm memory hog: the guest OOM kill is reported as MEMORY_LIMIT and the VM lives on', async (t) => {
  const sb = await t.context.pdk.sandboxes.create(vm);
  t.teardown(() => sb.kill());
  // A line that never ends, held whole: it grows until the guest's OOM killer ends it (a buffer
  // doubled at once is refused by the guest's overcommit instead, and its exit says nothing).
  await underAttack(t, 'microvm: memory hog', 'MEMORY_LIMIT', async () => only(await sustained(1500, async () => (await sb.exec(['tail', '/dev/zero'], { timeoutMs: 60_000 })).verdict)));
  t.true(await stillWorks(sb));
});

test('microvm disk filler: the writable layer fills, the exec ends with DISK_LIMIT, a later command is not blamed', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ ...vm, diskMiB: 64 });
  t.teardown(() => sb.kill());
  await underAttack(t, 'microvm: disk filler (yes > file)', 'DISK_LIMIT', async () => only(await sustained(1500, async () => (await sb.exec(['sh', '-c', 'rm -f /tmp/fill; yes > /tmp/fill'], { timeoutMs: 30_000 })).verdict)));
  const df = await sb.exec(['sh', '-c', "df -k / | tail -1 | awk '{print $2}'"]);
  t.true(Number(df.stdout.trim()) <= 64 * 1024, `the VM sees its own disk size: ${df.stdout}`);
  t.is((await sb.exec(['ls', '/'])).verdict, 'OK');
  await sb.exec(['rm', '-f', '/tmp/fill']);
  t.is((await sb.exec(['sh', '-c', 'echo fits > /tmp/small && cat /tmp/small'])).stdout, 'fits\n');
});

test('microvm: a recursive grep from / and reads of the guest kernel files end with the node intact: OK', async (t) => {
  const sb = await t.context.pdk.sandboxes.create(vm);
  t.teardown(() => sb.kill());
  await underAttack(t, 'microvm: recursive grep from /, /proc/kpage*', 'OK', async () =>
    only(await sustained(1500, async () => (await sb.exec(['sh', '-c', 'head -c 1048576 /proc/kpageflags /proc/kcore >/dev/null 2>&1; grep -r -s -I -D skip paddock-grep-needle / >/dev/null; true'], { timeoutMs: 60_000, maxOutputBytes: 64 * 1024 })).verdict)),
  );
  t.true(await stillWorks(sb));
});

test('microvm: overwriting /bin/sh changes only this VM: a fresh one of the same template has the original', async (t) => {
  const { pdk } = t.context;
  const a = await pdk.sandboxes.create(vm);
  t.teardown(() => a.kill());
  const before = (await a.exec(['sha256sum', '/bin/busybox'])).stdout.split(' ')[0];
  await underAttack(t, 'microvm: overwrite /bin/sh, then a fresh VM', 'ISOLATED', async () => {
    await sustained(1500, async () => {
      await a.exec(['/bin/busybox', 'sh', '-c', 'rm -f /bin/sh; printf "#!/bin/busybox ash\\necho pwned\\n" > /bin/sh; chmod 755 /bin/sh']);
      return '';
    });
    t.is((await a.exec(['/bin/sh', '-c', 'echo hi'])).stdout, 'pwned\n');
    const b = await pdk.sandboxes.create(vm);
    try {
      const r = await b.exec(['sh', '-c', 'echo clean; sha256sum /bin/busybox']);
      return r.stdout.startsWith('clean\n') && r.stdout.includes(before as string) ? 'ISOLATED' : `LEAKED ${r.stdout}`;
    } finally {
      await b.kill();
    }
  });
});
