/**
 * Scale-out on a NATS cluster: a 3-server cluster (startNatsCluster), a simulated fleet of
 * `paddock sim` processes (K nodes each, every node the production node host with the sim
 * backend), and trainer processes (scale-trainer.ts) that create sandboxes through placement in
 * bursts of one job each, drive 1% of them with execs, group-pause and resume one job, and kill
 * everything with group verbs. Before that, a short phase on a 10-node fleet gives the slope.
 *
 * Reported: placements/s per burst and sustained (created / time spent in bursts), create latency,
 * the RSS of every fleet process summed per live sandbox, NATS messages and bytes per create
 * (/varz of the three servers: what each server received and sent, routes included, heartbeats
 * and watches of the period included), JetStream writes per create (the streams' sequence
 * numbers: each stored message once, not per replica), group pause/resume of one job, and the CPU
 * seconds each kind of process used during the bursts (what ran out).
 *
 *   node --import tsx ops/bench/scale.ts [--nodes 160] [--sandboxes 380000] [--burst 32000]
 *     [--trainers 3] [--concurrency 256] [--per-process 40] [--placement 1] [--no-slope] [--no-floor]
 *     [--slope-nodes 10] [--profile DIR] [--profile-phase bursts|pause] [--json]
 */
import { type ChildProcess, fork, spawn } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { jetstreamManager } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import { distIsCurrent, ROOT } from '../../runtime/source.ts';
import { connectionOf } from '../../sdk/client.ts';
import { Paddock } from '../../sdk/index.ts';
import { type NatsCluster, startNatsCluster } from '../nats.ts';
import { CLK_TCK, cleanUp, cleanUpOnSignals, cpuSeconds, fmt, hostCpu, numberArg, onCleanup, progress, rssBytes, runMain, sleep, table, UsageError } from './harness.ts';
import { type FloorCommand, floorNodeSubject, makeFloorBucket, removeFloorBucket } from './scale-floor.ts';
import type { BurstResult, ExecResult, TrainerCommand } from './scale-trainer.ts';
import { round3, summarize } from './stats.ts';

const USAGE = 'usage: scale.ts [--nodes N] [--sandboxes N] [--burst N] [--trainers N] [--concurrency N] [--per-process K] [--placement P] [--sandboxes-per-node S] [--no-slope] [--no-floor] [--slope-nodes N] [--profile DIR] [--profile-phase bursts|pause] [--json]';

interface Options {
  nodes: number;
  sandboxes: number;
  burst: number;
  trainers: number;
  concurrency: number;
  perProcess: number;
  placement: number;
  sandboxesPerNode: number;
  slope: boolean;
  slopeNodes: number;
  /** Measure the floor (scale-floor.ts) first. */
  floor: boolean;
  profile?: string;
  /** What --profile covers: the bursts (default) or the group pause and resume. */
  profilePhase: 'bursts' | 'pause';
  json: boolean;
}

const TARGETS = { live: 380_000, nodes: 160, placementsPerSec: 5000, createP99Ms: 100, rssBytesPerSandbox: 32 * 1024, groupPauseMs: 2000 };

function parseArgs(argv: readonly string[]): Options {
  const o: Options = { nodes: 160, sandboxes: 380_000, burst: 32_000, trainers: 3, concurrency: 256, perProcess: 40, placement: 1, sandboxesPerNode: 3200, slope: true, slopeNodes: 10, floor: true, profilePhase: 'bursts', json: false };
  const nums = { '--nodes': 'nodes', '--sandboxes': 'sandboxes', '--burst': 'burst', '--trainers': 'trainers', '--concurrency': 'concurrency', '--per-process': 'perProcess', '--placement': 'placement', '--sandboxes-per-node': 'sandboxesPerNode', '--slope-nodes': 'slopeNodes' } as const;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    const name = a.split('=')[0] as string;
    if (a === '--json') o.json = true;
    else if (a === '--no-slope') o.slope = false;
    else if (a === '--slope') o.slope = true;
    else if (a === '--no-floor') o.floor = false;
    else if (name === '--profile') {
      o.profile = a === name ? argv[++i] : a.slice(name.length + 1);
      if (!o.profile) throw new UsageError(`--profile: a directory\n${USAGE}`);
    } else if (name === '--profile-phase') {
      const v = a === name ? argv[++i] : a.slice(name.length + 1);
      if (v !== 'bursts' && v !== 'pause') throw new UsageError(`--profile-phase: bursts or pause\n${USAGE}`);
      o.profilePhase = v;
    } else if (name in nums) {
      const r = numberArg(argv, i, name, USAGE);
      o[nums[name as keyof typeof nums]] = r.value;
      i = r.next;
    } else throw new UsageError(`unknown argument ${a}\n${USAGE}`);
  }
  if (o.burst > o.sandboxes) o.burst = o.sandboxes;
  if (o.nodes * o.sandboxesPerNode < o.sandboxes) throw new UsageError(`${o.nodes} nodes of ${o.sandboxesPerNode} sandboxes cannot hold ${o.sandboxes}: raise --sandboxes-per-node`);
  return o;
}

// ─── Processes ──────────────────────────────────────────────────────────────────────────────────

