/**
 * The QoS benchmark: how much best-effort load slows a latency-sensitive agent's steps, with and
 * without Paddock's QoS classes.
 *
 *   npm run bench:qos [-- --rounds 3] [-- --steps 40] [-- --step-ms 50] [-- --think-ms 50] [-- --json]
 *
 * The agent is one long-running awk process in an LS sandbox (cpu 1) that repeats: think (sleep
 * `--think-ms`, as while waiting for the model), then a CPU-bound step (a busy loop calibrated once,
 * alone, to `--step-ms`). It times each step itself from /proc/self/schedstat — the nanoseconds it
 * ran plus the nanoseconds it sat runnable in a run queue, read just before the think and just after
 * the step — so the number is what the scheduler did to the step (including the wake-up after the
 * think), with no exec or NATS overhead in it.
 *
 * Best-effort load: one loader sandbox per core (cpu 1 each), each an awk busy loop with a duty
 * cycle — at 50% it burns 10 ms of CPU (measured the same way) then sleeps 10 ms; at 100% it never
 * sleeps. So "50% of the node" is one core's worth spread over every core, as many small BE jobs
 * would be, rather than one loop that the kernel would simply park on the other core. Settings:
 *   none  loaders in LS sandboxes: the agent's scheduling class and CPU weight;
 *   idle  loaders in LS sandboxes, their processes switched to SCHED_IDLE from the host
 *         (`chrt --idle -a -p 0`): the policy without the low weight;
 *   full  loaders in BE sandboxes: what `qos: 'be'` does (SCHED_IDLE and cpu weight 2).
 * Rounds interleave every configuration (alone, then each load × setting), so slow drifts of the
 * host's background load land on all of them alike; the host's CPU use during each is reported.
 * Progress goes to stderr; stdout carries the table and, with --json, one JSON object as its last line.
 */
import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { performance } from 'node:perf_hooks';
import { promisify } from 'node:util';
import { coreSchedulingAvailable } from '../../runtime/qos.ts';
import type { Sandbox } from '../../sdk/index.ts';
import {
  type BenchCluster,
  CLK_TCK,
  cgroupCpuSeconds,
  cgroupFile,
  cleanUpOnSignals,
  finishRun,
  fmt,
  hostCpu,
  numberArg,
  progress,
  runMain,
  sleep,
  startBenchNode,
  table,
  UsageError,
} from './harness.ts';
import { round3, type Summary, summarize } from './stats.ts';

const USAGE = 'usage: qos.ts [--rounds R] [--steps S] [--step-ms MS] [--think-ms MS] [--max-background PCT] [--quiet-wait S] [--json]';
const SETTINGS = ['none', 'idle', 'full'] as const;
type Setting = (typeof SETTINGS)[number];
const LOADS = [0.5, 1] as const;
type Load = (typeof LOADS)[number];
/** LS step inflation at 50% BE load with full QoS must stay under this (percent). */
const TARGET_PCT = 10;
/** The paper's numbers at 50% load, for the table. */
const PAPER = { none: 45.2, full: 17.3 };
/** CPU a loader burns per cycle at duty < 100%, in ms (then it sleeps for the rest of the cycle). */
const LOADER_BURST_MS = 10;
const SCHED_IDLE = 5;

interface Options {
  rounds: number;
  steps: number;
  stepMs: number;
  thinkMs: number;
  /** Before each configuration, wait for the host's own load (not the sandboxes') to fall under this percent… */
  maxBackground: number;
  /** …for at most this many seconds, then measure anyway (and say so). */
  quietWaitSec: number;
  json: boolean;
}

