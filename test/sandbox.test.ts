import { clusterTest } from './helpers/cluster.ts';

const test = clusterTest();

test('create, exec, kill: a trainer drives a container sandbox end to end', async (t) => {
  const { pdk } = t.context;
  const sb = await pdk.sandboxes.create({ backend: 'container', image: 'busybox', cpu: 1, memoryMiB: 256, ttlSec: 600, labels: { job: 'spine' } });
  t.is(sb.info.state, 'running');
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
});
