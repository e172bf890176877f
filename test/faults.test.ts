/**
 * Faults injected into a running Paddock, one case per fault: nats-server stopped and started
 * again under a node with sandboxes and a streamed exec, a node killed, a NATS_URL list whose
 * first server is down. Each asserts what a user relies on: sandboxes alive afterwards, records
 * true, no output lost without a marker, a clear error instead of a long silence.
 */
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { JetStreamApiError, jetstreamManager } from '@nats-io/jetstream';
import { connect } from '@nats-io/transport-node';
import anyTest, { type TestFn } from 'ava';
import { STREAM_CHUNK_BYTES } from '../actors/exec-stream.ts';
import { type NodeProcess, startNode } from '../ops/local.ts';
import { natsFailure } from '../protocol/index.ts';
import { type ExecStreamEvent, Paddock, PaddockError, type Sandbox } from '../sdk/index.ts';
import { type ClusterContext, SHARED_IMAGES, startTestCluster, stopTestCluster } from './helpers/cluster.ts';
import { paddockUp } from './helpers/up.ts';
import { eventually } from './helpers/wait.ts';

const test = anyTest as TestFn<ClusterContext>;

test.before(async (t) => {
  // A small stream buffer, so that one case can outrun it and see the gap.
  Object.assign(t.context, await startTestCluster({ env: { PADDOCK_STREAM_BUFFER_BYTES: '4096' } }));
});
test.after.always(async (t) => {
  await stopTestCluster(t.context.cluster ? t.context : undefined);
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `probe` until it returns something truthy (or `ms` pass: then the last value). */

/** A loopback port nothing listens on. */
async function deadPort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as { port: number }).port;
  await new Promise((r) => srv.close(r));
  return port;
}

test.serial('a NATS restart keeps sandboxes running; the node re-publishes their true state', async (t) => {
  const { cluster, pdk } = t.context;
  const sb = await pdk.sandboxes.create({ image: 'busybox', memoryMiB: 64, ttlSec: 600 });
  // Its TTL runs out while NATS is away: the node cannot write that it stopped until NATS is back.
  const brief = await pdk.sandboxes.create({ image: 'busybox', memoryMiB: 64, ttlSec: 2 });
  await sb.files.write('/tmp/state', 'kept');
  await cluster.nats.stop();
  await sleep(3000);
  await cluster.restartNats();

  // The sandbox kept its processes and files: it was never told NATS went away.
  const r = await eventually(() => sb.exec(['cat', '/tmp/state'], { timeoutMs: 5000 }));
  t.is(r?.stdout, 'kept');
  t.is((await sb.refresh()).state, 'running');
  // The record written while NATS was away was written again once it came back.
  const ended = await eventually(async () => {
    const rec = (await pdk.sandboxes.list({ all: true })).find((s) => s.id === brief.id);
    return rec?.state === 'stopped' ? rec : undefined;
  });
  t.is(ended?.state, 'stopped');
  t.is(ended?.reason, 'ttl');
  const live = (await pdk.sandboxes.list()).find((s) => s.id === sb.id);
  t.is(live?.state, 'running');
  // Placement sees the node again: a create is answered.
  const again = await eventually(() => pdk.sandboxes.create({ image: 'busybox', memoryMiB: 64 }, { timeoutMs: 10_000 }));
  t.truthy(again);

  const log = await readFile(cluster.nodes[0]?.logFile as string, 'utf8');
  t.regex(log, /lost NATS: sandboxes keep running/);
  t.regex(log, /re-published sandbox records after reconnect/);
  await Promise.all([sb.kill(), again?.kill()]);
});

test.serial('NATS_URL with a dead server first: the SDK and a node use the live one', async (t) => {
  const { cluster, home } = t.context;
  const list = `nats://127.0.0.1:${await deadPort()},${cluster.nats.url}`;
  const pdk = await Paddock.connect({ servers: list, timeoutMs: 30_000 });
  try {
    const nodes = await pdk.nodes.list();
    t.true(nodes.length >= 1);
  } finally {
    await pdk.close();
  }
  // The CLI and the node read NATS_URL the same way.
  const extra = await startNode({ natsUrl: list, home, id: `${cluster.nodes[0]?.id}x`, env: { PADDOCK_FN_BUILD: '0', PADDOCK_PLACEMENT: '0' }, imagesDir: SHARED_IMAGES });
  try {
    const pdk2 = await Paddock.connect({ servers: cluster.nats.url });
    const ids = (await pdk2.nodes.list()).map((n) => n.node);
    await pdk2.close();
    t.true(ids.includes(extra.id), `${extra.id} registered through the list: ${ids.join(',')}`);
  } finally {
    await extra.stop();
  }
});