function parseArgs(argv: readonly string[]): Options {
  const o: Options = { rounds: 3, steps: 40, stepMs: 50, thinkMs: 50, maxBackground: 15, quietWaitSec: 120, json: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    const named = (name: string) => a === name || a.startsWith(`${name}=`);
    if (a === '--json') o.json = true;
    else if (named('--rounds')) ({ value: o.rounds, next: i } = numberArg(argv, i, '--rounds', USAGE));
    else if (named('--steps')) ({ value: o.steps, next: i } = numberArg(argv, i, '--steps', USAGE));
    else if (named('--step-ms')) ({ value: o.stepMs, next: i } = numberArg(argv, i, '--step-ms', USAGE, true));
    else if (named('--think-ms')) ({ value: o.thinkMs, next: i } = numberArg(argv, i, '--think-ms', USAGE, true));
    else if (named('--max-background')) ({ value: o.maxBackground, next: i } = numberArg(argv, i, '--max-background', USAGE, true));
    else if (named('--quiet-wait')) ({ value: o.quietWaitSec, next: i } = numberArg(argv, i, '--quiet-wait', USAGE, true));
    else if (a === '--help' || a === '-h') {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    } else throw new UsageError(`unknown argument ${a}\n${USAGE}`);
  }
  return o;
}

// ─── What runs in the sandboxes ─────────────────────────────────────────────────────────────────

/**
 * The agent: `steps` × (think, step); one line per step, "<ran ns> <waited ns>". /proc/self is awk
 * itself when awk opens it. busybox awk prints large integers exactly only through %.0f.
 */
const AGENT = `BEGIN {
  f = "/proc/self/schedstat"
  for (s = 0; s < steps; s++) {
    getline l < f; close(f); split(l, a, " ")
    if (think > 0) system("usleep " think)
    for (i = 0; i < iters; i++) ;
    getline l < f; close(f); split(l, b, " ")
    printf "%.0f %.0f\\n", b[1] - a[1], b[2] - a[2]
  }
}`;

/** A loader at a duty cycle below 100%: burn `burst` ns of CPU, sleep `pause` µs, forever. */
const LOADER = `BEGIN {
  f = "/proc/self/schedstat"
  for (;;) {
    getline l < f; close(f); split(l, a, " ")
    do {
      for (i = 0; i < 20000; i++) ;
      getline l < f; close(f); split(l, b, " ")
    } while (b[1] - a[1] < burst)
    system("usleep " pause)
  }
}`;
const SPIN = 'BEGIN { for (;;) ; }';

interface Step {
  ms: number;
  waitMs: number;
}

async function runAgent(agent: Sandbox, steps: number, iters: number, thinkUs: number): Promise<Step[]> {
  const r = await agent.exec(['awk', '-v', `steps=${steps}`, '-v', `iters=${iters}`, '-v', `think=${thinkUs}`, AGENT], { timeoutMs: 600_000 });
  if (r.exitCode !== 0) throw new Error(`agent exited ${r.exitCode}: ${r.stderr.trim()}`);
  const out: Step[] = [];
  for (const line of r.stdout.trim().split('\n')) {
    const [ran, waited] = line.split(' ').map(Number) as [number, number];
    out.push({ ms: (ran + waited) / 1e6, waitMs: waited / 1e6 });
  }
  if (out.length !== steps) throw new Error(`agent printed ${out.length} steps, expected ${steps}: ${r.stdout.slice(0, 200)}`);
  return out;
}

/**
 * Busy-loop iterations whose step takes `stepMs` alone: a short probe for a first guess, then the
 * real thing (think included: a core that was idle during the think runs the first milliseconds of a
 * step slower than a hot loop does) scaled by what its median step took.
 */
async function calibrate(agent: Sandbox, stepMs: number, thinkUs: number): Promise<number> {
  const probe = 200_000;
  const first = await runAgent(agent, 5, probe, 0);
  let iters = Math.round((stepMs * 1e6) / Math.min(...first.map((s) => ((s.ms - s.waitMs) * 1e6) / probe)));
  for (let pass = 0; pass < 2; pass++) {
    const ran = summarize((await runAgent(agent, 7, iters, thinkUs)).map((s) => s.ms - s.waitMs)).p50;
    iters = Math.round((iters * stepMs) / ran);
  }
  return iters;
}

/** Starts one loader in each sandbox at `duty` (0..1] of a core, detached from the exec. */
async function startLoaders(loaders: Sandbox[], duty: number): Promise<void> {
  const script = duty >= 1 ? SPIN : LOADER;
  const burstNs = LOADER_BURST_MS * 1e6;
  const pauseUs = Math.round(((LOADER_BURST_MS * (1 - duty)) / duty) * 1000);
  await Promise.all(
    loaders.map(async (sb) => {
      const r = await sb.exec(['sh', '-c', 'awk -v burst="$1" -v pause="$2" "$3" </dev/null >/dev/null 2>&1 &', 'sh', String(burstNs), String(pauseUs), script]);
      if (r.exitCode !== 0) throw new Error(`loader in ${sb.id} did not start: ${r.stderr.trim()}`);
    }),
  );
}

