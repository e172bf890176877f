/**
 * The FnCall benchmark: one-shot invocations through FnCall, next to the same work done through a
 * fresh container sandbox per call (create, exec, kill via the SDK) and the floor — the same
 * program spawned directly on this host, with no isolation at all.
 *
 *   npm run bench:fncall [-- --json] [-- --quick] [-- --concurrency K]
 *
 * Three workloads:
 *   python   `print(1)`                                    (floor: python3 -c 'print(1)')
 *   c        a small C program compiled, then run          (floor: gcc -O2 … && ./a.out)
 *   judge10  a python solution judged against 10 tests     (floor: 10 × python3 with each stdin, compared)
 * For each: latency (sequential calls after warm-ups: p50, p99) and throughput (K calls in flight,
 * invocations per second). Then the limits: an infinite loop under a 300 ms CPU limit, invoked
 * one after another — its latency (p50/p95, beside the limit itself: what a caller waits for a
 * TIME_LIMIT verdict), the time it queued for a member, and how long the node took to make a
 * member fresh again after the kill (the pool's own measure, from the end of the invocation to
 * the member being ready for the next caller). The floor runs as a generated bash loop timed with $EPOCHREALTIME, as
 * in the spine benchmark: the cheapest way to start the program, so the floor is what the program
 * itself costs (spawning it from Node instead costs ~2× as much: a fork of a 100 MB process).
 * The host's /usr/bin/python3 is Debian bookworm's, the same interpreter as the `python` image's.
 * Progress goes to stderr; stdout carries the table and, with --json, one JSON object as its last
 * line.
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { cgroupDir, detectCgroups } from '../../runtime/cgroups.ts';
import { ensureLanguageImages } from '../../runtime/fncall/languages.ts';
import { ImageStore } from '../../runtime/images/store.ts';
import { type FnRequest, Paddock } from '../../sdk/index.ts';
import { type LocalCluster, startLocalCluster } from '../local.ts';
import { round3, summarize } from './stats.ts';

const TARGETS = { throughputVsFloor: 0.7, throughputVsSandbox: 3, p50VsFloor: 1.5 };
/**
 * Floor and FnCall take turns in batches of about this many invocations per loop (see compare):
 * short turns, so that both meet the same background on a shared machine.
 */
const TURN = 5;

interface Options {
  json: boolean;
  quick: boolean;
  concurrency: number;
}

const USAGE = 'usage: fncall.ts [--json] [--quick] [--concurrency K]';

function parseArgs(argv: readonly string[]): Options {
  const o: Options = { json: false, quick: false, concurrency: 2 * cpus().length };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === '--json') o.json = true;
    else if (a === '--quick') o.quick = true;
    else if (a === '--concurrency') {
      const n = Number(argv[++i]);
      if (!Number.isInteger(n) || n < 1) throw new Error(`--concurrency: a positive integer\n${USAGE}`);
      o.concurrency = n;
    } else if (a === '--help' || a === '-h') {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    } else throw new Error(`unknown argument ${a}\n${USAGE}`);
  }
  return o;
}

const progress = (msg: string) => process.stderr.write(`bench: ${msg}\n`);

/** Runs a host command to its end; resolves to its stdout (rejects on a non-zero exit). */
function spawnOut(cmd: string, args: string[], stdin?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: [stdin === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout?.on('data', (d: Buffer) => out.push(d));
    child.stderr?.on('data', (d: Buffer) => err.push(d));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve(Buffer.concat(out).toString()) : reject(new Error(`${cmd} exited ${code}: ${Buffer.concat(err).toString().slice(0, 500)}`))));
    if (stdin !== undefined) child.stdin?.end(stdin);
  });
}

// ─── Workloads ──────────────────────────────────────────────────────────────────────────────────

const C_CODE = '#include <stdio.h>\nint main(void) {\n  long s = 0;\n  for (int i = 0; i < 1000; i++) s += i;\n  printf("%ld\\n", s);\n  return 0;\n}\n';
const C_OUT = '499500\n';
const JUDGE_CODE = 'a, b = map(int, input().split())\nprint(a + b)\n';
const TESTS = Array.from({ length: 10 }, (_, i) => ({ stdin: `${i} ${i * 7}\n`, expected: `${i + i * 7}\n` }));