/** Collects a stream: its text, its gaps, and how it ended. */
async function drain(it: AsyncIterable<ExecStreamEvent>, onEvent: (n: number) => Promise<void> = async () => {}) {
  let out = '';
  const gaps: Array<{ events: number; bytes: number }> = [];
  let exit: number | undefined;
  let n = 0;
  for await (const ev of it) {
    if (ev.type === 'stdout') out += ev.text;
    else if (ev.type === 'gap') gaps.push({ events: ev.events, bytes: ev.bytes });
    else if (ev.type === 'exit') exit = ev.exitCode;
    await onEvent(++n);
  }
  return { out, gaps, exit };
}

test.serial('a stream across a NATS restart loses nothing: what was missed is sent again', async (t) => {
  const { cluster, pdk } = t.context;
  const sb = await pdk.sandboxes.create({ image: 'busybox', memoryMiB: 64 });
  t.teardown(() => sb.kill().then(() => {}));
  const script = 'i=0; while [ $i -lt 30 ]; do echo line$i; i=$((i+1)); sleep 0.1; done';
  const r = await drain(sb.execStream(['sh', '-c', script]), async (n) => {
    // Mid-stream: NATS goes away for a second and a half while the command keeps printing.
    if (n === 3) {
      await cluster.nats.stop();
      await sleep(1500);
      await cluster.restartNats();
    }
  });
  t.is(r.exit, 0);
  t.deepEqual(r.gaps, []);
  t.is(r.out, Array.from({ length: 30 }, (_, i) => `line${i}\n`).join(''));
});

test.serial('output the node no longer holds comes back as a gap event with its size', async (t) => {
  const { cluster, pdk } = t.context;
  const sb = await pdk.sandboxes.create({ image: 'busybox', memoryMiB: 64 });
  t.teardown(() => sb.kill().then(() => {}));
  // Three events' worth of output while NATS is away, against a buffer of 4 KiB: the newest event
  // is kept whatever its size, so output that fits one event would all come back, with no gap.
  const big = 3 * STREAM_CHUNK_BYTES;
  const script = `echo start; sleep 1; head -c ${big} /dev/zero | tr '\\0' x; echo; sleep 2; echo end`;
  const r = await drain(sb.execStream(['sh', '-c', script]), async (n) => {
    if (n === 1) {
      await cluster.nats.stop();
      await sleep(2000);
      await cluster.restartNats();
    }
  });
  t.is(r.exit, 0);
  t.is(r.gaps.length, 1, 'one explicit gap');
  t.true(r.out.startsWith('start\n') && r.out.endsWith('end\n'), r.out.slice(0, 40));
  // Every byte is either received or counted in the gap.
  const total = 'start\n'.length + big + 1 + 'end\n'.length;
  t.is(Buffer.byteLength(r.out) + (r.gaps[0]?.bytes ?? 0), total);
});

test.serial('a stream whose node is killed ends with UNAVAILABLE; the node restarted takes its sandbox up', async (t) => {
  const { cluster, pdk, home } = t.context;
  const sb = await pdk.sandboxes.create({ image: 'busybox', memoryMiB: 64 });
  const old = cluster.nodes[0] as NodeProcess;
  const it = sb.execStream(['sh', '-c', 'echo up; sleep 60']);
  const first = await it.next();
  t.is(first.value && first.value.type === 'stdout' ? first.value.text : '', 'up\n');
  old.proc.kill('SIGKILL');
  await old.exited;
  // Within the stream's liveness probe (seconds), not at the exec's timeout (70 s).
  const err = await t.throwsAsync(it.next());
  t.is((err as { code?: string }).code, 'UNAVAILABLE');
  t.regex(err?.message ?? '', /no longer answers/);
  // The node comes back under its id and takes the sandbox up: it ran on, and answers again. The
  // exec's process, whose caller saw it fail, was ended at the take-up: it does not go on unseen.
  const back = await startNode({ natsUrl: cluster.url, home, id: old.id, env: { PADDOCK_FN_BUILD: '0', PADDOCK_HEARTBEAT_MS: '500', PADDOCK_STREAM_BUFFER_BYTES: '4096' }, imagesDir: SHARED_IMAGES });
  cluster.nodes[0] = back;
  const rec = (await pdk.sandboxes.list({ all: true })).find((s) => s.id === sb.id);
  t.is(rec?.state, 'running');
  t.is((await sb.exec(['sh', '-c', 'ps -o comm | grep -c "^sleep$"'])).stdout, '0\n');
  await sb.kill();
});