/** Kills every process of the loader sandboxes but their init (kill -1 spares pid 1 and the caller). */
async function stopLoaders(loaders: Sandbox[]): Promise<void> {
  await Promise.all(loaders.map((sb) => sb.exec(['sh', '-c', 'kill -9 -1; true'])));
}

// ─── Host-side views of the sandboxes ───────────────────────────────────────────────────────────

async function procsOf(b: BenchCluster, sb: Sandbox): Promise<number[]> {
  const text = await readFile(cgroupFile(`paddock/${b.nodeId}/${sb.id}`, 'cpu', 'cgroup.procs'), 'utf8');
  return text
    .split('\n')
    .map((x) => Number.parseInt(x, 10))
    .filter((p) => p > 1);
}

/** Scheduling policy of a process (field 41 of /proc/<pid>/stat). */
async function policyOf(pid: number): Promise<number | null> {
  const s = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => null);
  if (!s) return null;
  return Number(s.slice(s.lastIndexOf(')') + 2).split(' ')[38]);
}

async function commOf(pid: number): Promise<string> {
  return (await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '')).trim();
}

/** The loaders' awk processes (not the sandbox's init), host pids. */
async function loaderPids(b: BenchCluster, loaders: Sandbox[]): Promise<number[]> {
  const out: number[] = [];
  for (const sb of loaders) for (const pid of await procsOf(b, sb)) if ((await commOf(pid)) === 'awk') out.push(pid);
  return out;
}

/** The `idle` setting: SCHED_IDLE on the loaders' processes, set from the host; their weight stays. */
async function makeIdle(pids: number[]): Promise<void> {
  for (const pid of pids) await promisify(execFile)('chrt', ['--idle', '-a', '-p', '0', String(pid)]);
}

interface Evidence {
  loaders: number;
  schedIdle: number;
  shares: string;
}

/** What the kernel says about the loaders while they run: how many are SCHED_IDLE, their cgroups' cpu.shares. */
async function evidence(b: BenchCluster, loaders: Sandbox[], pids: number[]): Promise<Evidence> {
  let schedIdle = 0;
  for (const pid of pids) if ((await policyOf(pid)) === SCHED_IDLE) schedIdle++;
  const shares = new Set<string>();
  for (const sb of loaders) shares.add((await readFile(cgroupFile(`paddock/${b.nodeId}/${sb.id}`, 'cpu', 'cpu.shares'), 'utf8').catch(() => '?')).trim());
  return { loaders: pids.length, schedIdle, shares: [...shares].join('/') };
}

/**
 * Waits until the host's CPU use outside the sandboxes, over one second, is under `maxBackground`
 * percent — a shared host's other work competes with the agent as much as the loaders do — for at
 * most `quietWaitSec`.
 */
async function awaitQuiet(sandboxesCpu: () => Promise<number>, o: Options): Promise<{ loud: boolean }> {
  const until = performance.now() + o.quietWaitSec * 1000;
  let said = false;
  for (;;) {
    const [h0, s0] = [await hostCpu(), await sandboxesCpu()];
    await sleep(1000);
    const [h1, s1] = [await hostCpu(), await sandboxesCpu()];
    const jiffies = Math.max(1, h1.total - h0.total);
    const background = (100 * (h1.busy - h0.busy - (s1 - s0) * CLK_TCK)) / jiffies;
    if (background <= o.maxBackground) return { loud: false };
    if (performance.now() > until) {
      progress(`the host stayed busy (${fmt(background, 0)}% outside the sandboxes): measuring anyway`);
      return { loud: true };
    }
    if (!said) progress(`waiting for the host to quieten (${fmt(background, 0)}% busy outside the sandboxes, want ≤ ${o.maxBackground}%)`);
    said = true;
  }
}

// ─── Runs ───────────────────────────────────────────────────────────────────────────────────────

type ConfigName = 'alone' | `be${50 | 100}.${Setting}`;