/** One invocation of a workload, done one of three ways; `worker` tells concurrent callers apart. */
type Call = (worker: number) => Promise<void>;

interface Workload {
  name: 'python' | 'c' | 'judge10';
  fn: FnRequest;
  check: (stdout: string, passed?: number) => boolean;
  /**
   * The floor: bash that does one invocation in "$d" (a directory of its own per loop, holding
   * main.c and the tests' in<i>/exp<i>) and fails when the output is wrong; $PY is the interpreter.
   */
  floor: string;
  sandbox: (pdk: Paddock) => Call;
  /** Sequential samples and calls for throughput: [fncall/floor, sandbox]. */
  latency: [number, number];
  calls: [number, number];
}

function workloads(quick: boolean): Workload[] {
  const q = (n: number) => (quick ? Math.max(3, Math.ceil(n / 5)) : n);
  return [
    {
      name: 'python',
      fn: { language: 'python', code: 'print(1)\n' },
      check: (s) => s === '1\n',
      floor: `"$PY" -c 'print(1)' > "$d/out" && read -r o < "$d/out" && [[ $o == 1 ]]`,
      sandbox: (pdk) => async () => {
        const sb = await pdk.sandboxes.create({ image: 'python' });
        try {
          const r = await sb.exec(['python3', '-c', 'print(1)']);
          if (r.stdout !== '1\n') throw new Error(`sandbox: wrong output ${JSON.stringify(r)}`);
        } finally {
          await sb.kill();
        }
      },
      latency: [q(100), q(15)],
      calls: [q(300), q(30)],
    },
    {
      name: 'c',
      fn: { language: 'c', code: C_CODE },
      check: (s) => s === C_OUT,
      floor: `gcc -std=gnu17 -O2 -pipe -o "$d/main" "$d/main.c" -lm && "$d/main" > "$d/out" && read -r o < "$d/out" && [[ $o == ${C_OUT.trim()} ]]`,
      sandbox: (pdk) => async () => {
        const sb = await pdk.sandboxes.create({ image: 'gcc' });
        try {
          await sb.files.write('/tmp/main.c', C_CODE);
          const r = await sb.exec(['sh', '-c', 'cd /tmp && gcc -std=gnu17 -O2 -pipe -o main main.c -lm && ./main']);
          if (r.stdout !== C_OUT) throw new Error(`sandbox: wrong output ${JSON.stringify(r)}`);
        } finally {
          await sb.kill();
        }
      },
      latency: [q(30), q(8)],
      calls: [q(80), q(16)],
    },
    {
      name: 'judge10',
      fn: { language: 'python', code: JUDGE_CODE, tests: TESTS },
      check: (_, passed) => passed === 10,
      floor: `for i in ${TESTS.map((_, i) => i).join(' ')}; do "$PY" "$d/sol.py" < "$d/in$i" > "$d/out" && read -r o < "$d/out" && read -r e < "$d/exp$i" && [[ $o == "$e" ]] || exit 1; done`,
      sandbox: (pdk) => async () => {
        const sb = await pdk.sandboxes.create({ image: 'python' });
        try {
          await sb.files.write('/tmp/sol.py', JUDGE_CODE);
          for (const t of TESTS) {
            const r = await sb.exec(['python3', '/tmp/sol.py'], { stdin: t.stdin });
            if (r.stdout !== t.expected) throw new Error(`sandbox: wrong answer ${JSON.stringify(r)}`);
          }
        } finally {
          await sb.kill();
        }
      },
      latency: [q(30), q(6)],
      calls: [q(80), q(12)],
    },
  ];
}

// ─── Measuring ──────────────────────────────────────────────────────────────────────────────────

/** What one way of running a workload gives: throughput, latency, and the CPU one invocation costs. */
interface Measure {
  perSec: number;
  p50: number;
  p99: number;
  /** CPU time per invocation, of every process involved (see cpuOfPaddock and bashLoops). */
  cpuMs: number;
}