function alive(pid: number | undefined): boolean {
  if (!pid) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Whether any cgroup hierarchy still holds a directory for this sandbox of this node. */
function cgroupLeft(node: string, id: string): boolean {
  for (const root of ['/sys/fs/cgroup', '/sys/fs/cgroup/pids', '/sys/fs/cgroup/memory', '/sys/fs/cgroup/cpu,cpuacct']) {
    if (existsSync(join(root, 'paddock', node, id))) return true;
  }
  return false;
}

test.serial('paddock up restarts a nats-server and a node that died, and stops NATS only when stopped', async (t) => {
  t.timeout(300_000);
  const up = await paddockUp(t);
  const first = up.record();
  const pdk = await Paddock.connect({ servers: first.nats, timeoutMs: 30_000 });
  t.teardown(() => Promise.race([pdk.close().catch(() => {}), sleep(5000)]).then(() => {}));
  const sb = await pdk.sandboxes.create({ image: 'busybox', memoryMiB: 64 });
  await sb.files.write('/tmp/state', 'kept');

  // nats-server dies (SIGTERM, as a person or an OOM-averse init would send it) in the middle of
  // a streamed exec: up starts it again on the same port; the sandbox never notices and the
  // stream carries on with every line, none lost and no gap.
  const script = 'i=0; while [ $i -lt 30 ]; do echo line$i; i=$((i+1)); sleep 0.1; done';
  const streamed = await drain(sb.execStream(['sh', '-c', script]), async (n) => {
    if (n === 3) process.kill(first.natsPid as number, 'SIGTERM');
  });
  t.is(streamed.exit, 0);
  t.deepEqual(streamed.gaps, []);
  t.is(streamed.out, Array.from({ length: 30 }, (_, i) => `line${i}\n`).join(''));
  const second = await eventually(async () => {
    const r = up.record();
    return r.natsPid !== first.natsPid && alive(r.natsPid) ? r : undefined;
  });
  t.truthy(second, up.out());
  t.is(second?.nats, first.nats);
  t.is(up.child.exitCode, null, 'up is still running');
  // The record still names everything up runs (`paddock status` reads it), the gateway included.
  const after = up.record();
  t.truthy(first.http);
  t.is(after.http, first.http);
  t.is(after.startedAt, first.startedAt);
  const r = await eventually(() => sb.exec(['cat', '/tmp/state'], { timeoutMs: 5000 }));
  t.is(r?.stdout, 'kept');
  t.is((await sb.refresh()).state, 'running');

  // The node is SIGKILLed in the middle of 20 creates: every create ends with a clear code (the
  // ones it had not answered cannot know whether it made them), up starts the node again, and its
  // start takes up the sandboxes that were made and removes the ones still being made, saying so
  // in their records: no orphan keeps running, and none that was made is lost.
  // Placement ran in the killed node: the creates it held end when the SDK's probe finds no
  // replica holding them, as UNAVAILABLE (placement_lost), not at their timeout (TIMEOUT).
  // The kill comes as the fourth create is answered, not once a listing shows four: under load the
  // listing lagged until all 20 were made, and none was left in flight to fail.
  const made: Sandbox[] = [];
  let killed = false;
  const creates = Array.from({ length: 20 }, () =>
    pdk.sandboxes.create({ image: 'busybox', memoryMiB: 64 }, { timeoutMs: 120_000 }).then((s) => {
      if (killed) return s;
      made.push(s);
      if (made.length >= 4) {
        killed = true;
        process.kill(first.nodePid as number, 'SIGKILL');
      }
      return s;
    }),
  );
  const settled = await Promise.allSettled(creates);
  t.true(killed, 'four creates went through before the kill');
  const failed = settled.flatMap((s) => (s.status === 'rejected' ? [s.reason as PaddockError] : []));
  t.true(failed.length > 0, 'some creates were in flight at the kill');
  for (const err of failed) {
    t.true(err instanceof PaddockError, String(err));
    t.is(err.code, 'UNAVAILABLE', String(err));
    t.is(err.detail?.reason, 'placement_lost', String(err));
    t.regex(err.message, /may have been made/);
  }
  const third = await eventually(async () => {
    const rec = up.record();
    return rec.nodePid !== first.nodePid && alive(rec.nodePid) ? rec : undefined;
  }, 120_000);
  t.truthy(third, up.out());
  t.true(alive(third?.natsPid), 'NATS stayed up while the node was down');
  const held = [...new Set([sb.id, ...made.map((s) => s.id), ...settled.flatMap((s) => (s.status === 'fulfilled' ? [s.value.id] : []))])];
  const recs = await eventually(async () => {
    const all = await pdk.sandboxes.list({ all: true, node: first.node });
    const r = held.map((id) => all.find((x) => x.id === id));
    return r.every((x) => x?.state === 'running' || x?.state === 'failed') ? r : undefined;
  }, 60_000);
  t.truthy(recs, 'every sandbox the killed node held is settled');
  const kept = (recs ?? []).filter((x) => x?.state === 'running').map((x) => x?.id as string);
  for (const rec of recs ?? []) if (rec?.state === 'failed') t.is(rec.reason, 'node_restarted');
  // The one made before the faults, and the four made before the kill, ran through it, files and all.
  for (const id of [sb.id, ...made.map((s) => s.id)]) t.true(kept.includes(id), `${id} taken up`);
  t.is((await sb.exec(['cat', '/tmp/state'])).stdout, 'kept');
  // No record claims a sandbox runs that does not (those listed besides the kept ones are creates
  // whose caller was told they may have been made: they were), nothing of the failed ones is left
  // on the host, and a kill of the listed ones leaves nothing either.
  const listed = (await pdk.sandboxes.list({ node: first.node })).map((s) => s.id);
  for (const id of kept) t.true(listed.includes(id), `${id} listed`);
  for (const id of listed) t.is((await (await pdk.sandboxes.get(id)).exec(['true'])).exitCode, 0, id);
  t.deepEqual(held.filter((id) => !kept.includes(id) && cgroupLeft(first.node, id)), []);
  for (const id of listed) await (await pdk.sandboxes.get(id)).kill();
  t.deepEqual([...held, ...listed].filter((id) => cgroupLeft(first.node, id)), []);
  const again = await pdk.sandboxes.create({ image: 'busybox', memoryMiB: 64 });
  t.is((await again.exec(['echo', 'ok'])).stdout, 'ok\n');
  await again.kill();

  await pdk.close();
  // Stopped on purpose: now everything goes, NATS last.
  process.kill(up.child.pid as number, 'SIGTERM');
  await up.exited;
  t.false(alive(third?.natsPid), 'nats-server stopped with up');
  t.false(alive(third?.nodePid), 'the node stopped with up');
});

test('NATS and JetStream failures are UNAVAILABLE with what and why, not raw client errors', async (t) => {
  // The error JetStream gave `sandboxes.list` on a full disk, as the client raises it.
  const full = natsFailure(new JetStreamApiError({ code: 500, err_code: 10049, description: 'error creating store for consumer: write: no space left on device' }), 'sandboxes.list');
  t.is(full?.code, 'UNAVAILABLE');
  t.like(full?.detail, { what: 'sandboxes.list', reason: 'disk_full' });
  t.regex(full?.message ?? '', /^sandboxes\.list is unavailable: JetStream cannot write its store/);
  // A real one: JetStream asked about a stream it has not.
  const nc = await connect({ servers: t.context.cluster.url });
  try {
    const err = await (await jetstreamManager(nc)).streams.info('PDK_NO_SUCH_STREAM').then(
      () => undefined,
      (e: unknown) => e,
    );
    const mapped = natsFailure(err, 'the bucket');
    t.is(mapped?.code, 'UNAVAILABLE', String(err));
    t.is(mapped?.toWire().retryable, true);
  } finally {
    await nc.close();
  }
  t.is(natsFailure(new Error('not a NATS error'), 'x'), undefined);
});