interface FleetProcess {
  proc: ChildProcess;
  first: number;
  nodes: number;
}

interface Fleet {
  procs: FleetProcess[];
  ids: string[];
  stop(): Promise<void>;
}

/** The CLI the fleet runs: compiled when dist/ is current (as nodes run), else the sources through tsx. */
function cliEntry(): string[] {
  if (distIsCurrent()) return [join(ROOT, 'dist', 'ops', 'cli', 'main.js')];
  return ['--import', import.meta.resolve('tsx'), join(ROOT, 'ops', 'cli', 'main.ts')];
}

async function startFleetProcess(o: { url: string; home: string; logDir: string; first: number; nodes: number; placement: number; sandboxesPerNode: number; profile?: string }): Promise<FleetProcess> {
  const args = ['sim', '--nats', o.url, '--nodes', String(o.nodes), '--per-process', String(o.nodes), '--first', String(o.first), '--placement', String(o.placement), '--sandboxes-per-node', String(o.sandboxesPerNode)];
  // pdeathsig: a fleet outliving a benchmark killed by SIGKILL would hold the machine.
  const proc = spawn('setpriv', ['--pdeathsig', 'TERM', '--', process.execPath, ...cliEntry(), ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, PADDOCK_HOME: o.home, PADDOCK_IMAGES_DIR: join(o.home, 'images'), PADDOCK_LOG_LEVEL: process.env.PADDOCK_LOG_LEVEL ?? 'warn', ...(o.profile ? { PADDOCK_CPU_PROFILE: o.profile } : {}) },
  });
  const log = createWriteStream(join(o.logDir, `fleet-${o.first}.log`));
  proc.stdout?.pipe(log, { end: false });
  let tail = '';
  await new Promise<void>((resolve, reject) => {
    proc.stderr?.on('data', (d: Buffer) => {
      log.write(d);
      tail = (tail + d.toString()).slice(-4000);
      if (/ nodes? ready/.test(tail)) resolve();
    });
    proc.once('exit', (c, s) => reject(new Error(`fleet process sim-${o.first} exited (${s ?? c}) before it was ready: ${tail}`)));
  });
  return { proc, first: o.first, nodes: o.nodes };
}

async function stopProcess(p: ChildProcess, graceMs: number): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return;
  const gone = new Promise((r) => p.once('exit', r));
  p.kill('SIGTERM');
  const t = setTimeout(() => p.kill('SIGKILL'), graceMs);
  await gone;
  clearTimeout(t);
}

async function startFleet(o: { url: string; home: string; logDir: string; first: number; nodes: number; perProcess: number; placement: number; sandboxesPerNode: number; profile?: string }): Promise<Fleet> {
  const procs: FleetProcess[] = [];
  const fleet: Fleet = {
    procs,
    ids: Array.from({ length: o.nodes }, (_, i) => `sim-${o.first + i}`),
    stop: async () => {
      await Promise.all(procs.map((p) => stopProcess(p.proc, 300_000)));
    },
  };
  onCleanup(`fleet sim-${o.first}`, fleet.stop);
  // The first builds the busybox image in the shared store; the rest find it.
  const parts: Array<{ first: number; nodes: number }> = [];
  for (let at = 0; at < o.nodes; at += o.perProcess) parts.push({ first: o.first + at, nodes: Math.min(o.perProcess, o.nodes - at) });
  const [head, ...rest] = parts;
  if (head) procs.push(await startFleetProcess({ ...o, ...head }));
  // Two at a time: each node start is a few JetStream API calls, and 160 at once time out on 2 cores.
  for (let i = 0; i < rest.length; i += 2) procs.push(...(await Promise.all(rest.slice(i, i + 2).map((p) => startFleetProcess({ ...o, ...p })))));
  return fleet;
}

interface Child<C> {
  proc: ChildProcess;
  call<T>(m: C & { seq: number }): Promise<T>;
}

type Trainer = Child<TrainerCommand>;

/** Forks `n` children of `file` (an IPC protocol of `{seq}` calls and a first `{ready}`), with `args(i)`. */
async function startChildren<C extends { cmd: string }>(n: number, url: string, file: string, args: (i: number) => string[], what: string): Promise<Array<Child<C>> & { stop(): Promise<void> }> {
  const children = await Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const proc = fork(join(ROOT, 'ops', 'bench', file), args(i), { env: { ...process.env, NATS_URL: url }, execArgv: ['--import', import.meta.resolve('tsx')], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
      const waiting = new Map<number, (v: unknown) => void>();
      let ready: () => void = () => {};
      const isReady = new Promise<void>((r) => (ready = r));
      proc.on('message', (m: { ready?: boolean; seq?: number }) => {
        if (m.ready) ready();
        else if (m.seq !== undefined) waiting.get(m.seq)?.(m);
      });
      const exited = new Promise<never>((_, reject) => proc.once('exit', (c, s) => reject(new Error(`a ${what} process exited (${s ?? c})`))));
      exited.catch(() => {});
      await Promise.race([isReady, exited]);
      return {
        proc,
        call: <T>(m: C & { seq: number }) =>
          Promise.race([
            new Promise<T>((resolve) => {
              waiting.set(m.seq, resolve as (v: unknown) => void);
              proc.send(m);
            }),
            exited,
          ]),
      };
    }),
  );
  const stop = async () => {
    await Promise.all(children.map((t) => stopProcess(t.proc, 5000)));
  };
  onCleanup(what, stop);
  return Object.assign(children, { stop });
}

