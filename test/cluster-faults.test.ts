/**
 * Paddock on a NATS cluster of three servers, with one of them killed in the middle of a create
 * burst: every create the trainer sent either made exactly one sandbox or failed with a clear
 * error, and the directory and the nodes agree on which sandboxes live. Sandboxes are simulated
 * (the fault is in NATS, not in the backend); nodes, placement and the SDK are the real ones.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Kvm } from '@nats-io/kv';
import type { TestFn } from 'ava';
import anyTest from 'ava';
import { type NodeProcess, startNode } from '../ops/local.ts';
import { type NatsCluster, startNatsCluster } from '../ops/nats.ts';
import { Buckets, decode, encode, type Reply, subjects } from '../protocol/index.ts';
import { connectionOf } from '../sdk/client.ts';
import { Paddock, PaddockError } from '../sdk/index.ts';
import { SHARED_IMAGES } from './helpers/paths.ts';
import { eventually } from './helpers/wait.ts';

const run = promisify(execFile);

const CLI = fileURLToPath(new URL('../ops/bin/paddock.js', import.meta.url));

interface Ctx {
  home: string;
  nats: NatsCluster;
  nodes: NodeProcess[];
  /** Placement replicas on their own (`paddock placement`): the nodes run none. */
  replicas: ChildProcess[];
}

/** `paddock placement` joined to `url`, once it serves. */
async function startReplica(url: string, home: string): Promise<ChildProcess> {
  const child = spawn(process.execPath, [CLI, '--nats', url, 'placement'], { env: { ...process.env, PADDOCK_HOME: home }, stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    let seen = '';
    child.stdout?.on('data', (d: Buffer) => {
      seen = (seen + d.toString()).slice(-4000);
      if (seen.includes('placement ready')) resolve();
    });
    child.once('exit', (c) => reject(new Error(`paddock placement exited with ${c}: ${seen}`)));
  });
  child.stdout?.resume();
  return child;
}

async function stopReplica(child: ChildProcess, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill(signal);
  await gone;
}

const test = anyTest as TestFn<Ctx>;

test.before(async (t) => {
  const home = await mkdtemp(join(tmpdir(), 'paddock-cf-'));
  const nats = await startNatsCluster({ dataDir: join(home, 'nats'), servers: 3, logDir: join(home, 'logs') });
  const nodes: NodeProcess[] = [];
  const replicas: ChildProcess[] = [];
  t.context = { home, nats, nodes, replicas };
  for (let i = 0; i < 2; i++) replicas.push(await startReplica(nats.url, home));
  const env = { PADDOCK_PLACEMENT: '0', PADDOCK_BACKENDS: 'sim', PADDOCK_FN: '0', PADDOCK_HEARTBEAT_MS: '500', PADDOCK_SIM_SANDBOXES: '5000', PADDOCK_SIM_CPU: '5000', PADDOCK_SIM_MEMORY_MIB: String(5000 * 1024) };
  for (let i = 0; i < 2; i++) nodes.push(await startNode({ natsUrl: nats.url, home, id: `cf${process.pid}n${i}`, imagesDir: SHARED_IMAGES, env }));
});

test.after.always(async (t) => {
  const c = t.context;
  if (!c?.nats) return;
  await Promise.all(c.replicas.map((r) => stopReplica(r, 'SIGKILL')));
  await Promise.all(c.nodes.map((n) => n.stop()));
  await c.nats.stop();
  if (!process.env.PADDOCK_TEST_KEEP) await rm(c.home, { recursive: true, force: true });
});

/** What each node says it runs. */
async function nodeIds(pdk: Paddock, nodes: NodeProcess[]): Promise<Map<string, string[]>> {
  const nc = connectionOf(pdk);
  const out = new Map<string, string[]>();
  for (const n of nodes) {
    const m = await nc.request(subjects.node(n.id, 'info'), encode({}), { timeout: 30_000 });
    const r = decode(m.data) as Reply<{ ids: string[] }>;
    if (!r.ok) throw new Error(r.error.message);
    out.set(n.id, r.result.ids);
  }
  return out;
}

