/**
 * Helpers that keep a node fast with thousands of sandboxes (see ops/bench/density.ts for the
 * measurements), and what the host offers QoS beyond SCHED_IDLE: each tested against the real
 * kernel, without a node.
 */
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import test from 'ava';
import { isMountPoint } from '../runtime/cgroups.ts';
import { coreSchedulingAvailable, schedCoreInConfig } from '../runtime/qos.ts';

const sh = promisify(execFile);

test('isMountPoint tells a mount from a plain directory, and a missing path is not one', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'paddock-mp-'));
  const target = join(dir, 'm');
  await mkdir(target);
  t.teardown(async () => {
    await sh('umount', [target]).catch(() => {});
    await rm(dir, { recursive: true, force: true });
  });
  t.false(await isMountPoint(target));
  await sh('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'paddock-test', target]);
  t.true(await isMountPoint(target));
  await sh('umount', [target]);
  t.false(await isMountPoint(target));
  t.false(await isMountPoint(join(dir, 'missing')));
});

test('core scheduling: read from the kernel config, and never claimed without the kernel option', async (t) => {
  t.true(schedCoreInConfig('CONFIG_SMP=y\nCONFIG_SCHED_CORE=y\n'));
  t.false(schedCoreInConfig('CONFIG_SMP=y\n# CONFIG_SCHED_CORE is not set\n'));
  t.is(schedCoreInConfig('CONFIG_SMP=y\n'), null);
  const c = await coreSchedulingAvailable();
  t.true(['kconfig', 'prctl', 'unknown'].includes(c.source));
  if (c.available) t.is(c.kernel, true);
  t.regex(c.detail, /core scheduling (un)?available/);
});