/**
 * `loops` concurrent loops of `each` invocations: their latencies (ms), the wall time of the
 * whole batch and the CPU time it cost.
 */
type Batch = (loops: number, each: number) => Promise<{ lat: number[]; wallMs: number; cpuMs: number }>;

function sdkBatch(call: Call, cpu: () => number): Batch {
  return async (loops, each) => {
    const lat: number[] = [];
    const c0 = cpu();
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: loops }, async (_, w) => {
        for (let i = 0; i < each; i++) {
          const a = performance.now();
          await call(w);
          lat.push(performance.now() - a);
        }
      }),
    );
    return { lat, wallMs: performance.now() - t0, cpuMs: cpu() - c0 };
  };
}

/**
 * The floor: `loops` bash loops at once, `each` invocations per loop, each timed with
 * $EPOCHREALTIME; bash's `times` gives the CPU of the loops and of everything they ran.
 */
function floorBatch(w: Workload, dir: string, python: string): Batch {
  return async (loops, each) => {
    const script = join(dir, `floor-${w.name}.sh`);
    await writeFile(
      script,
      `set -u
PY=${JSON.stringify(python)}
for k in $(seq 1 ${loops}); do
  (
    d=${JSON.stringify(dir)}/w$k
    for i in $(seq 1 ${each}); do
      t0=$EPOCHREALTIME
      { ${w.floor}; } || { echo "floor ${w.name}: wrong output" >&2; exit 1; }
      t1=$EPOCHREALTIME
      echo "$t0 $t1"
    done > ${JSON.stringify(dir)}/lat$k
  ) &
done
fail=0
for j in $(jobs -p); do wait "$j" || fail=1; done
times
exit $fail
`,
    );
    const t0 = performance.now();
    const out = await spawnOut('bash', [script]);
    const wallMs = performance.now() - t0;
    // `times`: "0m0.010s 0m0.002s" for the shell, then the same for its children.
    const cpuMs = [...out.matchAll(/(\d+)m([\d.]+)s/g)].reduce((sum, m) => sum + (Number(m[1]) * 60 + Number(m[2])) * 1000, 0);
    const lat: number[] = [];
    for (let k = 1; k <= loops; k++) {
      for (const line of (await readFile(join(dir, `lat${k}`), 'utf8')).trim().split('\n')) {
        const [a, b] = line.split(' ').map(Number);
        if (a !== undefined && b !== undefined) lat.push((b - a) * 1000);
      }
    }
    return { lat, wallMs, cpuMs };
  };
}

class Tally {
  readonly lat: number[] = [];
  calls = 0;
  wallMs = 0;
  cpuMs = 0;
  result(): Measure {
    const s = summarize(this.lat);
    return { perSec: (this.calls / this.wallMs) * 1000, p50: s.p50, p99: s.p99, cpuMs: this.cpuMs / this.calls };
  }
}

/**
 * Measures several methods in interleaved rounds (latency batch, then throughput batch, each
 * method in turn, the order alternating), so that all of them see, on average, the same
 * background: on a shared 2-core machine other work comes and goes within seconds.
 */
async function compare<K extends string>(what: string, batches: Record<K, Batch>, latencyN: number, calls: number, concurrency: number): Promise<Record<K, Measure>> {
  const rounds = Math.max(2, Math.round(calls / (concurrency * TURN)));
  const names = Object.keys(batches) as K[];
  const tallies = Object.fromEntries(names.map((n) => [n, new Tally()])) as Record<K, Tally>;
  for (const n of names) await batches[n](1, Math.min(3, latencyN));
  const latEach = Math.max(1, Math.ceil(latencyN / rounds));
  const loops = Math.max(1, Math.min(concurrency, Math.ceil(calls / rounds)));
  const each = Math.max(1, Math.ceil(calls / rounds / loops));
  for (let r = 0; r < rounds; r++) {
    for (const n of r % 2 === 0 ? names : [...names].reverse()) {
      const t = tallies[n];
      t.lat.push(...(await batches[n](1, latEach)).lat);
      const b = await batches[n](loops, each);
      t.calls += loops * each;
      t.wallMs += b.wallMs;
      t.cpuMs += b.cpuMs;
    }
  }
  const out = Object.fromEntries(names.map((n) => [n, tallies[n].result()])) as Record<K, Measure>;
  for (const n of names) {
    const m = out[n];
    progress(`${what} ${n}: ${m.perSec.toFixed(1)}/s, p50 ${m.p50.toFixed(1)} ms, p99 ${m.p99.toFixed(1)} ms, ${m.cpuMs.toFixed(1)} ms CPU per invocation`);
  }
  return out;
}