function startTrainers(n: number, url: string): Promise<Trainer[]> {
  return startChildren<TrainerCommand>(n, url, 'scale-trainer.ts', () => [], 'trainer');
}

interface Floor {
  sandboxes: number;
  failed: number;
  placementsPerSec: number;
  createP50Ms: number;
  createP99Ms: number;
  /** CPU ms per create: the floor's own processes (trainers included) and the NATS servers. */
  cpuMsPerCreate: { clients: number; nats: number };
  msgsPerCreate: number;
  /** Every record of the burst written again, through a request to each node at once. */
  groupWriteMs: number;
  groupWriteCpuMs: { clients: number; nats: number };
}

/**
 * The same NATS work as a burst and a group pause, done by bare nats.js clients (scale-floor.ts)
 * on the same cluster, before the fleet starts: as many processes, placement responders, nodes,
 * trainers and creates in flight as Paddock's run has.
 */
async function floorPhase(o: Options, cluster: NatsCluster, natsPids: number[], nc: NatsConnection): Promise<Floor> {
  const n = Math.min(o.burst, o.sandboxes);
  progress(`floor: ${n} creates and a group write through bare NATS clients (${o.nodes} nodes, ${Math.ceil(o.nodes / o.perProcess)} processes)`);
  await makeFloorBucket(nc, cluster.urls.length >= 3 ? 3 : 1);
  const parts = Math.ceil(o.nodes / o.perProcess);
  const fleet = await startChildren<FloorCommand>(parts, cluster.url, 'scale-floor.ts', (i) => ['fleet', String(i * o.perProcess), String(Math.min(o.perProcess, o.nodes - i * o.perProcess)), String(o.nodes), String(o.placement)], 'floor fleet');
  const trainers = await startChildren<FloorCommand>(o.trainers, cluster.url, 'scale-floor.ts', () => ['trainer'], 'floor trainer');
  const pids = [...fleet, ...trainers].map((c) => c.proc.pid as number);
  try {
    const c0 = { clients: await sumCpu(pids), nats: await sumCpu(natsPids) };
    const v0 = await varz(cluster);
    const b = await tally(trainers, 'floor', n, (t, share) => t.call<BurstResult>({ cmd: 'burst', seq: ++seq, count: share, concurrency: o.concurrency }));
    const v1 = await varz(cluster);
    const c1 = { clients: await sumCpu(pids), nats: await sumCpu(natsPids) };
    const t = performance.now();
    const written = await Promise.all(Array.from({ length: o.nodes }, (_, k) => nc.request(floorNodeSubject(k, 'group'), new Uint8Array(), { timeout: 600_000 }).then((m) => Number(new TextDecoder().decode(m.data)))));
    const groupWriteMs = performance.now() - t;
    const c2 = { clients: await sumCpu(pids), nats: await sumCpu(natsPids) };
    const s = summarize(b.latencies);
    const per = (x: number) => round3((1000 * x) / Math.max(1, b.created));
    const f: Floor = {
      sandboxes: b.created,
      failed: b.failed,
      placementsPerSec: round3(b.perSec),
      createP50Ms: round3(s.p50),
      createP99Ms: round3(s.p99),
      cpuMsPerCreate: { clients: per(c1.clients - c0.clients), nats: per(c1.nats - c0.nats) },
      msgsPerCreate: round3((v1.inMsgs - v0.inMsgs + v1.outMsgs - v0.outMsgs) / Math.max(1, b.created)),
      groupWriteMs: Math.round(groupWriteMs),
      groupWriteCpuMs: { clients: per(c2.clients - c1.clients), nats: per(c2.nats - c1.nats) },
    };
    const rewritten = written.reduce((x, y) => x + (Number.isFinite(y) ? y : 0), 0);
    progress(`floor: ${b.created} in ${fmt(b.seconds, 1)} s = ${fmt(b.perSec, 0)}/s, p50 ${fmt(s.p50, 1)} ms, p99 ${fmt(s.p99, 1)} ms, CPU ms per create clients ${fmt(f.cpuMsPerCreate.clients, 2)} NATS ${fmt(f.cpuMsPerCreate.nats, 2)}; group write of ${rewritten} in ${f.groupWriteMs} ms${b.failed ? `; ${b.failed} failed ${JSON.stringify(b.errors)}` : ''}`);
    return f;
  } finally {
    await Promise.all([...fleet, ...trainers].map((c) => c.call({ cmd: 'exit', seq: ++seq }).catch(() => {})));
    await fleet.stop();
    await trainers.stop();
    await removeFloorBucket(nc);
  }
}

// ─── Readings ───────────────────────────────────────────────────────────────────────────────────

interface Varz {
  inMsgs: number;
  outMsgs: number;
  inBytes: number;
  outBytes: number;
}