test.serial('SIGKILL of one NATS server of three during a create burst: every create made one sandbox or failed clearly, none twice', async (t) => {
  const { nats, nodes } = t.context;
  // The trainer is on the server that is killed (the others it learns from the cluster's INFO):
  // its creates in flight are the ones in doubt.
  const pdk = await Paddock.connect({ servers: nats.urls[0] as string, timeoutMs: 60_000 });
  try {
    const N = 600;
    const made: string[] = [];
    const failed: PaddockError[] = [];
    const other: unknown[] = [];
    let next = 0;
    let killed = false;
    const killedAt = 150;
    const worker = async () => {
      while (next < N) {
        next++;
        try {
          const sb = await pdk.sandboxes.create({ backend: 'sim', group: 'burst' });
          made.push(sb.id);
        } catch (err) {
          if (err instanceof PaddockError) failed.push(err);
          else other.push(err);
        }
        if (!killed && made.length + failed.length >= killedAt) {
          killed = true;
          await nats.kill(0);
          // Back while the burst goes on: clients and the cluster take it in again.
          void nats.restart(0);
        }
      }
    };
    await Promise.all(Array.from({ length: 40 }, worker));
    t.true(killed);
    t.deepEqual(other, [], 'every failure is a PaddockError with a code');
    t.log(`${made.length} made, ${failed.length} failed`);
    for (const e of failed) t.log(`${e.code}: ${e.message}`);
    t.is(made.length + failed.length, N);
    t.is(new Set(made).size, made.length, 'no id answered twice');
    // Most creates get through a server's loss: a few in doubt may fail, but not the burst.
    t.true(made.length >= N / 2, `${made.length} of ${N} made`);

    // The directory and the nodes agree: each sandbox a create answered lives once, on one node,
    // and nothing lives that no create answered.
    let last: string[] = [];
    const listed = await eventually(async () => {
      const l = (await pdk.sandboxes.list({ group: 'burst' })).filter((s) => s.state === 'running');
      last = l.map((s) => s.id);
      return l.length === made.length ? l : undefined;
    }, 60_000);
    if (!listed) t.log(`listed ${last.length}; made but not listed: ${made.filter((id) => !last.includes(id)).slice(0, 5).join(' ')}; listed but not made: ${last.filter((id) => !made.includes(id)).slice(0, 5).join(' ')}`);
    t.truthy(listed, 'the directory lists every sandbox made');
    const listedIds = (listed ?? []).map((s) => s.id);
    t.is(new Set(listedIds).size, listedIds.length, 'listed once each');
    t.deepEqual([...listedIds].sort(), [...made].sort());
    const byNode = await nodeIds(pdk, nodes);
    const onNodes = [...byNode.values()].flat();
    const twice = onNodes.filter((id, i) => onNodes.indexOf(id) !== i);
    if (twice.length > 0) t.log(`on two nodes: ${twice.slice(0, 5).join(' ')}`);
    t.is(new Set(onNodes).size, onNodes.length, 'no sandbox runs on two nodes');
    t.deepEqual([...onNodes].sort(), [...made].sort(), 'the nodes run exactly the sandboxes made');
    await pdk.groups.kill('burst');

    // What `paddock status` says of the cluster: its size, and three replicas of every bucket.
    // Once the cluster has taken its server back: until then a stream electing its leader says so.
    const streams = ['KV_pdk_sandboxes', 'KV_pdk_nodes', 'KV_pdk_rollouts', 'PDK_CHRONUS'];
    let stdout = '';
    await eventually(async () => {
      ({ stdout } = await run(process.execPath, [CLI, '--nats', nats.url, 'status'], { env: { ...process.env, PADDOCK_HOME: join(t.context.home, 'cli') } }));
      return streams.every((s) => new RegExp(`replicas: .*${s} 3`).test(stdout));
    }, 60_000);
    t.regex(stdout, /cluster paddock of 3 servers/);
    for (const stream of streams) t.regex(stdout, new RegExp(`replicas: .*${stream} 3`));
    t.notRegex(stdout, /fewer than/);
  } finally {
    await pdk.close();
  }
});

test.serial('a rolling restart of every placement replica during a create burst loses no create', async (t) => {
  const { nats, home, replicas } = t.context;
  const pdk = await Paddock.connect({ servers: nats.url, timeoutMs: 60_000 });
  try {
    const N = 1500;
    const made: string[] = [];
    const failed: string[] = [];
    let next = 0;
    let restarted: Promise<void> | undefined;
    const worker = async () => {
      while (next < N) {
        next++;
        try {
          made.push((await pdk.sandboxes.create({ backend: 'sim', group: 'rolling' })).id);
        } catch (err) {
          failed.push(err instanceof PaddockError ? `${err.code}: ${err.message}` : String(err));
        }
        // Each replica in turn: drained by SIGTERM (it finishes what it holds), then a new one.
        restarted ??= made.length >= 50 ? (async () => {
          for (let i = 0; i < replicas.length; i++) {
            const t0 = Date.now();
            await stopReplica(replicas[i] as ChildProcess);
            const t1 = Date.now();
            replicas[i] = await startReplica(nats.url, home);
            t.log(`replica ${i}: stopped in ${t1 - t0} ms, started in ${Date.now() - t1} ms; ${made.length} made`);
          }
        })() : undefined;
      }
    };
    await Promise.all(Array.from({ length: 20 }, worker));
    await restarted;
    t.truthy(restarted, 'the replicas were restarted during the burst');
    t.deepEqual(failed, []);
    t.is(new Set(made).size, N);
    const listed = await eventually(async () => {
      const l = (await pdk.sandboxes.list({ group: 'rolling' })).filter((s) => s.state === 'running');
      return l.length === N ? l : undefined;
    }, 60_000);
    t.truthy(listed);
    await pdk.groups.kill('rolling');
  } finally {
    await pdk.close();
  }
});