/**
 * CPU time Paddock spends, in ms, cumulative: the node and nats-server processes, everything in
 * the node's cgroups (FnCall members and sandboxes), and this process (the SDK's side).
 */
function cpuOfPaddock(cluster: LocalCluster): () => number {
  const ticks = (pid: number | undefined) => {
    if (!pid) return 0;
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) * 10;
  };
  const mode = detectCgroups();
  const node = cluster.nodes[0]?.id as string;
  const cgroup = () => {
    try {
      if (mode === 'v2') return Number(/usage_usec (\d+)/.exec(readFileSync(`${cgroupDir(mode, `/paddock/${node}`, '')}/cpu.stat`, 'utf8'))?.[1] ?? 0) / 1000;
      return Number(readFileSync(`${cgroupDir(mode, `/paddock/${node}`, 'cpuacct')}/cpuacct.usage`, 'utf8')) / 1e6;
    } catch {
      return 0; // no sandbox or member yet
    }
  };
  return () => {
    const self = process.cpuUsage();
    return ticks(cluster.nodes[0]?.proc.pid) + ticks(cluster.nats.proc.pid) + cgroup() + (self.user + self.system) / 1000;
  };
}

/** A TIME_LIMIT invocation: what the caller waits, what it queued, and the member's recycle. */
interface LimitRow {
  limitMs: number;
  n: number;
  p50: number;
  p95: number;
  queuedP50: number;
  recycleP50: number;
  recycleMax: number;
}

const LOOP_LIMIT_MS = 300;

async function measureTimeLimit(pdk: Paddock, node: string, quick: boolean): Promise<LimitRow> {
  // The pool keeps its last 64 recycle times: in a full run all of them are these kills.
  const n = quick ? 8 : 64;
  const lat: number[] = [];
  const queued: number[] = [];
  for (let i = 0; i < n; i++) {
    const a = performance.now();
    const r = await pdk.fn.invoke({ language: 'python', code: 'while True:\n    pass\n', limits: { timeMs: LOOP_LIMIT_MS } });
    lat.push(performance.now() - a);
    if (r.verdict !== 'TIME_LIMIT') throw new Error(`an infinite loop gave ${r.verdict}: ${r.reason ?? ''}`);
    queued.push(r.queuedMs);
  }
  // Let the last kill's reset finish before reading the pool's figures.
  await new Promise((r) => setTimeout(r, 500));
  const pools = ((await pdk.nodes.info(node)) as { fnPools?: Record<string, { recycleP50Ms: number; recycleMaxMs: number }> }).fnPools;
  const s = summarize(lat);
  const p95 = [...lat].sort((x, y) => x - y)[Math.min(lat.length - 1, Math.floor(lat.length * 0.95))] as number;
  const row = { limitMs: LOOP_LIMIT_MS, n, p50: s.p50, p95, queuedP50: summarize(queued).p50, recycleP50: pools?.python?.recycleP50Ms ?? Number.NaN, recycleMax: pools?.python?.recycleMaxMs ?? Number.NaN };
  progress(`time limit: p50 ${row.p50.toFixed(1)} ms, p95 ${row.p95.toFixed(1)} ms for a ${LOOP_LIMIT_MS} ms limit; queued p50 ${row.queuedP50.toFixed(1)} ms; member recycle p50 ${row.recycleP50} ms, max ${row.recycleMax} ms`);
  return row;
}

interface Row {
  fncall: Measure;
  floor: Measure;
  sandbox: Measure;
}

const fmt = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : '—');