async function varz(cluster: NatsCluster): Promise<Varz> {
  const all = await Promise.all(cluster.servers.map(async (s) => (await (await fetch(`${s.monitorUrl}/varz`)).json()) as { in_msgs: number; out_msgs: number; in_bytes: number; out_bytes: number }));
  return all.reduce((a, v) => ({ inMsgs: a.inMsgs + v.in_msgs, outMsgs: a.outMsgs + v.out_msgs, inBytes: a.inBytes + v.in_bytes, outBytes: a.outBytes + v.out_bytes }), { inMsgs: 0, outMsgs: 0, inBytes: 0, outBytes: 0 });
}

/** Messages stored in every stream so far (sum of last sequence numbers): each write once, whatever the replicas. */
async function jsWrites(pdk: Paddock): Promise<number> {
  const jsm = await jetstreamManager(connectionOf(pdk));
  let n = 0;
  for await (const s of jsm.streams.list()) n += s.state.last_seq;
  return n;
}

async function sumRss(pids: number[]): Promise<number> {
  let n = 0;
  for (const p of pids) n += await rssBytes(p).catch(() => 0);
  return n;
}

async function sumCpu(pids: number[]): Promise<number> {
  let n = 0;
  for (const p of pids) {
    const c = await cpuSeconds(p).catch(() => ({ self: 0, children: 0 }));
    n += c.self + c.children;
  }
  return n;
}

// ─── Bursts ─────────────────────────────────────────────────────────────────────────────────────

let seq = 0;

interface Burst {
  group: string;
  count: number;
  created: number;
  failed: number;
  errors: Record<string, number>;
  seconds: number;
  perSec: number;
  latencies: number[];
  nodes: Record<string, number>;
}

async function burst(trainers: Trainer[], group: string, count: number, concurrency: number, keepEvery: number): Promise<Burst> {
  return tally(trainers, group, count, (t, share) => t.call<BurstResult>({ cmd: 'burst', seq: ++seq, group, count: share, concurrency, keepEvery }));
}

/** `count` creates shared among `trainers`, summed up. */
async function tally<T>(trainers: T[], group: string, count: number, call: (t: T, share: number) => Promise<BurstResult>): Promise<Burst> {
  const shares = trainers.map((_, i) => Math.floor(count / trainers.length) + (i < count % trainers.length ? 1 : 0));
  const results = await Promise.all(trainers.map((t, i) => call(t, shares[i] as number)));
  const start = Math.min(...results.map((r) => r.startMs));
  const end = Math.max(...results.map((r) => r.endMs));
  const errors: Record<string, number> = {};
  const nodes: Record<string, number> = {};
  for (const r of results) {
    for (const [k, v] of Object.entries(r.errors)) {
      if (errors[k] === undefined) progress(`${group}: ${k}: ${r.samples[k]}`);
      errors[k] = (errors[k] ?? 0) + v;
    }
    for (const [k, v] of Object.entries(r.nodes)) nodes[k] = (nodes[k] ?? 0) + v;
  }
  const created = results.reduce((s, r) => s + r.created, 0);
  const seconds = (end - start) / 1000;
  return { group, count, created, failed: results.reduce((s, r) => s + r.failed, 0), errors, seconds, perSec: created / seconds, latencies: results.flatMap((r) => r.latencies), nodes };
}

/** Waits until the node table lists every node of `ids` as serving. */
async function nodesServing(pdk: Paddock, ids: string[], timeoutMs = 120_000): Promise<void> {
  const want = new Set(ids);
  const until = Date.now() + timeoutMs;
  for (;;) {
    const seen = new Set((await pdk.nodes.list().catch(() => [])).filter((r) => r.state === 'serving' && Date.now() - r.ts < 3 * r.heartbeatMs).map((r) => r.node));
    if ([...want].every((id) => seen.has(id))) return;
    if (Date.now() > until) throw new Error(`only ${[...want].filter((id) => seen.has(id)).length} of ${want.size} nodes serving after ${timeoutMs} ms`);
    await sleep(500);
  }
}

