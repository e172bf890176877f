/**
 * The density benchmark: how many idle sandboxes one node holds, and what each costs.
 *
 *   npm run bench:density [-- --n 3200] [-- --concurrency 32] [-- --execs 200] [-- --json]
 *
 * One run, against one local node whose admission limits are raised to fit N small sandboxes
 * (busybox, cpu 0.01, 16 MiB — idle agents ask for little):
 *   1. creates N sandboxes of one group, `--concurrency` requests in flight, until N are live;
 *      reports creates per second (and per window of creates, to show whether it slows with N);
 *   2. with all N live: the node's RSS (VmRSS of the node process), host memory used per sandbox
 *      ((MemTotal − MemAvailable) after − before) / N, and the p50 of `exec true` on random sandboxes;
 *   3. `pdk.groups.pause(g)` and `pdk.groups.resume(g)` on all N, timed around the SDK call; the
 *      reply must say ok = N, and a sample of the sandboxes' freezer files must agree;
 *   4. `pdk.groups.kill(g)`, and checks that nothing is left: no sandbox on the node, no cgroup, no
 *      mount, no bundle directory.
 * Progress goes to stderr; stdout carries the table and, with --json, one JSON object as its last line.
 * `--cpu-profile DIR` has the node write a V8 CPU profile of the creates (step 1) into DIR.
 */