function report(rows: Record<string, Row>, limit: LimitRow, o: Options): string {
  const lines = [
    `FnCall — ${cpus().length} cores, ${o.concurrency} calls in flight for throughput (and ${o.concurrency} members per FnCall pool), floor and FnCall taking turns every ~${TURN * o.concurrency} calls${o.quick ? ' (--quick: fewer samples)' : ''}; load average at the end ${loadavg()
      .map((x) => x.toFixed(1))
      .join(' ')}`,
    '',
    'workload | method   |   inv/s | p50 ms | p99 ms | CPU ms/inv',
    '---------+----------+---------+--------+--------+-----------',
  ];
  for (const [name, r] of Object.entries(rows)) {
    for (const [method, m] of [
      ['fncall', r.fncall],
      ['floor', r.floor],
      ['sandbox', r.sandbox],
    ] as const) {
      lines.push(`${name.padEnd(8)} | ${method.padEnd(8)} | ${fmt(m.perSec).padStart(7)} | ${fmt(m.p50).padStart(6)} | ${fmt(m.p99).padStart(6)} | ${fmt(m.cpuMs).padStart(10)}`);
    }
  }
  lines.push('');
  for (const [name, r] of Object.entries(rows)) {
    const vsFloor = r.fncall.perSec / r.floor.perSec;
    const vsSandbox = r.fncall.perSec / r.sandbox.perSec;
    const p50 = r.fncall.p50 / r.floor.p50;
    const verdict = (ok: boolean) => (name === 'python' ? (ok ? ' PASS' : ' FAIL') : '');
    lines.push(
      `${name}: throughput ${vsFloor.toFixed(2)}× the floor (target ≥ ${TARGETS.throughputVsFloor})${verdict(vsFloor >= TARGETS.throughputVsFloor)}, ` +
        `${vsSandbox.toFixed(1)}× a sandbox per call (≥ ${TARGETS.throughputVsSandbox})${verdict(vsSandbox >= TARGETS.throughputVsSandbox)}, ` +
        `p50 ${p50.toFixed(2)}× the floor (≤ ${TARGETS.p50VsFloor})${verdict(p50 <= TARGETS.p50VsFloor)}; ` +
        `CPU per invocation ${(r.fncall.cpuMs / r.floor.cpuMs).toFixed(2)}× the floor's`,
    );
  }
  lines.push(
    '',
    `time limit (python infinite loop, ${limit.limitMs} ms CPU, ${limit.n} calls one after another): verdict after p50 ${fmt(limit.p50)} ms, p95 ${fmt(limit.p95)} ms ` +
      `(${(limit.p50 / limit.limitMs).toFixed(2)}× the limit); queued p50 ${fmt(limit.queuedP50)} ms; member recycle after the kill p50 ${fmt(limit.recycleP50)} ms, max ${fmt(limit.recycleMax)} ms`,
  );
  return lines.join('\n');
}

function json(rows: Record<string, Row>, limit: LimitRow): string {
  const out: Record<string, unknown> = {};
  for (const [name, r] of Object.entries(rows)) {
    out[name] = {
      perSec: round3(r.fncall.perSec),
      p50Ms: round3(r.fncall.p50),
      p99Ms: round3(r.fncall.p99),
      floorPerSec: round3(r.floor.perSec),
      floorP50Ms: round3(r.floor.p50),
      floorP99Ms: round3(r.floor.p99),
      sandboxPerSec: round3(r.sandbox.perSec),
      sandboxP50Ms: round3(r.sandbox.p50),
      sandboxP99Ms: round3(r.sandbox.p99),
      cpuMs: round3(r.fncall.cpuMs),
      floorCpuMs: round3(r.floor.cpuMs),
      sandboxCpuMs: round3(r.sandbox.cpuMs),
    };
  }
  out.timeLimit = { limitMs: limit.limitMs, p50Ms: round3(limit.p50), p95Ms: round3(limit.p95), queuedP50Ms: round3(limit.queuedP50), recycleP50Ms: limit.recycleP50, recycleMaxMs: limit.recycleMax };
  return JSON.stringify(out);
}

// ─── Main ───────────────────────────────────────────────────────────────────────────────────────