async function signalAll(pids: number[], sig: NodeJS.Signals): Promise<void> {
  for (const p of pids) {
    try {
      process.kill(p, sig);
    } catch {}
  }
}

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  cleanUpOnSignals();
  const dir = await mkdtemp(join(tmpdir(), 'paddock-bench-scale-'));
  onCleanup('temp dir', () => rm(dir, { recursive: true, force: true }));
  // With --profile the fleet's logs stay beside the profiles, for reading after the run.
  const logDir = o.profile ? join(o.profile, 'logs') : join(dir, 'logs');
  await mkdir(logDir, { recursive: true });
  if (o.profile) await mkdir(o.profile, { recursive: true });
  progress(`starting a 3-server NATS cluster (${dir})`);
  const cluster = await startNatsCluster({ dataDir: join(dir, 'nats'), servers: 3, logDir, monitor: true });
  onCleanup('NATS cluster', () => cluster.stop());
  const natsPids = cluster.servers.map((s) => s.proc.pid as number);
  const home = join(dir, 'home');
  const pdk = await Paddock.connect({ servers: cluster.url, timeoutMs: 600_000, name: 'bench-scale' });
  onCleanup('sdk', () => pdk.close().catch(() => {}));
  const trainers = await startTrainers(o.trainers, cluster.url);
  const trainerPids = trainers.map((t) => t.proc.pid as number);
  const fleetOpts = { url: cluster.url, home, logDir, perProcess: o.perProcess, placement: o.placement, sandboxesPerNode: o.sandboxesPerNode, ...(o.profile ? { profile: o.profile } : {}) };

  // ── Floor: the same NATS work without Paddock, before any of Paddock runs.
  const floor = o.floor ? await floorPhase(o, cluster, natsPids, connectionOf(pdk)) : undefined;

  // ── Slope: the same burst on a few nodes first.
  let slope: { nodes: number; sandboxes: number; placementsPerSec: number; createP50Ms: number; createP99Ms: number; cpuMsPerCreate: { fleet: number; nats: number }; hostBusyCores: number } | undefined;
  if (o.slope && o.slopeNodes < o.nodes) {
    // At most 10,000: the rate settles within a few thousand, and the phase is only the reference.
    const n = Math.min(o.burst, 10_000, o.slopeNodes * o.sandboxesPerNode);
    progress(`slope: ${o.slopeNodes} nodes, a burst of ${n}`);
    const small = await startFleet({ ...fleetOpts, first: 10_000, nodes: o.slopeNodes });
    await nodesServing(pdk, small.ids);
    const pids = small.procs.map((p) => p.proc.pid as number);
    const c0 = { fleet: await sumCpu(pids), nats: await sumCpu(natsPids), host: await hostCpu() };
    const b = await burst(trainers, 'slope-0', n, o.concurrency, 0);
    const c1 = { fleet: await sumCpu(pids), nats: await sumCpu(natsPids), host: await hostCpu() };
    const s = summarize(b.latencies);
    slope = {
      nodes: o.slopeNodes,
      sandboxes: b.created,
      placementsPerSec: round3(b.perSec),
      createP50Ms: round3(s.p50),
      createP99Ms: round3(s.p99),
      cpuMsPerCreate: { fleet: round3((1000 * (c1.fleet - c0.fleet)) / b.created), nats: round3((1000 * (c1.nats - c0.nats)) / b.created) },
      hostBusyCores: round3((c1.host.busy - c0.host.busy) / CLK_TCK / b.seconds),
    };
    progress(`slope: ${b.created} in ${fmt(b.seconds, 1)} s = ${fmt(b.perSec, 0)}/s, p50 ${fmt(s.p50, 1)} ms, p99 ${fmt(s.p99, 1)} ms, CPU ms per create fleet ${fmt(slope.cpuMsPerCreate.fleet, 2)} NATS ${fmt(slope.cpuMsPerCreate.nats, 2)}, host ${fmt(slope.hostBusyCores, 2)} cores busy${b.failed ? `, ${b.failed} failed ${JSON.stringify(b.errors)}` : ''}`);
    await pdk.groups.kill('slope-0');
    await small.stop();
  }

  // ── The fleet.
  progress(`starting ${o.nodes} simulated nodes, ${o.perProcess} per process`);
  const t0 = performance.now();
  const fleet = await startFleet({ ...fleetOpts, first: 0, nodes: o.nodes });
  await nodesServing(pdk, fleet.ids, 300_000);
  progress(`fleet serving after ${fmt((performance.now() - t0) / 1000, 1)} s`);
  const fleetPids = fleet.procs.map((p) => p.proc.pid as number);
  await sleep(2000);
  const rssIdle = await sumRss(fleetPids);
  // What the fleet costs doing nothing: heartbeats, pressure watches, the placement replicas' watches.
  const idle0 = { fleet: await sumCpu(fleetPids), nats: await sumCpu(natsPids) };
  await sleep(10_000);
  const idle = { fleet: ((await sumCpu(fleetPids)) - idle0.fleet) / 10, nats: ((await sumCpu(natsPids)) - idle0.nats) / 10 };
  progress(`idle fleet: ${fmt(idle.fleet, 2)} cores in the fleet, ${fmt(idle.nats, 2)} in NATS; RSS ${fmt(rssIdle / 2 ** 20, 0)} MiB`);

  // ── Creates at low load: the latency of one create when nothing queues (a few in flight).
  const probe = await burst(trainers.slice(0, 1), 'probe', 500, 8, 0);
  const probeLat = summarize(probe.latencies);
  progress(`unloaded: 500 creates at 8 in flight: ${fmt(probe.perSec, 0)}/s, p50 ${fmt(probeLat.p50, 1)} ms, p99 ${fmt(probeLat.p99, 1)} ms`);
  await pdk.groups.kill('probe');

  // ── Bursts.
  const keepEvery = 100; // 1% driven with execs
  const bursts: Burst[] = [];
  const v0 = await varz(cluster);
  const js0 = await jsWrites(pdk);
  const cpu0 = { fleet: await sumCpu(fleetPids), nats: await sumCpu(natsPids), trainers: await sumCpu(trainerPids), host: await hostCpu() };
  if (o.profile && o.profilePhase === 'bursts') await signalAll(fleetPids, 'SIGUSR2');
  const jobs = Math.ceil(o.sandboxes / o.burst);
  for (let j = 0; j < jobs; j++) {
    const count = Math.min(o.burst, o.sandboxes - j * o.burst);
    const b = await burst(trainers, `job-${j}`, count, o.concurrency, keepEvery);
    bursts.push(b);
    const s = summarize(b.latencies);
    const live = bursts.reduce((n, x) => n + x.created, 0);
    progress(`burst ${j + 1}/${jobs} (job-${j}): ${b.created} in ${fmt(b.seconds, 1)} s = ${fmt(b.perSec, 0)}/s, p50 ${fmt(s.p50, 1)} ms, p99 ${fmt(s.p99, 1)} ms; ${live} live, fleet RSS ${fmt((await sumRss(fleetPids)) / 2 ** 20, 0)} MiB${b.failed ? `; ${b.failed} failed ${JSON.stringify(b.errors)}` : ''}`);
  }
  if (o.profile && o.profilePhase === 'bursts') {
    await signalAll(fleetPids, 'SIGUSR2');
    progress(`CPU profiles of the fleet processes during the bursts: ${o.profile}`);
  }
  const cpu1 = { fleet: await sumCpu(fleetPids), nats: await sumCpu(natsPids), trainers: await sumCpu(trainerPids), host: await hostCpu() };
  const v1 = await varz(cluster);
  const js1 = await jsWrites(pdk);
  const created = bursts.reduce((n, b) => n + b.created, 0);
  const burstSeconds = bursts.reduce((n, b) => n + b.seconds, 0);
  // The nodes' own count, from their heartbeats (a few seconds behind on a busy host), not the trainers' tally.
  const liveNow = async () => (await pdk.nodes.list()).filter((r) => fleet.ids.includes(r.node)).reduce((n, r) => n + r.sandboxes, 0);
  let live = await liveNow();
  for (let i = 0; i < 30 && live < created; i++) {
    await sleep(1000);
    live = await liveNow();
  }
  const rss = await sumRss(fleetPids);

  // ── Execs on 1%.
  progress('execs on 1% of the sandboxes');
  const ex = await Promise.all(trainers.map((t) => t.call<ExecResult>({ cmd: 'exec', seq: ++seq, concurrency: 64 })));
  const exLat = summarize(ex.flatMap((r) => r.latencies));
  const exOk = ex.reduce((n, r) => n + r.ok, 0);
  const exFailed = ex.reduce((n, r) => n + r.failed, 0);
  const exErrors: Record<string, number> = {};
  const exSamples: Record<string, string> = {};
  for (const r of ex) {
    for (const [k, v] of Object.entries(r.errors)) exErrors[k] = (exErrors[k] ?? 0) + v;
    Object.assign(exSamples, r.samples);
  }
  if (exFailed > 0) progress(`${exFailed} execs failed: ${JSON.stringify(exErrors)} (${JSON.stringify(exSamples)})`);
  const exSec = (Math.max(...ex.map((r) => r.endMs)) - Math.min(...ex.map((r) => r.startMs))) / 1000;

  // ── Group pause and resume of one job.
  const job = bursts[0] as Burst;
  progress(`group pause and resume of ${job.group} (${job.created} sandboxes on ${Object.keys(job.nodes).length} nodes)`);
  // What a group verb costs, and where: CPU seconds of the fleet and of NATS, and JetStream writes.
  const groupCost = async <T>(verb: () => Promise<T>) => {
    const before = { fleet: await sumCpu(fleetPids), nats: await sumCpu(natsPids), js: await jsWrites(pdk) };
    if (o.profile && o.profilePhase === 'pause') await signalAll(fleetPids, 'SIGUSR2');
    const t0 = performance.now();
    const reply = await verb();
    const ms = performance.now() - t0;
    if (o.profile && o.profilePhase === 'pause') await signalAll(fleetPids, 'SIGUSR2');
    const after = { fleet: await sumCpu(fleetPids), nats: await sumCpu(natsPids), js: await jsWrites(pdk) };
    return { reply, ms, fleetCpuS: round3(after.fleet - before.fleet), natsCpuS: round3(after.nats - before.nats), jsWrites: after.js - before.js };
  };
  const pause = await groupCost(() => pdk.groups.pause(job.group));
  const resume = await groupCost(() => pdk.groups.resume(job.group));
  const { reply: paused, ms: pauseMs } = pause;
  const { reply: resumed, ms: resumeMs } = resume;
  const perSandbox = (c: typeof pause) => `fleet ${fmt((1e6 * c.fleetCpuS) / Math.max(1, job.created), 0)} µs, NATS ${fmt((1e6 * c.natsCpuS) / Math.max(1, job.created), 0)} µs CPU and ${fmt(c.jsWrites / Math.max(1, job.created), 2)} JetStream writes per sandbox`;
  progress(`pause ${fmt(pauseMs, 0)} ms (${paused.ok}/${paused.total}, ${paused.unreachable.length} nodes unreachable; ${perSandbox(pause)}), resume ${fmt(resumeMs, 0)} ms (${resumed.ok}/${resumed.total}; ${perSandbox(resume)})`);

  // ── Kill everything.
  progress('killing every job (group kill)');
  const killStart = performance.now();
  // One job at a time, as trainers end jobs: twelve group kills at once (380,000 sandboxes on two
  // cores) outlasted a group verb's 10-minute timeout.
  const kills = [];
  for (const b of bursts) kills.push(await pdk.groups.kill(b.group));
  const killMs = performance.now() - killStart;
  const killed = kills.reduce((n, k) => n + k.ok, 0);
  // What the nodes still hold after the kills (a group verb skips nodes whose heartbeat is stale).
  await sleep(3000);
  const leftAfterKill = await liveNow();
  progress(`killed ${killed} in ${fmt(killMs / 1000, 1)} s; the nodes still hold ${leftAfterKill}`);

  const lat = summarize(bursts.flatMap((b) => b.latencies));
  const dv = { inMsgs: v1.inMsgs - v0.inMsgs, outMsgs: v1.outMsgs - v0.outMsgs, inBytes: v1.inBytes - v0.inBytes, outBytes: v1.outBytes - v0.outBytes };
  // The host's busy time over the same span, in CPU seconds (jiffies of all CPUs): what else ran shows as the rest.
  const hostBusy = (cpu1.host.busy - cpu0.host.busy) / CLK_TCK;
  const cpu = { fleet: cpu1.fleet - cpu0.fleet, nats: cpu1.nats - cpu0.nats, trainers: cpu1.trainers - cpu0.trainers, host: hostBusy };
  const spread = Object.values(bursts.reduce<Record<string, number>>((a, b) => {
    for (const [k, v] of Object.entries(b.nodes)) a[k] = (a[k] ?? 0) + v;
    return a;
  }, {}));
  const result = {
    nodes: o.nodes,
    live,
    created,
    failed: bursts.reduce((n, b) => n + b.failed, 0),
    placementsPerSec: round3(created / burstSeconds),
    perBurst: bursts.map((b) => round3(b.perSec)),
    createP50Ms: round3(lat.p50),
    createP99Ms: round3(lat.p99),
    unloaded: { inFlight: 8, perSec: round3(probe.perSec), createP50Ms: round3(probeLat.p50), createP99Ms: round3(probeLat.p99) },
    rssBytesPerSandbox: Math.round(rss / Math.max(1, live)),
    rssMarginalBytesPerSandbox: Math.round((rss - rssIdle) / Math.max(1, live)),
    fleetRssBytes: rss,
    fleetRssIdleBytes: rssIdle,
    msgsPerCreate: round3((dv.inMsgs + dv.outMsgs) / created),
    natsInMsgsPerCreate: round3(dv.inMsgs / created),
    natsOutMsgsPerCreate: round3(dv.outMsgs / created),
    bytesPerCreate: Math.round((dv.inBytes + dv.outBytes) / created),
    jsWritesPerCreate: round3((js1 - js0) / created),
    groupPause32kMs: Math.round(pauseMs),
    groupResume32kMs: Math.round(resumeMs),
    groupJob: job.created,
    groupPaused: { ok: paused.ok, total: paused.total, unreachable: paused.unreachable.length },
    groupPauseCost: { fleetCpuS: pause.fleetCpuS, natsCpuS: pause.natsCpuS, jsWrites: pause.jsWrites },
    groupResumeCost: { fleetCpuS: resume.fleetCpuS, natsCpuS: resume.natsCpuS, jsWrites: resume.jsWrites },
    groupResumed: { ok: resumed.ok, total: resumed.total, unreachable: resumed.unreachable.length },
    leftAfterKill,
    groupKillAllMs: Math.round(killMs),
    exec: { n: exOk, failed: exFailed, p50Ms: round3(exLat.p50), p99Ms: round3(exLat.p99), perSec: round3(exOk / exSec) },
    perNode: { min: Math.min(...spread), max: Math.max(...spread), nodesUsed: spread.length },
    cpuSecondsDuringBursts: { fleet: round3(cpu.fleet), nats: round3(cpu.nats), trainers: round3(cpu.trainers), host: round3(cpu.host), burstSeconds: round3(burstSeconds) },
    idleCores: { fleet: round3(idle.fleet), nats: round3(idle.nats) },
    cpuMsPerCreate: { fleet: round3((1000 * cpu.fleet) / created), nats: round3((1000 * cpu.nats) / created), trainers: round3((1000 * cpu.trainers) / created) },
    shape: { trainers: o.trainers, concurrencyPerTrainer: o.concurrency, perProcess: o.perProcess, fleetProcesses: fleet.procs.length, placementReplicas: fleet.procs.length * o.placement, burst: o.burst },
    floor,
    floorPlacementsPerSec: floor?.placementsPerSec,
    floorGroupPause32kMs: floor?.groupWriteMs,
    slope: slope ? { ...slope, fullNodes: o.nodes, fullPlacementsPerSec: round3(created / burstSeconds), ratio: round3(created / burstSeconds / slope.placementsPerSec) } : undefined,
  };
  const cores = (s: number) => `${fmt(s / burstSeconds, 2)} cores`;
  process.stdout.write(
    `${table([
      ['measure', 'value', 'target'],
      ['live sandboxes on nodes', `${live} on ${o.nodes}`, `${TARGETS.live} on ${TARGETS.nodes}`],
      ['placements/s sustained (per burst)', `${fmt(result.placementsPerSec, 0)} (${result.perBurst.map((x) => fmt(x, 0)).join(', ')})`, `≥ ${TARGETS.placementsPerSec}`],
      [`create p50 / p99 ms (${o.trainers * o.concurrency} in flight)`, `${fmt(lat.p50, 1)} / ${fmt(lat.p99, 1)}`, `p99 ≤ ${TARGETS.createP99Ms}`],
      ['create p50 / p99 ms unloaded (8 in flight)', `${fmt(probeLat.p50, 1)} / ${fmt(probeLat.p99, 1)} (${fmt(probe.perSec, 0)}/s)`, `p99 ≤ ${TARGETS.createP99Ms}`],
      ['fleet RSS per live sandbox (idle fleet RSS)', `${fmt(result.rssBytesPerSandbox / 1024, 1)} KiB (${fmt(rssIdle / 2 ** 20, 0)} MiB)`, `≤ ${TARGETS.rssBytesPerSandbox / 1024} KiB`],
      ['marginal RSS per sandbox', `${fmt(result.rssMarginalBytesPerSandbox / 1024, 1)} KiB`, '—'],
      ['NATS msgs per create (in + out, 3 servers)', `${fmt(result.msgsPerCreate, 1)} (${fmt(result.natsInMsgsPerCreate, 1)} + ${fmt(result.natsOutMsgsPerCreate, 1)})`, '—'],
      ['NATS bytes per create', `${result.bytesPerCreate}`, '—'],
      ['JetStream writes per create', fmt(result.jsWritesPerCreate, 2), '—'],
      [`group pause / resume of ${job.created} (sandboxes reached)`, `${result.groupPause32kMs} / ${result.groupResume32kMs} ms (${paused.ok} / ${resumed.ok})`, `pause ≤ ${TARGETS.groupPauseMs}`],
      ['group kill of everything (left on the nodes)', `${fmt(killMs / 1000, 1)} s (${leftAfterKill})`, '0 left'],
      [`exec on 1% (${exOk} ok, ${exFailed} failed) p50 / p99 ms`, `${fmt(exLat.p50, 1)} / ${fmt(exLat.p99, 1)}`, '—'],
      ['sandboxes per node min / max', `${result.perNode.min} / ${result.perNode.max} (${result.perNode.nodesUsed} nodes)`, '—'],
      ['CPU during bursts: fleet / NATS / trainers / whole host', `${cores(cpu.fleet)} / ${cores(cpu.nats)} / ${cores(cpu.trainers)} / ${cores(cpu.host)}`, '2 cores here'],
      ['CPU ms per create: fleet / NATS / trainers', `${fmt(result.cpuMsPerCreate.fleet, 2)} / ${fmt(result.cpuMsPerCreate.nats, 2)} / ${fmt(result.cpuMsPerCreate.trainers, 2)}`, `${fmt(2000 / TARGETS.placementsPerSec, 2)} in all for the target on 2 cores`],
      ['idle fleet CPU: fleet / NATS', `${fmt(idle.fleet, 2)} / ${fmt(idle.nats, 2)} cores`, '—'],
      ...(floor
        ? [
            [`floor: the same NATS work by bare clients, placements/s (Paddock ÷ floor)`, `${fmt(floor.placementsPerSec, 0)} (×${fmt(result.placementsPerSec / floor.placementsPerSec, 2)})`, `≥ ${TARGETS.placementsPerSec}`],
            ['floor: create p50 / p99 ms', `${fmt(floor.createP50Ms, 1)} / ${fmt(floor.createP99Ms, 1)}`, `p99 ≤ ${TARGETS.createP99Ms}`],
            ['floor: CPU ms per create: clients / NATS (msgs)', `${fmt(floor.cpuMsPerCreate.clients, 2)} / ${fmt(floor.cpuMsPerCreate.nats, 2)} (${fmt(floor.msgsPerCreate, 1)} msgs)`, `${fmt(2000 / TARGETS.placementsPerSec, 2)} in all for the target on 2 cores`],
            [`floor: group write of ${floor.sandboxes} (Paddock's pause ÷ floor)`, `${floor.groupWriteMs} ms (×${fmt(result.groupPause32kMs / Math.max(1, floor.groupWriteMs), 2)}); CPU ms per sandbox clients ${fmt(floor.groupWriteCpuMs.clients, 2)} / NATS ${fmt(floor.groupWriteCpuMs.nats, 2)}`, `pause ≤ ${TARGETS.groupPauseMs}`],
          ]
        : []),
      ...(slope
        ? [
            [`placements/s at ${slope.nodes} nodes → ${o.nodes}`, `${fmt(slope.placementsPerSec, 0)} → ${fmt(result.placementsPerSec, 0)} (×${fmt(result.slope?.ratio ?? Number.NaN, 2)})`, '—'],
            [`CPU ms per create at ${slope.nodes} nodes: fleet / NATS`, `${fmt(slope.cpuMsPerCreate.fleet, 2)} / ${fmt(slope.cpuMsPerCreate.nats, 2)} (host ${fmt(slope.hostBusyCores, 2)} cores busy)`, '—'],
          ]
        : []),
    ])}\n`,
  );
  if (o.json) process.stdout.write(`${JSON.stringify(result)}\n`);
  await Promise.all(trainers.map((tr) => tr.call({ cmd: 'exit', seq: ++seq }).catch(() => {})));
}

runMain(async () => {
  try {
    await main();
  } finally {
    await cleanUp();
  }
});