test.serial('a node stopped long enough to be taken for lost writes its sandboxes back when it goes on', async (t) => {
  const { nats, nodes } = t.context;
  const victim = nodes[1] as NodeProcess;
  const pdk = await Paddock.connect({ servers: nats.url, timeoutMs: 60_000 });
  // Whatever happens below, the node is not left stopped: a stopped process ignores SIGTERM.
  const resume = () => void victim.proc.kill('SIGCONT');
  t.teardown(resume);
  try {
    const sbs = await Promise.all(Array.from({ length: 10 }, () => pdk.sandboxes.create({ backend: 'sim', group: 'stalled', node: victim.id })));
    const ids = sbs.map((s) => s.id);
    const states = async () => (await pdk.sandboxes.list({ group: 'stalled', all: true })).filter((s) => ids.includes(s.id));
    victim.proc.kill('SIGSTOP');
    try {
      const marked = await eventually(async () => {
        const l = await states();
        return l.length === ids.length && l.every((s) => s.state === 'failed' && s.reason === 'node_lost') ? l : undefined;
      }, 90_000);
      t.truthy(marked, 'the stopped node was taken for lost and its sandboxes marked');
    } finally {
      resume();
    }
    const back = await eventually(async () => {
      const l = await states();
      return l.length === ids.length && l.every((s) => s.state === 'running' && s.reason === undefined) ? l : undefined;
    }, 60_000);
    t.truthy(back, 'every sandbox reads running again once the node goes on');
    for (const sb of sbs) t.is((await sb.exec(['true'])).exitCode, 0);
    const table = await new Kvm(connectionOf(pdk)).open(Buckets.nodes);
    const read = async () => {
      const e = await table.get(victim.id);
      return e?.operation === 'PUT' ? (decode(e.value) as { lostAt?: number; ts: number }) : undefined;
    };
    // Heartbeats go on: a record written after the one read now, and none carries the mark.
    const seen = (await read())?.ts ?? 0;
    const record = await eventually(async () => {
      const r = await read();
      return r && r.lostAt === undefined && r.ts > seen ? r : undefined;
    }, 30_000);
    t.truthy(record, 'the node record carries new heartbeats and no lostAt');
    await pdk.groups.kill('stalled');
  } finally {
    await pdk.close();
  }
});

test.serial('SIGKILL of a node process: its sandboxes are marked failed, node_lost, and creates go on elsewhere', async (t) => {
  const { nats, nodes } = t.context;
  const pdk = await Paddock.connect({ servers: nats.url, timeoutMs: 60_000 });
  try {
    const sbs = await Promise.all(Array.from({ length: 40 }, (_, i) => pdk.sandboxes.create({ backend: 'sim', group: 'lost', node: (nodes[i % 2] as NodeProcess).id })));
    const victim = nodes[1] as NodeProcess;
    const theirs = sbs.filter((s) => s.info.node === victim.id).map((s) => s.id);
    t.is(theirs.length, 20);
    victim.proc.kill('SIGKILL');
    await victim.exited;
    const marked = await eventually(async () => {
      const l = await pdk.sandboxes.list({ group: 'lost', all: true });
      const lost = l.filter((s) => theirs.includes(s.id) && s.state === 'failed' && s.reason === 'node_lost');
      return lost.length === theirs.length ? l : undefined;
    }, 90_000);
    t.truthy(marked, "every sandbox of the killed node is marked node_lost");
    const mine = (marked ?? []).filter((s) => !theirs.includes(s.id));
    t.true(mine.every((s) => s.state === 'running'), 'the other node\'s sandboxes run on');
    t.regex((marked ?? []).find((s) => s.reason === 'node_lost')?.error?.message ?? '', /stopped answering/);
    const after = await pdk.sandboxes.create({ backend: 'sim', group: 'lost' });
    t.is(after.info.node, (nodes[0] as NodeProcess).id);
    await pdk.groups.kill('lost');
  } finally {
    await pdk.close();
  }
});