import { readdir, readFile, statfs } from 'node:fs/promises';
import { cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { decode, encode, type GroupReply, subjects } from '../../protocol/index.ts';
import { loadConfig } from '../../runtime/config.ts';
import { BUSYBOX_IMAGE } from '../../runtime/images/busybox.ts';
import { Paddock, PaddockError, type Sandbox } from '../../sdk/index.ts';
import {
  type BenchCluster,
  CLK_TCK,
  cgroupCpuSeconds,
  cgroupFile,
  childCgroups,
  cleanUpOnSignals,
  cpuSeconds,
  finishRun,
  fmt,
  hostCpu,
  hostUsedBytes,
  mountCount,
  numberArg,
  progress,
  rssBytes,
  runMain,
  sleep,
  startBenchNode,
  table,
  UsageError,
} from './harness.ts';
import { round3, summarize } from './stats.ts';

const USAGE = 'usage: density.ts [--n N] [--concurrency C] [--execs E] [--cpu CORES] [--cpu-profile DIR] [--json]';
/** What every sandbox asks for; `--cpu` overrides the CPU (its CFS quota is cpu × 100 ms per 100 ms). */
const SPEC = { image: BUSYBOX_IMAGE, cpu: 0.01, memoryMiB: 16, ttlSec: 6 * 3600 } as const;
/** Creates per progress line (and per window of the create-rate trend). */
const WINDOW = 200;
/** Freezer files read to confirm what a group reply claims. */
const FREEZER_SAMPLE = 50;
const GROUP_TIMEOUT_MS = 600_000;
const WARMUP_EXECS = 5;

const TARGETS = { live: 3200, supervisorRssBytes: 1024 ** 3, execP50Ms: 10, createPerSec: 100, groupPauseMs: 2000 };

interface Options {
  n: number;
  concurrency: number;
  execs: number;
  cpu: number;
  json: boolean;
  /** Where the node writes a V8 CPU profile of the create phase (PADDOCK_CPU_PROFILE). */
  cpuProfile?: string;
}

function parseArgs(argv: readonly string[]): Options {
  const o: Options = { n: 3200, concurrency: 32, execs: 200, cpu: SPEC.cpu, json: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    const named = (name: string) => a === name || a.startsWith(`${name}=`);
    if (a === '--json') o.json = true;
    else if (a === '--cpu-profile' || a.startsWith('--cpu-profile=')) {
      const dir = a === '--cpu-profile' ? argv[++i] : a.slice('--cpu-profile='.length);
      if (!dir) throw new UsageError(`--cpu-profile: expected a directory\n${USAGE}`);
      o.cpuProfile = dir;
    } else if (named('--n')) ({ value: o.n, next: i } = numberArg(argv, i, '--n', USAGE));
    else if (named('--concurrency')) ({ value: o.concurrency, next: i } = numberArg(argv, i, '--concurrency', USAGE));
    else if (named('--execs')) ({ value: o.execs, next: i } = numberArg(argv, i, '--execs', USAGE));
    else if (named('--cpu')) ({ value: o.cpu, next: i } = numberArg(argv, i, '--cpu', USAGE, true));
    else if (a === '--help' || a === '-h') {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    } else throw new UsageError(`unknown argument ${a}\n${USAGE}`);
  }
  return o;
}

/** Admission limits raised so N sandboxes of SPEC fit, never lowered below the defaults. */
function nodeEnv(n: number, cpu: number): { env: Record<string, string>; note: string } {
  const d = loadConfig({});
  const cores = cpus().length;
  const memMiB = totalmem() / 1024 / 1024;
  const cpuOc = Math.max(d.overcommit.cpu, Math.ceil(((n + 1) * cpu) / cores));
  const memOc = Math.max(d.overcommit.memory, (Math.ceil((((n + 1) * SPEC.memoryMiB) / memMiB) * 100) + 1) / 100);
  const max = Math.max(d.maxSandboxes, n);
  return {
    env: { PADDOCK_CPU_OVERCOMMIT: String(cpuOc), PADDOCK_MEMORY_OVERCOMMIT: String(memOc), PADDOCK_MAX_SANDBOXES: String(max) },
    note: `node admission: cpu ×${cpuOc}, memory ×${memOc}, at most ${max} sandboxes (defaults ×${d.overcommit.cpu}, ×${d.overcommit.memory}, ${d.maxSandboxes})`,
  };
}

function errorCode(e: unknown): string {
  if (e instanceof PaddockError) return e.code;
  return e instanceof Error ? e.name : 'UNKNOWN';
}

// ─── Phases ─────────────────────────────────────────────────────────────────────────────────────

interface Window {
  upTo: number;
  perSec: number;
  p50Ms: number;
  nodeRssBytes: number;
  /** Node CPU (itself + its children: the spawner and the crun runs it reaped) per create in the window. */
  nodeCpuMsPerCreate: number;
  /** Of which the node process itself (its JavaScript, libuv, V8), and its children. */
  nodeSelfCpuMsPerCreate: number;
  nodeChildrenCpuMsPerCreate: number;
  /** CPU charged to the sandboxes' cgroups per create: crun's setup inside the container, then init. */
  sandboxCpuMsPerCreate: number;
  /** CPU of the host's pid 1 per create (on the development VM an agent whose cost grows with the number of processes). */
  initCpuMsPerCreate: number;
  /**
   * All the host's busy CPU per create: the above, and what none of them is charged for — crun's
   * work in a new container before it joins the sandbox's cgroup, nats-server, this bench's client,
   * kernel threads.
   */
  hostCpuMsPerCreate: number;
  hostBusyPct: number;
}

interface CreatePhase {
  live: Sandbox[];
  wallMs: number;
  latencies: number[];
  windows: Window[];
  errors: Record<string, number>;
  firstError?: string;
}

/**
 * Creates up to N sandboxes, `concurrency` at a time. The first failure stops new creates (the rest
 * in flight finish): at scale, the point where it breaks and why is the finding, not a retry.
 */
async function createAll(b: BenchCluster, o: Options, group: string): Promise<CreatePhase> {
  const live: Sandbox[] = [];
  const latencies: number[] = [];
  const windows: Window[] = [];
  const errors: Record<string, number> = {};
  let firstError: string | undefined;
  let next = 0;
  let stop = false;
  const t0 = performance.now();
  const sandboxesCgroup = `paddock/${b.nodeId}`;
  // The node's cgroup parent appears with its first sandbox: none yet reads as 0 (NaN || 0).
  const reading = async () => ({ t: performance.now(), cpu: await cpuSeconds(b.nodePid), sb: (await cgroupCpuSeconds(sandboxesCgroup)) || 0, init: (await cpuSeconds(1).catch(() => ({ self: Number.NaN }))).self, host: await hostCpu() });
  let win = { ...(await reading()), from: 0 };
  const closeWindow = async () => {
    const { t: now, cpu, sb, init, host } = await reading();
    const count = latencies.length - win.from;
    if (count === 0) return;
    const w: Window = {
      upTo: latencies.length,
      perSec: count / ((now - win.t) / 1000),
      p50Ms: summarize(latencies.slice(win.from)).p50,
      nodeRssBytes: await rssBytes(b.nodePid).catch(() => Number.NaN),
      nodeCpuMsPerCreate: ((cpu.self + cpu.children - win.cpu.self - win.cpu.children) * 1000) / count,
      nodeSelfCpuMsPerCreate: ((cpu.self - win.cpu.self) * 1000) / count,
      nodeChildrenCpuMsPerCreate: ((cpu.children - win.cpu.children) * 1000) / count,
      sandboxCpuMsPerCreate: ((sb - win.sb) * 1000) / count,
      initCpuMsPerCreate: ((init - win.init) * 1000) / count,
      hostCpuMsPerCreate: (((host.busy - win.host.busy) / CLK_TCK) * 1000) / count,
      hostBusyPct: (100 * (host.busy - win.host.busy)) / Math.max(1, host.total - win.host.total),
    };
    windows.push(w);
    progress(
      `created ${w.upTo}/${o.n}: ${w.perSec.toFixed(1)}/s, p50 ${w.p50Ms.toFixed(1)} ms, node ${(w.nodeRssBytes / 2 ** 20).toFixed(0)} MiB RSS; CPU-ms per create: node ${w.nodeCpuMsPerCreate.toFixed(1)} (self ${w.nodeSelfCpuMsPerCreate.toFixed(1)} + children ${w.nodeChildrenCpuMsPerCreate.toFixed(1)}), sandbox ${w.sandboxCpuMsPerCreate.toFixed(1)}, pid 1 ${w.initCpuMsPerCreate.toFixed(1)}; host ${w.hostBusyPct.toFixed(0)}% busy`,
    );
    win = { t: now, cpu, sb, init, host, from: latencies.length };
  };
  let windowing = Promise.resolve();
  const worker = async () => {
    while (!stop && next < o.n) {
      next++;
      const s = performance.now();
      try {
        const sb = await b.pdk.sandboxes.create({ ...SPEC, cpu: o.cpu, group }, { timeoutMs: 300_000 });
        live.push(sb);
        latencies.push(performance.now() - s);
        if (latencies.length % WINDOW === 0) windowing = windowing.then(closeWindow);
      } catch (e) {
        const code = errorCode(e);
        errors[code] = (errors[code] ?? 0) + 1;
        if (!firstError) {
          firstError = `after ${live.length} live: ${code}: ${(e as Error).message}`;
          progress(`create failed ${firstError}; no more creates`);
        }
        stop = true;
      }
    }
  };
  await Promise.all(Array.from({ length: o.concurrency }, worker));
  const wallMs = performance.now() - t0;
  await windowing;
  if (latencies.length % WINDOW !== 0) await closeWindow();
  return { live, wallMs, latencies, windows, errors, ...(firstError ? { firstError } : {}) };
}

interface ExecPhase {
  roundTrip: number[];
  /** The node's own measure of each `crun exec`. */
  node: number[];
}

async function execRandom(live: Sandbox[], samples: number): Promise<ExecPhase> {
  progress(`exec true on ${samples} random sandboxes of ${live.length} (after ${WARMUP_EXECS} warm-ups)`);
  const pick = () => live[Math.floor(Math.random() * live.length)] as Sandbox;
  for (let i = 0; i < WARMUP_EXECS; i++) await pick().exec(['true']);
  const out: ExecPhase = { roundTrip: [], node: [] };
  for (let i = 0; i < samples; i++) {
    const sb = pick();
    const t0 = performance.now();
    const r = await sb.exec(['true']);
    out.roundTrip.push(performance.now() - t0);
    if (r.exitCode !== 0) throw new Error(`exec true in ${sb.id} exited ${r.exitCode}: ${r.stderr}`);
    out.node.push(r.durationMs);
  }
  return out;
}

/** Reads the freezer state of a sample of sandboxes: how many are in `want`. */
async function freezerSample(b: BenchCluster, live: Sandbox[], want: 'FROZEN' | 'THAWED'): Promise<{ matched: number; of: number }> {
  const sample = [...live].sort(() => Math.random() - 0.5).slice(0, FREEZER_SAMPLE);
  let matched = 0;
  for (const sb of sample) {
    const st = await readFile(cgroupFile(`paddock/${b.nodeId}/${sb.id}`, 'freezer', 'freezer.state'), 'utf8').catch(() => '');
    if (st.trim() === want) matched++;
  }
  return { matched, of: sample.length };
}

interface GroupPhase {
  ms: number;
  reply: GroupReply;
  freezer?: { matched: number; of: number };
  /** Kill: when the node had no sandbox left (the reply may come first, or time out first). */
  goneMs?: number;
}

async function nodeSandboxes(b: BenchCluster): Promise<number> {
  const m = await Paddock.connectionOf(b.pdk).request(subjects.node(b.nodeId, 'info'), encode({}), { timeout: 60_000 });
  return (decode(m.data) as { ok: boolean; result: { sandboxes: number } }).result.sandboxes;
}

async function groupVerb(b: BenchCluster, group: string, verb: 'pause' | 'resume' | 'kill', live: Sandbox[]): Promise<GroupPhase> {
  progress(`group ${verb} of ${live.length}`);
  const t0 = performance.now();
  const reply = await b.pdk.groups[verb](group, { timeoutMs: GROUP_TIMEOUT_MS });
  const ms = performance.now() - t0;
  progress(`group ${verb}: ${fmt(ms, 0)} ms, total ${reply.total}, ok ${reply.ok}, failed ${reply.failed.length}${reply.failed[0] ? ` (first: ${reply.failed[0].code} ${reply.failed[0].message})` : ''}, unreachable ${reply.unreachable.length}`);
  const out: GroupPhase = { ms, reply };
  if (verb !== 'kill') out.freezer = await freezerSample(b, live, verb === 'pause' ? 'FROZEN' : 'THAWED');
  else {
    // Placement gives up on a node after its own timeout; the node goes on killing. Wait for it.
    for (let left = await nodeSandboxes(b); left > 0 && performance.now() - t0 < GROUP_TIMEOUT_MS; left = await nodeSandboxes(b)) {
      progress(`kill: ${left} sandboxes still on the node after ${fmt((performance.now() - t0) / 1000, 0)} s`);
      await sleep(5000);
    }
    out.goneMs = performance.now() - t0;
  }
  return out;
}

interface Leftovers {
  nodeSandboxes: number;
  cgroups: number;
  bundles: number;
  /** Mounts of sandboxes (under the node's sandboxes/ directory) still in the node's namespace. */
  sandboxMounts: number;
  /** crun's cgroup.procs files on the node's private tmpfs over cgroup `unified` (hybrid hosts). */
  unifiedFiles: number;
}

/** Files and bytes on the node's private tmpfs at /sys/fs/cgroup/unified (seen through /proc/<pid>/root). */
async function unifiedUsage(nodePid: number): Promise<{ files: number; usedBytes: number; sizeBytes: number } | null> {
  const root = `/proc/${nodePid}/root/sys/fs/cgroup/unified`;
  const st = await statfs(root).catch(() => null);
  // Not a tmpfs: not the hybrid-host arrangement (TMPFS_MAGIC).
  if (st?.type !== 0x01021994) return null;
  let files = 0;
  const walk = async (d: string) => {
    for (const e of await readdir(d, { withFileTypes: true }).catch(() => [])) {
      if (e.isDirectory()) await walk(join(d, e.name));
      else files++;
    }
  };
  await walk(root);
  return { files, usedBytes: (st.blocks - st.bfree) * st.bsize, sizeBytes: st.blocks * st.bsize };
}

/** The node's bundle directory, as the node sees it (a tmpfs in its own mount namespace). */
function sandboxesDir(b: BenchCluster): string {
  return join(b.home, 'nodes', b.nodeId, 'run', 'sandboxes');
}

async function leftovers(b: BenchCluster): Promise<Leftovers> {
  const bundles = await readdir(`/proc/${b.nodePid}/root${sandboxesDir(b)}`).catch(() => [] as string[]);
  return {
    nodeSandboxes: await nodeSandboxes(b),
    cgroups: (await childCgroups(`paddock/${b.nodeId}`)).size,
    bundles: bundles.length,
    sandboxMounts: await mountCount(b.nodePid, sandboxesDir(b)),
    unifiedFiles: (await unifiedUsage(b.nodePid))?.files ?? 0,
  };
}

// ─── Report ─────────────────────────────────────────────────────────────────────────────────────

interface Result {
  o: Options;
  note: string;
  create: CreatePhase;
  createPerSec: number;
  rssBefore: number;
  rssAfter: number;
  hostBytesPerSandbox: number;
  mountsPerSandbox: number;
  unified: { files: number; usedBytes: number; sizeBytes: number } | null;
  exec: ExecPhase;
  pause: GroupPhase;
  resume: GroupPhase;
  kill: GroupPhase;
  left: Leftovers;
}

const MiB = 2 ** 20;

function humanReport(r: Result): string {
  const live = r.create.live.length;
  const execS = summarize(r.exec.roundTrip);
  const execNode = summarize(r.exec.node);
  const createS = summarize(r.create.latencies);
  const pass = (ok: boolean) => (ok ? 'PASS' : 'FAIL');
  const rows: string[][] = [
    ['measure', 'value', 'target', 'result'],
    ['live sandboxes', String(live), `≥ ${TARGETS.live}`, pass(live >= TARGETS.live)],
    ['create throughput', `${fmt(r.createPerSec, 1)}/s`, `≥ ${TARGETS.createPerSec}/s`, pass(r.createPerSec >= TARGETS.createPerSec)],
    ['supervisor RSS', `${fmt(r.rssAfter / MiB, 0)} MiB`, `≤ ${TARGETS.supervisorRssBytes / MiB} MiB`, pass(r.rssAfter <= TARGETS.supervisorRssBytes)],
    ['host memory / sandbox', `${fmt(r.hostBytesPerSandbox / 1024, 0)} KiB`, '—', '—'],
    ['exec true p50', `${fmt(execS.p50)} ms`, `≤ ${TARGETS.execP50Ms} ms`, pass(execS.p50 <= TARGETS.execP50Ms)],
    [`group pause (${live})`, `${fmt(r.pause.ms, 0)} ms`, `≤ ${TARGETS.groupPauseMs} ms`, pass(r.pause.ms <= TARGETS.groupPauseMs && r.pause.reply.ok === live)],
    [`group resume (${live})`, `${fmt(r.resume.ms, 0)} ms`, '—', r.resume.reply.ok === live ? 'ok' : 'FAIL'],
    [`group kill (${live}), until none left`, `${fmt(r.kill.goneMs ?? r.kill.ms, 0)} ms`, '—', r.kill.reply.ok === live ? 'ok' : 'FAIL'],
  ];
  const trend = table([
    ['creates up to', 'per s', 'p50 ms', 'node RSS MiB', 'CPU-ms/create: node', 'node self', 'node children', 'sandbox', 'pid 1', 'whole host', 'host busy %'],
    ...r.create.windows.map((w) => [
      String(w.upTo),
      fmt(w.perSec, 1),
      fmt(w.p50Ms, 1),
      fmt(w.nodeRssBytes / MiB, 0),
      fmt(w.nodeCpuMsPerCreate, 1),
      fmt(w.nodeSelfCpuMsPerCreate, 1),
      fmt(w.nodeChildrenCpuMsPerCreate, 1),
      fmt(w.sandboxCpuMsPerCreate, 1),
      fmt(w.initCpuMsPerCreate, 1),
      fmt(w.hostCpuMsPerCreate, 1),
      fmt(w.hostBusyPct, 0),
    ]),
  ]);
  // What Paddock itself spends per create (the node with its mount/crun children, and crun's setup
  // inside the container): the create rate an otherwise idle host of this many cores would allow.
  const ws = r.create.windows;
  const counted = ws.reduce((a, w, i) => a + (w.upTo - (ws[i - 1]?.upTo ?? 0)), 0);
  const avg = (f: (w: Window) => number) => ws.reduce((a, w, i) => a + f(w) * (w.upTo - (ws[i - 1]?.upTo ?? 0)), 0) / Math.max(1, counted);
  const own = avg((w) => w.nodeCpuMsPerCreate + w.sandboxCpuMsPerCreate);
  const last = ws.at(-1);
  const g = (p: GroupPhase) =>
    `reply total ${p.reply.total}, ok ${p.reply.ok}, failed ${p.reply.failed.length}, unreachable ${p.reply.unreachable.length}, placement-side ${p.reply.durationMs} ms${p.freezer ? `; freezer sample ${p.freezer.matched}/${p.freezer.of}` : ''}${p.goneMs !== undefined ? `; no sandbox left on the node after ${fmt(p.goneMs, 0)} ms` : ''}`;
  const errs = Object.entries(r.create.errors).map(([c, k]) => `${c}: ${k}`);
  const left = r.left;
  const clean = left.nodeSandboxes === 0 && left.cgroups === 0 && left.bundles === 0 && left.sandboxMounts === 0 && left.unifiedFiles === 0;
  return [
    `Paddock density — N=${r.o.n} busybox sandboxes (cpu ${r.o.cpu}, ${SPEC.memoryMiB} MiB), ${r.o.concurrency} creates in flight; ${cpus().length} cores, ${fmt(totalmem() / 2 ** 30, 1)} GiB; ${r.note}`,
    '',
    table(rows),
    '',
    `create: ${live} live in ${fmt(r.create.wallMs / 1000, 1)} s; latency p50 ${fmt(createS.p50, 1)} / p95 ${fmt(createS.p95, 1)} / p99 ${fmt(createS.p99, 1)} ms${errs.length ? `; errors ${errs.join(', ')} — ${r.create.firstError}` : ''}`,
    trend,
    `create CPU: node ${fmt(avg((w) => w.nodeCpuMsPerCreate), 1)} (self ${fmt(avg((w) => w.nodeSelfCpuMsPerCreate), 1)} + children ${fmt(avg((w) => w.nodeChildrenCpuMsPerCreate), 1)}) + sandbox ${fmt(avg((w) => w.sandboxCpuMsPerCreate), 1)} ms per create on average${last ? ` (${fmt(last.nodeCpuMsPerCreate, 1)} + ${fmt(last.sandboxCpuMsPerCreate, 1)} ms in the last window)` : ''}: ${cpus().length} otherwise idle cores would allow ~${fmt((cpus().length * 1000) / own, 0)} creates/s; pid 1 took ${fmt(avg((w) => w.initCpuMsPerCreate), 1)} ms per create more, and the whole host ${fmt(avg((w) => w.hostCpuMsPerCreate), 1)} ms (with crun's work in a container before it joins the sandbox's cgroup, nats-server, this client and kernel threads, which none of the above is charged for)`,
    `supervisor RSS: ${fmt(r.rssBefore / MiB, 0)} MiB before the first create, ${fmt(r.rssAfter / MiB, 0)} MiB with ${live} live (${fmt((r.rssAfter - r.rssBefore) / Math.max(1, live) / 1024, 1)} KiB per sandbox)`,
    `node mount namespace: ${fmt(r.mountsPerSandbox, 2)} mounts per sandbox${r.unified ? `; private tmpfs at cgroup/unified: ${r.unified.files} files, ${fmt(r.unified.usedBytes / MiB, 1)} of ${fmt(r.unified.sizeBytes / MiB, 0)} MiB` : ''}`,
    `exec true: p50 ${fmt(execS.p50)} / p95 ${fmt(execS.p95)} / p99 ${fmt(execS.p99)} ms round-trip (${execS.n} samples); the node's crun exec p50 ${fmt(execNode.p50)} / p95 ${fmt(execNode.p95)} / p99 ${fmt(execNode.p99)} ms`,
    `group pause: ${g(r.pause)}`,
    `group resume: ${g(r.resume)}`,
    `group kill: ${g(r.kill)}`,
    `after kill: ${clean ? 'clean' : 'NOT CLEAN'} — ${left.nodeSandboxes} sandboxes on the node, ${left.cgroups} cgroups, ${left.bundles} bundle dirs, ${left.sandboxMounts} sandbox mounts, ${left.unifiedFiles} files on the unified tmpfs`,
  ].join('\n');
}

function jsonReport(r: Result): string {
  return JSON.stringify({
    live: r.create.live.length,
    createPerSec: round3(r.createPerSec),
    supervisorRssBytes: r.rssAfter,
    hostBytesPerSandbox: Math.round(r.hostBytesPerSandbox),
    execP50Ms: round3(summarize(r.exec.roundTrip).p50),
    groupPauseMs: round3(r.pause.ms),
    groupResumeMs: round3(r.resume.ms),
  });
}

// ─── Main ───────────────────────────────────────────────────────────────────────────────────────

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  cleanUpOnSignals();
  const { env, note } = nodeEnv(o.n, o.cpu);
  if (o.cpuProfile) env.PADDOCK_CPU_PROFILE = o.cpuProfile;
  let b: BenchCluster | undefined;
  let ok = false;
  try {
    b = await startBenchNode({ prefix: 'dens', env });
    const group = `density-${process.pid}`;
    // The node is up and idle: this is the floor that N sandboxes add to.
    await sleep(1000);
    const hostBefore = await hostUsedBytes();
    const rssBefore = await rssBytes(b.nodePid);

    progress(`creating ${o.n} sandboxes, ${o.concurrency} in flight (${note})`);
    // SIGUSR2 starts and stops the node's profiler (ops/telemetry.ts): the creates and nothing else.
    if (o.cpuProfile) process.kill(b.nodePid, 'SIGUSR2');
    const create = await createAll(b, o, group);
    if (o.cpuProfile) {
      process.kill(b.nodePid, 'SIGUSR2');
      progress(`CPU profile of the node during the creates: ${o.cpuProfile}/node-${b.nodeId}-${b.nodePid}-0.cpuprofile`);
    }
    const live = create.live;
    if (live.length === 0) throw new Error(`no sandbox could be created: ${create.firstError ?? 'unknown'}`);
    const createPerSec = live.length / (create.wallMs / 1000);

    // Let creates' transient memory (crun, mount, page cache of bundles) settle before reading.
    await sleep(3000);
    const hostAfter = await hostUsedBytes();
    const rssAfter = await rssBytes(b.nodePid);
    const mountsPerSandbox = (await mountCount(b.nodePid, sandboxesDir(b))) / live.length;
    const unified = await unifiedUsage(b.nodePid);
    progress(`${live.length} live: node RSS ${fmt(rssAfter / MiB, 0)} MiB, host +${fmt((hostAfter - hostBefore) / MiB, 0)} MiB`);

    const exec = await execRandom(live, o.execs);
    const pause = await groupVerb(b, group, 'pause', live);
    const resume = await groupVerb(b, group, 'resume', live);
    const kill = await groupVerb(b, group, 'kill', live);
    // Directory writes and cgroup removal trail the reply a little.
    await sleep(1000);
    const left = await leftovers(b);

    const r: Result = { o, note, create, createPerSec, rssBefore, rssAfter, hostBytesPerSandbox: (hostAfter - hostBefore) / live.length, mountsPerSandbox, unified, exec, pause, resume, kill, left };
    process.stdout.write(`${humanReport(r)}\n`);
    if (o.json) process.stdout.write(`${jsonReport(r)}\n`);
    ok = true;
  } finally {
    await finishRun(ok, b?.cluster.nodes);
  }
}

runMain(main);
