/**
 * The command log across restarts: NATS restarted between steps keeps the log (file storage), and
 * a step in flight when its node died is UNKNOWN_OUTCOME, never run again.
 */
import { join } from 'node:path';
import test from 'ava';
import { startNats } from '../ops/nats.ts';
import { type Sandbox, UnknownOutcomeError } from '../sdk/index.ts';
import { restartNode, startTestCluster, stopTestCluster } from './helpers/cluster.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Retries `f` while it fails (NATS or JetStream coming back), up to `ms`. */
async function eventually<T>(f: () => Promise<T>, ms = 30_000): Promise<T> {
  const until = Date.now() + ms;
  for (;;) {
    try {
      return await f();
    } catch (err) {
      if (Date.now() > until) throw err;
      await sleep(200);
    }
  }
}

/** Until a command whose line holds `marker` runs in the sandbox: the node has the step (a fixed sleep was a guess). */
async function running(sb: Sandbox, marker: string): Promise<void> {
  await eventually(async () => {
    const ps = await sb.exec(['ps', '-o', 'args']);
    if (!ps.stdout.split('\n').some((l) => l.includes(marker) && !l.includes('ps -o'))) throw new Error(`not running yet: ${marker}`);
  });
}

test('NATS restarted between steps: the log survives and the rollout replays', async (t) => {
  const c = await startTestCluster();
  let nats = c.cluster.nats;
  // Teardowns run last-registered first: the cluster stops while the restarted NATS still runs.
  t.teardown(() => nats.stop());
  t.teardown(() => stopTestCluster(c));
  const { pdk } = c;
  const ro = await pdk.rollouts.start({ rolloutId: 'restart-nats' });
  const s0 = await ro.exec('echo one >> /work/log; cat /work/log');
  const s1 = await ro.exec('echo two >> /work/log; cat /work/log');

  await nats.stop();
  nats = await startNats({ dataDir: join(c.home, 'nats'), port: c.cluster.nats.port });
  // The node and this client reconnect on their own (a request sent meanwhile may be lost: wait for one to get through).
  await eventually(() => ro.sandbox.exec(['true'], { timeoutMs: 1000 }), 60_000);
  const s2 = await eventually(() => ro.exec('echo three >> /work/log; cat /work/log', { step: 2 }));
  t.false(s2.replayed);
  t.is(s2.stdout, 'one\ntwo\nthree\n');

  const again = await pdk.rollouts.attach(ro.rolloutId);
  t.is(again.lastStep, 2);
  t.deepEqual(await again.exec('echo one >> /work/log; cat /work/log'), { ...s0, replayed: true });
  t.deepEqual(await again.exec('echo two >> /work/log; cat /work/log'), { ...s1, replayed: true });
  // Through the node as well (no prefetch).
  const third = await pdk.rollouts.attach(ro.rolloutId, { prefetch: false });
  t.deepEqual(await third.exec('echo one >> /work/log; cat /work/log'), { ...s0, replayed: true });
  t.is(await ro.sandbox.files.readText('/work/log'), 'one\ntwo\nthree\n');

  // NATS goes away while a step runs: the node keeps trying to record the result until it is back.
  const during = third.exec('sleep 1; echo four >> /work/log; echo done', { step: 3, timeoutMs: 10_000 });
  during.catch(() => {});
  await running(ro.sandbox, 'echo four');
  await nats.stop();
  nats = await startNats({ dataDir: join(c.home, 'nats'), port: c.cluster.nats.port });
  await during.catch(() => {}); // the answer itself may be lost with the connection
  await eventually(() => ro.sandbox.exec(['true'], { timeoutMs: 1000 }), 60_000);
  const fourth = await pdk.rollouts.attach(ro.rolloutId, { prefetch: false });
  t.is(fourth.lastStep, 3);
  const s3 = await eventually(() => fourth.exec('sleep 1; echo four >> /work/log; echo done', { step: 3, timeoutMs: 10_000 }));
  t.true(s3.replayed);
  t.is(s3.stdout, 'done\n');
  t.is(await ro.sandbox.files.readText('/work/log'), 'one\ntwo\nthree\nfour\n');
  await pdk.rollouts.delete(ro.rolloutId, { kill: true });
});

test('a step in flight when its node died is UNKNOWN_OUTCOME, and is never run again', async (t) => {
  const c = await startTestCluster();
  t.teardown(() => stopTestCluster(c));
  const { pdk, cluster, home } = c;
  const ro = await pdk.rollouts.start({ rolloutId: 'node-died' });
  await ro.exec('echo before >> /work/log');
  const inflight = ro.exec('sleep 2; echo during >> /work/log', { timeoutMs: 5000 });
  inflight.catch(() => {});
  await running(ro.sandbox, 'echo during');
  const node = cluster.nodes[0]!;
  node.proc.kill('SIGKILL');
  await node.exited;
  // Its node is back (and has taken the sandbox up, the step's process running on in it).
  cluster.nodes[0] = await restartNode({ cluster, home }, node.id);
  await t.throwsAsync(inflight);

  // A new sandbox picks up the rollout's log: step 0 replays, step 1 is unknown, step 2 runs.
  const sb = await pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  t.true((await sb.exec('echo before >> /work/log', { rolloutId: ro.rolloutId, step: 0 })).replayed);
  const err = await t.throwsAsync(sb.exec('sleep 2; echo during >> /work/log', { rolloutId: ro.rolloutId, step: 1, timeoutMs: 5000 }), { instanceOf: UnknownOutcomeError });
  t.is(err?.code, 'UNKNOWN_OUTCOME');
  t.false(err?.retryable);
  t.regex(err?.message ?? '', new RegExp(`in flight on node ${node.id}`));
  // Again, and through an attached rollout: the same answer, never a run.
  await t.throwsAsync(sb.exec('sleep 2; echo during >> /work/log', { rolloutId: ro.rolloutId, step: 1, timeoutMs: 5000 }), { instanceOf: UnknownOutcomeError });
  t.false((await sb.exec('echo after >> /work/log', { rolloutId: ro.rolloutId, step: 2 })).replayed ?? false);
  t.is(await sb.files.readText('/work/log'), 'after\n', 'this sandbox ran only step 2');
  await pdk.rollouts.delete(ro.rolloutId);
});
