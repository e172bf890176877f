/**
 * The disk under JetStream fills up while sandboxes run, under `paddock up`: a real tmpfs under
 * the embedded nats-server's store, filled to the last page. nats-server 2.9 then answers no
 * JetStream call at all (no error, only silence), and not even once space is freed, until it is
 * restarted: a full disk is told by looking at it, and `up` restarts a nats-server it saw so.
 */
import { readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import test from 'ava';
import { run } from '../runtime/proc.ts';
import { Paddock, PaddockError } from '../sdk/index.ts';
import { paddockUp } from './helpers/up.ts';
import { eventually } from './helpers/wait.ts';

test('a full disk under JetStream: sandboxes keep working, the command log and the directory say disk_full, the node logs it once', async (t) => {
  t.timeout(300_000);
  const up = await paddockUp(t, {
    prepare: async (home) => {
      await run('mkdir', ['-p', join(home, 'nats')]);
      await run('mount', ['-t', 'tmpfs', '-o', 'size=48m,mode=0755', 'paddock-test-full', join(home, 'nats')]);
    },
    cleanup: async (home) => void (await run('umount', ['-l', join(home, 'nats')], { allowFail: true })),
  });
  const natsDir = join(up.home, 'nats');
  const first = up.record();
  const pdk = await Paddock.connect({ servers: first.nats, timeoutMs: 30_000 });
  t.teardown(() => Promise.race([pdk.close().catch(() => {}), new Promise((r) => setTimeout(r, 5000))]).then(() => {}));

  const ro = await pdk.rollouts.start({ sandbox: { image: 'busybox', memoryMiB: 64 } });
  await ro.exec(['sh', '-c', 'echo zero > /tmp/log']);
  const sb = ro.sandbox;
  // A second rollout, for a second failure of the command log.
  const ro2 = await pdk.rollouts.start({ sandbox: { image: 'busybox', memoryMiB: 64 } });

  // Every block of the store's disk taken, as another writer on the host would take them.
  const filled = await run('dd', ['if=/dev/zero', `of=${join(natsDir, 'filler')}`, 'bs=1M'], { allowFail: true });
  t.regex(filled.stderr, /No space left/);
  // …to the last page (a 1 MiB block size leaves up to 1 MiB, room for small records).
  await run('dd', ['if=/dev/zero', `of=${join(natsDir, 'filler2')}`, 'bs=4k'], { allowFail: true });
  t.is(Number((await run('stat', ['-f', '-c', '%a', natsDir])).stdout.trim()), 0);

  // The sandbox never notices: its own work needs no JetStream.
  t.is((await sb.exec(['sh', '-c', 'echo alive; cat /tmp/log'])).stdout, 'alive\nzero\n');

  // nats-server acks what fits in its write cache before it reaches the disk: the first steps
  // after the fill may still be taken. Soon one is not, so it does not run, and says why.
  let failure: unknown;
  let taken = 0;
  for (; taken < 40 && failure === undefined; taken++) {
    failure = await ro.exec(['sh', '-c', `echo s${taken} >> /tmp/log`]).then(
      () => undefined,
      (e: unknown) => e,
    );
  }
  taken--;
  t.log(`${taken} steps were acked after the disk filled`);
  const failedStep = ro.nextStep;
  const t0 = Date.now();
  const second = await ro2.exec(['sh', '-c', 'echo again >> /tmp/log'], { timeoutMs: 200_000 }).then(
    () => undefined,
    (e: unknown) => e,
  );
  t.log(`second failure after ${Date.now() - t0} ms`);
  for (const err of [failure, second]) {
    t.true(err instanceof PaddockError, String(err));
    t.is((err as PaddockError).code, 'UNAVAILABLE', String(err));
    t.like((err as PaddockError).detail, { what: 'the command log', reason: 'disk_full' });
    t.regex((err as Error).message, /store is full \(.* KiB free/);
  }
  const ran = Array.from({ length: taken }, (_, i) => `s${i}\n`).join('');
  t.is((await sb.exec(['cat', '/tmp/log'])).stdout, `zero\n${ran}`, 'the unrecorded steps did not run');

  // The directory is JetStream too. A listing is a read: served while nats-server can still serve
  // it (it can, now that no step's write reaches the full store), else it fails the same way, not
  // with a raw client error.
  const t1 = Date.now();
  const listed = await pdk.sandboxes.list({ timeoutMs: 200_000 }).then(
    (l) => l,
    (e: unknown) => e,
  );
  t.log(Array.isArray(listed) ? `listed ${listed.length} in ${Date.now() - t1} ms` : `list failed after ${Date.now() - t1} ms`);
  if (Array.isArray(listed)) t.true(listed.some((s) => s.id === sb.id && s.state === 'running'), JSON.stringify(listed));
  else {
    t.true(listed instanceof PaddockError, String(listed));
    t.is((listed as PaddockError).code, 'UNAVAILABLE', String(listed));
    t.is((listed as PaddockError).detail?.reason, 'disk_full', String(listed));
  }

  // Logged by the node, once per failure and cause, not once per request.
  const log = (await readFile(join(up.home, 'logs', `node-${first.node}.log`), 'utf8')).split('\n');
  const said = log.filter((l) => l.includes('"reason":"disk_full"') && l.includes('"what":"the command log"'));
  t.is(said.length, 1, said.join('\n'));

  // Space again. nats-server 2.9 stays silent until restarted: up, having seen its disk full,
  // restarts it once there is room again. Then the step runs, once, and the record is true.
  // up looks at the store's disk every 2 s: it must have seen it full (the refusals above take
  // milliseconds now that a step is refused before its claim) to know a restart is due.
  await new Promise((r) => setTimeout(r, 5_000));
  await rm(join(natsDir, 'filler'));
  await rm(join(natsDir, 'filler2'));
  const restarted = await eventually(async () => {
    const r = up.record();
    return r.natsPid !== first.natsPid ? r : undefined;
  }, 60_000);
  t.truthy(restarted, up.out());
  t.regex(up.out(), /filled its disk .* has room again: restarting nats-server/);
  t.is(restarted?.nats, first.nats);
  const step = await eventually(() => ro.exec(['sh', '-c', 'echo one >> /tmp/log'], { timeoutMs: 10_000 }).catch(() => undefined), 90_000);
  t.is(step?.step, failedStep);
  t.is((await sb.exec(['cat', '/tmp/log'])).stdout, `zero\n${ran}one\n`);
  const rec = await eventually(async () => (await pdk.sandboxes.list().catch(() => [])).find((s) => s.id === sb.id), 60_000);
  t.is(rec?.state, 'running');
  await Promise.all([sb.kill(), ro2.sandbox.kill()]);
});
