/**
 * `paddock sim`: a fleet of simulated nodes in one process, against a real nats-server, driven
 * through placement like any Paddock: creates spread over its nodes, the directory lists each
 * sandbox once, a group verb reaches every node, and Ctrl-C stops every node, killing its
 * sandboxes and leaving no process behind.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import anyTest, { type TestFn } from 'ava';
import { type EmbeddedNats, startNats } from '../ops/nats.ts';
import { Paddock, type Sandbox } from '../sdk/index.ts';
import { SHARED_IMAGES } from './helpers/paths.ts';
import { eventually } from './helpers/wait.ts';

const CLI = fileURLToPath(new URL('../ops/bin/paddock.js', import.meta.url));
const NODES = ['sim-0', 'sim-1', 'sim-2'];
const N = 300;
const GROUP = 'fleet-job';

interface Context {
  home: string;
  nats: EmbeddedNats;
  fleet: ChildProcess;
  exited: Promise<number | null>;
  pdk: Paddock;
  stderr: () => string;
}

const test = anyTest as TestFn<Context>;

const alive = (pid: number | undefined) => {
  if (pid === undefined) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

test.before(async (t) => {
  const home = await mkdtemp(join(tmpdir(), 'paddock-test-sim-fleet-'));
  t.context.home = home;
  t.context.nats = await startNats({ dataDir: join(home, 'nats') });
  // The command a person runs: three nodes, one process (--per-process 3), one placement replica.
  const fleet = spawn(process.execPath, [CLI, 'sim', '--nats', t.context.nats.url, '--nodes', '3', '--per-process', '3', '--sandboxes-per-node', '1000'], {
    env: { ...process.env, PADDOCK_HOME: home, PADDOCK_IMAGES_DIR: SHARED_IMAGES, PADDOCK_HEARTBEAT_MS: '500', PADDOCK_LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  t.context.fleet = fleet;
  t.context.exited = new Promise((r) => fleet.once('exit', (c) => r(c)));
  let err = '';
  t.context.stderr = () => err;
  await new Promise<void>((resolve, reject) => {
    fleet.stderr?.on('data', (d: Buffer) => {
      err += d.toString();
      if (/3 nodes ready/.test(err)) resolve();
    });
    fleet.once('exit', (c) => reject(new Error(`paddock sim exited (${c}) before it was ready: ${err}`)));
  });
  t.context.pdk = await Paddock.connect({ servers: t.context.nats.url, timeoutMs: 60_000 });
});

test.after.always(async (t) => {
  const c = t.context;
  await c.pdk?.close().catch(() => {});
  if (c.fleet && c.fleet.exitCode === null && c.fleet.signalCode === null) {
    c.fleet.kill('SIGKILL');
    await c.exited;
  }
  await c.nats?.stop();
  if (c.home) await rm(c.home, { recursive: true, force: true });
});

test.serial('a fleet in one process: placement spreads creates, the directory lists each once, a group verb reaches every node, Ctrl-C kills them all', async (t) => {
  const { pdk, fleet } = t.context;
  const live = await eventually(async () => {
    const nodes = (await pdk.nodes.list()).filter((r) => r.state === 'serving');
    return NODES.every((id) => nodes.some((r) => r.node === id)) ? nodes : undefined;
  });
  t.truthy(live, 'every node of the fleet serves');
  for (const r of live ?? []) if (NODES.includes(r.node)) t.deepEqual(r.backends, ['sim']);

  // A few hundred creates, many in flight at once, as a trainer's burst.
  const sbs: Sandbox[] = [];
  for (let i = 0; i < N; i += 50) sbs.push(...(await Promise.all(Array.from({ length: Math.min(50, N - i) }, () => pdk.sandboxes.create({ backend: 'sim', group: GROUP })))));
  const perNode = new Map<string, number>();
  for (const sb of sbs) perNode.set(sb.info.node, (perNode.get(sb.info.node) ?? 0) + 1);
  t.deepEqual([...perNode.keys()].sort((a, b) => a.localeCompare(b)), NODES, 'every node got sandboxes');
  for (const [node, n] of perNode) t.true(n >= N / 3 / 4, `${node} holds ${n} of ${N}: spread, not packed on one`);

  const ids = sbs.map((s) => s.id).sort((a, b) => a.localeCompare(b));
  const listed = await pdk.sandboxes.list({ group: GROUP });
  t.is(listed.length, N, 'the listing has as many entries as sandboxes');
  t.deepEqual(listed.map((s) => s.id).sort((a, b) => a.localeCompare(b)), ids, 'each sandbox listed exactly once');

  // The group verb goes to every node; each node answers for its own sandboxes.
  const paused = await pdk.groups.pause(GROUP);
  t.is(paused.total, N);
  t.is(paused.ok, N);
  t.deepEqual(paused.unreachable, []);
  t.true(await eventually(async () => (await pdk.sandboxes.list({ group: GROUP, state: ['paused'] })).length === N), 'every sandbox paused');
  const byNode = await Promise.all(NODES.map(async (n) => (await pdk.sandboxes.list({ group: GROUP, node: n, state: ['paused'] })).length));
  t.deepEqual(byNode, NODES.map((n) => perNode.get(n)), 'paused on every node');
  const resumed = await pdk.groups.resume(GROUP);
  t.is(resumed.ok, N);
  const r = await (sbs[0] as Sandbox).exec(['echo', 'still here'], { maxOutputBytes: 1024 });
  t.is(r.stdout.toString(), 'still here\n');

  // Ctrl-C: every node stops and kills its sandboxes; the process ends and nothing of it is left.
  const pid = fleet.pid;
  fleet.kill('SIGINT');
  t.is(await t.context.exited, 0, t.context.stderr());
  t.false(alive(pid), 'the fleet process is gone');
  const ended = await eventually(async () => {
    const all = await pdk.sandboxes.list({ group: GROUP, all: true });
    return all.length === N && all.every((s) => s.state === 'stopped') ? all : undefined;
  });
  t.truthy(ended, 'every sandbox is recorded as stopped');
  t.true((ended ?? []).every((s) => s.reason === 'killed'), 'each ended because its node killed it');
  t.deepEqual((await pdk.nodes.list()).filter((n) => NODES.includes(n.node)), [], 'no node record is left');
});
