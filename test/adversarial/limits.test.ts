/** Attacks on resources: each one ends in a verdict, the sandbox survives it, the neighbour does not notice. */
import { statfs } from 'node:fs/promises';
import { PaddockError, type Sandbox } from '../../sdk/index.ts';
import { advTest, only, sustained, underAttack } from './harness.ts';

const test = advTest();


async function stillWorks(sb: Sandbox): Promise<boolean> {
  // A killed tree's processes take a moment to be reaped and leave the pids count.
  for (let i = 0; i < 20; i++) {
    const r = await sb.exec(['echo', 'ok'], { timeoutMs: 5000 }).catch(() => null);
    if (r?.stdout === 'ok\n') return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}

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
  const home = await statfs(t.context.home);
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
  const after = await statfs(t.context.home);
  // The layer is not on the node's disk: tens of MiB written inside cost it nothing.
  t.true((home.bavail - after.bavail) * after.bsize < 32 * 1024 * 1024);
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