interface Config {
  name: ConfigName;
  load?: Load;
  setting?: Setting;
}

const CONFIGS: Config[] = [{ name: 'alone' }, ...LOADS.flatMap((load) => SETTINGS.map((setting) => ({ name: `be${load * 100}.${setting}` as ConfigName, load, setting })))];

interface Measured {
  steps: Step[];
  /** Host CPU busy during the agent's runs, percent of all cores. */
  hostBusyPct: number[];
  /** The part of it that was not the node's sandboxes (agent and loaders): the host's background. */
  backgroundPct: number[];
  /** Runs that started while the background was still over --max-background (the wait ran out). */
  loudRuns: number;
  evidence?: Evidence;
}

async function measure(b: BenchCluster, o: Options, agent: Sandbox, loaders: Record<Setting, Sandbox[]>, iters: number): Promise<Map<ConfigName, Measured>> {
  const results = new Map<ConfigName, Measured>(CONFIGS.map((c) => [c.name, { steps: [], hostBusyPct: [], backgroundPct: [], loudRuns: 0 }]));
  const sandboxesCpu = () => cgroupCpuSeconds(`paddock/${b.nodeId}`);
  for (let round = 1; round <= o.rounds; round++) {
    for (const c of CONFIGS) {
      const m = results.get(c.name) as Measured;
      const set = c.setting ? loaders[c.setting] : [];
      if (c.load && c.setting) {
        await startLoaders(set, c.load);
        // The loaders must be running (and switched to SCHED_IDLE for `idle`) before the agent starts.
        await sleep(200);
        const pids = await loaderPids(b, set);
        if (pids.length !== set.length) throw new Error(`${c.name}: ${pids.length} loader processes running, expected ${set.length}`);
        if (c.setting === 'idle') await makeIdle(pids);
        m.evidence = await evidence(b, set, pids);
      }
      try {
        const waited = await awaitQuiet(sandboxesCpu, o);
        if (waited.loud) m.loudRuns++;
        const [h0, s0] = [await hostCpu(), await sandboxesCpu()];
        const steps = await runAgent(agent, o.steps, iters, Math.round(o.thinkMs * 1000));
        const [h1, s1] = [await hostCpu(), await sandboxesCpu()];
        m.steps.push(...steps);
        const jiffies = Math.max(1, h1.total - h0.total);
        const busy = (100 * (h1.busy - h0.busy)) / jiffies;
        // /proc/stat counts jiffies of all cores: the sandboxes' CPU seconds in the same unit.
        const ours = (100 * (s1 - s0) * CLK_TCK) / jiffies;
        m.hostBusyPct.push(busy);
        m.backgroundPct.push(Math.max(0, busy - ours));
        progress(`round ${round}/${o.rounds} ${c.name}: step p50 ${fmt(summarize(steps.map((s) => s.ms)).p50, 1)} ms, host ${fmt(busy, 0)}% busy, ${fmt(m.backgroundPct.at(-1) ?? Number.NaN, 0)}% of it not ours`);
      } finally {
        if (set.length > 0) await stopLoaders(set);
      }
    }
  }
  return results;
}

// ─── Report ─────────────────────────────────────────────────────────────────────────────────────

interface Row {
  name: ConfigName;
  s: Summary;
  waitP50: number;
  hostBusy: number;
  background: number;
  inflP50: number;
  inflP95: number;
  loudRuns: number;
  evidence?: Evidence;
}

const mean = (xs: number[]) => xs.reduce((a, x) => a + x, 0) / Math.max(1, xs.length);

function rows(results: Map<ConfigName, Measured>): Row[] {
  const base = summarize((results.get('alone') as Measured).steps.map((s) => s.ms));
  return CONFIGS.map((c) => {
    const m = results.get(c.name) as Measured;
    const s = summarize(m.steps.map((x) => x.ms));
    const row: Row = {
      name: c.name,
      s,
      waitP50: summarize(m.steps.map((x) => x.waitMs)).p50,
      hostBusy: mean(m.hostBusyPct),
      background: mean(m.backgroundPct),
      inflP50: (100 * (s.p50 - base.p50)) / base.p50,
      inflP95: (100 * (s.p95 - base.p95)) / base.p95,
      loudRuns: m.loudRuns,
    };
    if (m.evidence) row.evidence = m.evidence;
    return row;
  });
}