/** The host's own interpreter, not a version-manager shim (pyenv's costs a bash script per call). */
function hostPython(): string {
  for (const p of ['/usr/bin/python3', '/usr/local/bin/python3']) if (existsSync(p)) return p;
  return 'python3';
}

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  const python = hostPython();
  await spawnOut('gcc', ['--version']).catch(() => {
    throw new Error('the C floor needs gcc on this host: apt-get install gcc libc6-dev');
  });
  const imagesDir = process.env.PADDOCK_IMAGES_DIR || '/var/lib/paddock/images';
  progress(`images python and gcc in ${imagesDir} (built the first time: minutes)`);
  await ensureLanguageImages(new ImageStore(imagesDir), { progress: process.stderr, copyFrom: [join(tmpdir(), 'paddock-test-images')] });

  const home = await mkdtemp(join(tmpdir(), 'paddock-bench-fn-'));
  const scratch = join(home, 'floor');
  let cluster: LocalCluster | undefined;
  let pdk: Paddock | undefined;
  const cleanUp = async () => {
    await pdk?.close().catch(() => {});
    await cluster?.stop().catch(() => {});
    await rm(home, { recursive: true, force: true });
  };
  for (const sig of ['SIGINT', 'SIGTERM'] as const) process.once(sig, () => void cleanUp().finally(() => process.exit(130)));
  try {
    // As many members as calls in flight: FnCall runs as many programs at once as the floor does.
    const members = o.concurrency;
    progress(`starting a local node (home ${home}; FnCall pools python=${members}, c=${members})`);
    cluster = await startLocalCluster({ home, nodes: 1, prefix: `fnb${process.pid}n`, imagesDir, env: { PADDOCK_FN_POOL: `python=${members},c=${members}`, PADDOCK_FN_MAX_MEMBERS: String(members) } });
    pdk = await Paddock.connect({ servers: cluster.url });
    const client = pdk;
    // One directory per floor loop, with everything a floor invocation reads.
    for (let k = 1; k <= o.concurrency; k++) {
      const d = join(scratch, `w${k}`);
      await mkdir(d, { recursive: true });
      await writeFile(join(d, 'main.c'), C_CODE);
      await writeFile(join(d, 'sol.py'), JUDGE_CODE);
      for (const [i, t] of TESTS.entries()) {
        await writeFile(join(d, `in${i}`), t.stdin);
        await writeFile(join(d, `exp${i}`), t.expected);
      }
    }

    // Measure warm pools, as a node that has been up a while has them.
    const node = cluster.nodes[0]?.id as string;
    for (const until = Date.now() + 180_000; ; await new Promise((r) => setTimeout(r, 250))) {
      const pools = ((await client.nodes.info(node)) as { fnPools?: Record<string, { members: number }> }).fnPools;
      if ((pools?.python?.members ?? 0) >= members && (pools?.gcc?.members ?? 0) >= members) break;
      if (Date.now() > until) throw new Error(`the warm pools did not fill in 3 minutes: ${JSON.stringify(pools)}`);
    }
    const rows: Record<string, Row> = {};
    const cpu = cpuOfPaddock(cluster);
    for (const w of workloads(o.quick)) {
      const fncall: Call = async () => {
        const r = await client.fn.invoke(w.fn);
        if (r.verdict !== 'OK' || !w.check(r.stdout, r.passed)) throw new Error(`fncall ${w.name}: ${JSON.stringify(r).slice(0, 500)}`);
      };
      const both = await compare(w.name, { floor: floorBatch(w, scratch, python), fncall: sdkBatch(fncall, cpu) }, w.latency[0], w.calls[0], o.concurrency);
      const sandbox = await compare(w.name, { sandbox: sdkBatch(w.sandbox(client), cpu) }, w.latency[1], w.calls[1], o.concurrency);
      rows[w.name] = { ...both, ...sandbox };
    }
    const limit = await measureTimeLimit(client, node, o.quick);
    process.stdout.write(`${report(rows, limit, o)}\n`);
    if (o.json) process.stdout.write(`${json(rows, limit)}\n`);
  } finally {
    await cleanUp();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