function humanReport(o: Options, rs: Row[], iters: number, core: string): string {
  const pct = (x: number) => `${x >= 0 ? '+' : ''}${x.toFixed(1)}%`;
  const t = table([
    ['configuration', 'p50 ms', 'p95 ms', 'wait p50 ms', 'p50 infl.', 'p95 infl.', 'host busy', 'background', 'loaders SCHED_IDLE', 'loader cpu.shares'],
    ...rs.map((r) => [
      r.name,
      fmt(r.s.p50, 2),
      fmt(r.s.p95, 2),
      fmt(r.waitP50, 2),
      r.name === 'alone' ? '—' : pct(r.inflP50),
      r.name === 'alone' ? '—' : pct(r.inflP95),
      `${fmt(r.hostBusy, 0)}%`,
      `${fmt(r.background, 0)}%`,
      r.evidence ? `${r.evidence.schedIdle}/${r.evidence.loaders}` : '—',
      r.evidence?.shares ?? '—',
    ]),
  ]);
  const loud = rs.reduce((a, r) => a + r.loudRuns, 0);
  const full50 = rs.find((r) => r.name === 'be50.full') as Row;
  const none50 = rs.find((r) => r.name === 'be50.none') as Row;
  return [
    `Paddock QoS — an LS agent step of ~${o.stepMs} ms CPU (${iters} awk iterations) after ${o.thinkMs} ms of think, ${o.rounds} rounds × ${o.steps} steps per configuration; ${cpus().length} cores, one loader sandbox per core`,
    core,
    '',
    t,
    '',
    `at 50% BE load: no QoS ${pct(none50.inflP50)} (paper +${PAPER.none}%), full QoS ${pct(full50.inflP50)} (paper +${PAPER.full}%); target ≤ +${TARGET_PCT}%: ${full50.inflP50 <= TARGET_PCT ? 'PASS' : 'FAIL'}`,
    ...(loud > 0 ? [`${loud} of ${rs.length * o.rounds} runs started with the host's background over ${o.maxBackground}% (the wait for quiet ran out): read those with care`] : []),
    'wait = time the step sat runnable in a run queue (schedstat); host busy = all CPU of the host; background = the part not spent in the sandboxes (other processes compete with the agent too)',
  ].join('\n');
}

function jsonReport(rs: Row[]): string {
  const infl = (load: 50 | 100) => Object.fromEntries(SETTINGS.map((s) => [s, round3((rs.find((r) => r.name === `be${load}.${s}`) as Row).inflP50)]));
  return JSON.stringify({ baselineP50Ms: round3((rs[0] as Row).s.p50), be50: infl(50), be100: infl(100) });
}

// ─── Main ───────────────────────────────────────────────────────────────────────────────────────

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  cleanUpOnSignals();
  const core = await coreSchedulingAvailable();
  progress(core.detail);
  let b: BenchCluster | undefined;
  let ok = false;
  try {
    b = await startBenchNode({ prefix: 'qos', env: {} });
    const c = b;
    // Stopping the node (cleanup) kills these.
    const create = (qos: 'ls' | 'be') => c.pdk.sandboxes.create({ cpu: 1, qos });
    const agent = await create('ls');
    const n = cpus().length;
    const loaders: Record<Setting, Sandbox[]> = { none: [], idle: [], full: [] };
    for (const s of SETTINGS) for (let i = 0; i < n; i++) loaders[s].push(await create(s === 'full' ? 'be' : 'ls'));

    progress(`calibrating a ${o.stepMs} ms step`);
    const iters = await calibrate(agent, o.stepMs, Math.round(o.thinkMs * 1000));
    const t0 = performance.now();
    const results = await measure(c, o, agent, loaders, iters);
    progress(`measured in ${fmt((performance.now() - t0) / 1000, 0)} s`);
    const rs = rows(results);
    process.stdout.write(`${humanReport(o, rs, iters, core.detail)}\n`);
    if (o.json) process.stdout.write(`${jsonReport(rs)}\n`);
    ok = true;
  } finally {
    await finishRun(ok, b?.cluster.nodes);
  }
}

runMain(main);
