/**
 * The spine benchmark: what Paddock's create → exec → kill path costs, next to the floor — the same
 * operations done by hand with `mount` and `crun` from a bash loop, with no Paddock in between.
 *
 *   npm run bench [-- --n 50] [-- --json] [-- --node-defaults]
 *
 * One run does, in order:
 *   1. the floor: a generated bash script in a private mount namespace mounts the busybox layer and
 *      an overlay and runs `crun run -d` N times, then `crun exec … true`, then `crun delete -f` and
 *      the umounts, timing each operation with $EPOCHREALTIME;
 *   2. Paddock (one local node behind its embedded NATS, driven through the SDK): N sequential
 *      creates, the same number of `true` execs, N kills;
 *   3. 100 creates at once against Paddock: how many succeed, how the others fail.
 *
 * Both sides use the same OCI config (`ociConfig` with the image store's busybox manifest and the
 * default spec), so the floor does the work Paddock asks crun to do, and nothing more. Progress
 * goes to stderr; stdout carries the table and, with --json, one JSON object as its last line.
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { cpus, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { validateSpec } from '../../protocol/index.ts';
import { detectCgroups } from '../../runtime/cgroups.ts';
import { loadConfig } from '../../runtime/config.ts';
import { ociConfig } from '../../runtime/container/oci.ts';
import { BUSYBOX_IMAGE } from '../../runtime/images/busybox.ts';
import { type ImageManifest, ImageStore } from '../../runtime/images/store.ts';
import { Paddock, PaddockError, type Sandbox } from '../../sdk/index.ts';
import { type LocalCluster, startLocalCluster } from '../local.ts';
import { type FloorBase, prepareFloor, runFloorScript, type Samples, scriptHead } from './floor.ts';
import { cleanUpOnSignals, finishRun, fmt, onCleanup, progress, removeCgroup, removeHiddenUnified, table, UsageError } from './harness.ts';
import { round3, type Summary, summarize } from './stats.ts';

const DEFAULT_N = 50;
/** p99 of fewer than 100 samples is just the maximum: exec is cheap, so take at least 100. */
const MIN_EXEC_SAMPLES = 100;
/** The first execs pay for cold caches (crun's binary, the sandbox's pages); they are not counted. */
const WARMUP_EXECS = 5;
const CONCURRENT = 100;
/** Paddock p50 over floor p50 that each operation must stay under. Kill has no target. */
const TARGETS: Partial<Record<Op, number>> = { create: 1.5, exec: 2 };
/** Parent cgroup of the floor's containers: apart from Paddock's `/paddock/…`, so cleanup cannot touch a node's. */
const FLOOR_CGROUP = 'paddock-bench-floor';
const FLOOR_TIMEOUT_MS = 15 * 60_000;

const OPS = ['create', 'exec', 'kill'] as const;
type Op = (typeof OPS)[number];

interface Options {
  n: number;
  json: boolean;
  /** Keep the node's admission limits as they are, instead of raising them to fit the benchmark. */
  nodeDefaults: boolean;
}

const USAGE = 'usage: spine.ts [--n N] [--json] [--node-defaults]';

function parseArgs(argv: readonly string[]): Options {
  const o: Options = { n: DEFAULT_N, json: false, nodeDefaults: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === '--json') o.json = true;
    else if (a === '--node-defaults') o.nodeDefaults = true;
    else if (a === '--n' || a.startsWith('--n=')) {
      const v = a === '--n' ? argv[++i] : a.slice(4);
      const n = Number(v);
      if (!Number.isInteger(n) || n < 1) throw new UsageError(`--n: expected a positive integer, got ${v ?? 'nothing'}\n${USAGE}`);
      o.n = n;
    } else if (a === '--help' || a === '-h') {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    } else throw new UsageError(`unknown argument ${a}\n${USAGE}`);
  }
  return o;
}


// ─── Floor ──────────────────────────────────────────────────────────────────────────────────────

interface FloorPlan extends FloorBase {
  warmups: number;
  execs: number;
}

/**
 * The floor as a bash script. Bundles (directories and config.json) are prepared beforehand and not
 * timed: Paddock writes them with in-process syscalls, which cost microseconds, while a `mkdir` from
 * bash would cost a fork and exec and inflate the floor. What is timed is what neither side can
 * avoid: the mounts and crun. One line per sample on stdout, `<op> <ms>`.
 *
 * Each floor sandbox mounts its own EROFS layer, where a Paddock node mounts a layer once and shares
 * it: the floor's create carries one mount more (reported as its own step, so it can be taken out).
 */
function floorScript(p: FloorPlan): string {
  return `${scriptHead(p, { warm: p.warmups, execs: p.execs })}
# Sandboxes that may hold a container or mounts; cleanup undoes whatever of them is left.
declare -A up=()
cleanup() {
  set +e
  for id in "\${!up[@]}"; do
    crun --root "$root" delete -f "$id" >/dev/null 2>&1
    umount "$base/$id/rootfs" 2>/dev/null
    for ((l = 0; l < nl; l++)); do umount "$base/$id/l$l" 2>/dev/null; done
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

for id in "\${ids[@]}"; do
  b=$base/$id
  up[$id]=1
  t0=$EPOCHREALTIME
  lower=
  for ((l = 0; l < nl; l++)); do
    mount -t erofs -o ro "\${layers[l]}" "$b/l$l"
    lower=$b/l$l\${lower:+:$lower}   # overlayfs wants the top layer first
  done
  t1=$EPOCHREALTIME
  mount -t overlay overlay -o "lowerdir=$lower,upperdir=$b/upper,workdir=$b/work" "$b/rootfs"
  t2=$EPOCHREALTIME
  # The container's init inherits crun's stdio: keep it off our stdout, or the reader never sees EOF.
  if ! crun --root "$root" run -d --bundle "$b" "$id" </dev/null >/dev/null 2>"$b/crun.err"; then
    echo "crun run $id: $(cat "$b/crun.err")" >&2
    exit 1
  fi
  t3=$EPOCHREALTIME
  emit create "$t0" "$t3"
  emit create.erofs "$t0" "$t1"
  emit create.overlay "$t1" "$t2"
  emit create.crun "$t2" "$t3"
done

for ((i = 0; i < warm + execs; i++)); do
  if ((i < warm)); then id=\${ids[i % n]}; else id=\${ids[(i - warm) % n]}; fi
  t0=$EPOCHREALTIME
  crun --root "$root" exec "$id" true </dev/null >/dev/null
  t1=$EPOCHREALTIME
  ((i < warm)) || emit exec "$t0" "$t1"
done

for id in "\${ids[@]}"; do
  b=$base/$id
  t0=$EPOCHREALTIME
  crun --root "$root" delete -f "$id"
  t1=$EPOCHREALTIME
  umount "$b/rootfs"
  for ((l = nl - 1; l >= 0; l--)); do umount "$b/l$l"; done
  t2=$EPOCHREALTIME
  unset "up[$id]"
  emit kill "$t0" "$t2"
  emit kill.crun "$t0" "$t1"
  emit kill.umount "$t1" "$t2"
done
`;
}

async function runFloor(o: { n: number; execs: number; image: ImageManifest; store: ImageStore }): Promise<Samples> {
  const base = await prepareFloor({ name: 'floor', cgroup: FLOOR_CGROUP, n: o.n, layers: o.image.layers.map((l) => o.store.blobPath(l.digest)) });
  const cgroupMode = base.cgroupMode;
  const spec = validateSpec({ image: BUSYBOX_IMAGE });
  const plan: FloorPlan = { ...base, warmups: WARMUP_EXECS, execs: o.execs };
  for (const id of plan.ids) {
    const b = join(plan.bundles, id);
    for (const d of ['upper', 'work', 'rootfs', ...plan.layers.map((_, l) => `l${l}`)]) await mkdir(join(b, d), { recursive: true });
    const config = ociConfig({ spec, image: o.image, rootfs: join(b, 'rootfs'), cgroupsPath: `/${FLOOR_CGROUP}/${id}`, cgroupMode });
    await writeFile(join(b, 'config.json'), JSON.stringify(config));
  }
  const script = join(base.dir, 'floor.sh');
  await writeFile(script, floorScript(plan), { mode: 0o755 });

  const samples = await runFloorScript(script, FLOOR_TIMEOUT_MS);
  for (const [op, want] of [
    ['create', o.n],
    ['exec', o.execs],
    ['kill', o.n],
  ] as const) {
    const got = samples.get(op)?.length ?? 0;
    if (got !== want) throw new Error(`floor: ${got} ${op} samples, expected ${want}`);
  }
  return samples;
}

// ─── Paddock ────────────────────────────────────────────────────────────────────────────────────

async function timed<T>(f: () => Promise<T>): Promise<{ value: T; ms: number }> {
  const t0 = performance.now();
  const value = await f();
  return { value, ms: performance.now() - t0 };
}

interface PaddockSamples {
  create: number[];
  exec: number[];
  kill: number[];
  /** The node's own measure of each `crun exec` (ExecResult.durationMs): the rest of a round-trip is Paddock. */
  execNode: number[];
}

async function runPaddock(pdk: Paddock, o: { n: number; execs: number }): Promise<PaddockSamples> {
  const s: PaddockSamples = { create: [], exec: [], kill: [], execNode: [] };
  const live: Sandbox[] = [];
  try {
    progress(`paddock: ${o.n} sequential creates`);
    for (let i = 0; i < o.n; i++) {
      const { value: sb, ms } = await timed(() => pdk.sandboxes.create({ image: BUSYBOX_IMAGE }));
      live.push(sb);
      s.create.push(ms);
    }
    progress(`paddock: ${o.execs} execs (after ${WARMUP_EXECS} warm-ups)`);
    const at = (i: number) => live[i % live.length] as Sandbox;
    for (let i = 0; i < WARMUP_EXECS; i++) await at(i).exec(['true']);
    for (let i = 0; i < o.execs; i++) {
      const { value: r, ms } = await timed(() => at(i).exec(['true']));
      if (r.exitCode !== 0) throw new Error(`exec true in ${at(i).id} exited ${r.exitCode}: ${r.stderr}`);
      s.exec.push(ms);
      s.execNode.push(r.durationMs);
    }
    progress(`paddock: ${o.n} kills`);
    for (let sb = live.shift(); sb; sb = live.shift()) {
      const target = sb;
      s.kill.push((await timed(() => target.kill())).ms);
    }
    return s;
  } finally {
    // After a failure: kill what is still up (stopping the node would too, but this says so sooner).
    await Promise.allSettled(live.map((sb) => sb.kill()));
  }
}

interface ConcurrentResult {
  ok: number;
  errors: Record<string, number>;
  wallMs: number;
  /** Latencies of the creates that succeeded. */
  okMs: number[];
  killFailures: number;
}

/** The wire code of an SDK error; anything else (a bug in the bench or the SDK) by its class name. */
function errorCode(e: unknown): string {
  if (e instanceof PaddockError) return e.code;
  return e instanceof Error ? e.name : 'UNKNOWN';
}

async function runConcurrent(pdk: Paddock, count: number): Promise<ConcurrentResult> {
  progress(`paddock: ${count} concurrent creates`);
  const t0 = performance.now();
  const settled = await Promise.allSettled(Array.from({ length: count }, () => timed(() => pdk.sandboxes.create({ image: BUSYBOX_IMAGE }))));
  const wallMs = performance.now() - t0;
  const made: Sandbox[] = [];
  const okMs: number[] = [];
  const errors: Record<string, number> = {};
  for (const r of settled) {
    if (r.status === 'fulfilled') {
      made.push(r.value.value);
      okMs.push(r.value.ms);
    } else {
      const code = errorCode(r.reason);
      errors[code] = (errors[code] ?? 0) + 1;
    }
  }
  progress(`paddock: killing the ${made.length} that were created`);
  const kills = await Promise.allSettled(made.map((sb) => sb.kill()));
  return { ok: made.length, errors, wallMs, okMs, killFailures: kills.filter((k) => k.status === 'rejected').length };
}

// ─── Report ─────────────────────────────────────────────────────────────────────────────────────

interface OpReport {
  paddock: Summary;
  floor: Summary;
}

function humanReport(o: Options, execs: number, ops: Record<Op, OpReport>, floor: Samples, execNode: Summary, conc: ConcurrentResult, capacityNote: string): string {
  const rows: string[][] = [['operation', 'p50 ms', 'p95 ms', 'p99 ms', 'floor p50 ms', 'ratio', 'target', 'result']];
  for (const op of OPS) {
    const { paddock: p, floor: f } = ops[op];
    const ratio = p.p50 / f.p50;
    const target = TARGETS[op];
    rows.push([op, fmt(p.p50), fmt(p.p95), fmt(p.p99), fmt(f.p50), `${ratio.toFixed(2)}×`, target === undefined ? '—' : `≤ ${target}×`, target === undefined ? '—' : ratio <= target ? 'PASS' : 'FAIL']);
  }
  const stepP50 = (name: string) => fmt(summarize(floor.get(name) ?? []).p50);
  const codes = Object.entries(conc.errors).map(([c, k]) => `${c}: ${k}`);
  const okS = summarize(conc.okMs);
  return [
    `Paddock spine — N=${o.n} sandboxes (busybox), ${execs} exec samples after ${WARMUP_EXECS} warm-ups; ${cpus().length} cores, cgroups ${detectCgroups()}; ${capacityNote}`,
    '',
    table(rows),
    '',
    `floor p95/p99 ms: create ${fmt(ops.create.floor.p95)}/${fmt(ops.create.floor.p99)}, exec ${fmt(ops.exec.floor.p95)}/${fmt(ops.exec.floor.p99)}, kill ${fmt(ops.kill.floor.p95)}/${fmt(ops.kill.floor.p99)}`,
    `floor create p50 by step: erofs mount ${stepP50('create.erofs')} (Paddock: once per node) + overlay mount ${stepP50('create.overlay')} + crun run ${stepP50('create.crun')} ms`,
    `floor kill p50 by step: crun delete -f ${stepP50('kill.crun')} + umounts ${stepP50('kill.umount')} ms`,
    `paddock exec: the node's crun exec p50 ${fmt(execNode.p50)} ms of the ${fmt(ops.exec.paddock.p50)} ms round-trip`,
    `concurrent ${CONCURRENT} creates: ${conc.ok} ok, ${CONCURRENT - conc.ok} errors${codes.length ? ` (${codes.join(', ')})` : ''}; wall ${fmt(conc.wallMs)} ms; ok latency p50 ${fmt(okS.p50)} / p99 ${fmt(okS.p99)} ms${conc.killFailures ? `; ${conc.killFailures} kills failed` : ''}`,
  ].join('\n');
}

function jsonReport(n: number, ops: Record<Op, OpReport>, conc: ConcurrentResult): string {
  const op = (r: OpReport) => ({ p50Ms: round3(r.paddock.p50), p95Ms: round3(r.paddock.p95), p99Ms: round3(r.paddock.p99), floorP50Ms: round3(r.floor.p50) });
  return JSON.stringify({ n, create: op(ops.create), exec: op(ops.exec), kill: op(ops.kill), concurrent100: { ok: conc.ok, errors: conc.errors } });
}

// ─── Main ───────────────────────────────────────────────────────────────────────────────────────

/**
 * Node settings for the run. Admission allows cores × 16 CPUs by default, which on a 2-core host is
 * room for 32 default (1-CPU) sandboxes: fewer than N or the 100 concurrent creates would need. The benchmark
 * measures the spine, not admission, so unless --node-defaults it raises the overcommit just enough.
 * `slots` is how many default sandboxes the node will admit.
 */
function nodeEnv(o: Options, need: number): { env: Record<string, string>; slots: number; note: string } {
  const dflt = loadConfig({});
  const spec = validateSpec({});
  const cores = cpus().length;
  const memMiB = totalmem() / 1024 / 1024;
  const slots = (cpuOc: number, memOc: number, max: number) => Math.min(Math.floor((cores * cpuOc) / spec.cpu), Math.floor((memMiB * memOc) / spec.memoryMiB), max);
  const { cpu, memory } = dflt.overcommit;
  if (o.nodeDefaults) {
    const n = slots(cpu, memory, dflt.maxSandboxes);
    return { env: {}, slots: n, note: `node admission at its defaults: room for ${n} default sandboxes` };
  }
  const cpuOc = Math.max(cpu, Math.ceil((need * spec.cpu) / cores));
  const memOc = Math.max(memory, Math.ceil(((need * spec.memoryMiB) / memMiB) * 100 + 1) / 100);
  const max = Math.max(dflt.maxSandboxes, need);
  return {
    env: { PADDOCK_CPU_OVERCOMMIT: String(cpuOc), PADDOCK_MEMORY_OVERCOMMIT: String(memOc), PADDOCK_MAX_SANDBOXES: String(max) },
    slots: slots(cpuOc, memOc, max),
    note: `node overcommit raised to cpu ×${cpuOc}, memory ×${memOc} (defaults ×${cpu}, ×${memory}; keep them with --node-defaults) so ${need} default sandboxes fit`,
  };
}

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  const execs = Math.max(o.n, MIN_EXEC_SAMPLES);
  cleanUpOnSignals();

  const { env, slots, note } = nodeEnv(o, Math.max(o.n, CONCURRENT));
  // The N sandboxes live at once; more than the node admits would end the run half-way.
  if (o.n > slots) throw new UsageError(`--n ${o.n}: the node admits only ${slots} default sandboxes with its default limits`);
  const imagesDir = process.env.PADDOCK_IMAGES_DIR || '/var/lib/paddock/images';
  const home = await mkdtemp(join(tmpdir(), 'paddock-bench-'));
  onCleanup('home', () => rm(home, { recursive: true, force: true }));

  let cluster: LocalCluster | undefined;
  let ok = false;
  try {
    progress(`starting a local node (home ${home}, images ${imagesDir})`);
    // A prefix of our own keeps this run's cgroups (/paddock/<node id>) apart from other clusters'.
    cluster = await startLocalCluster({ home, nodes: 1, prefix: `bench${process.pid}n`, imagesDir, env });
    const c = cluster;
    onCleanup('cluster', async () => {
        await c.stop();
        // A stopped node should leave no cgroup of its own; say so when it does, then tidy up.
        for (const node of c.nodes) {
          const left = await removeCgroup(`paddock/${node.id}`);
          if (left.length > 0) progress(`paddock left ${left.length} cgroup(s) behind, removed: ${left.join(' ')}`);
          const hidden = await removeHiddenUnified(`paddock/${node.id}`);
          if (hidden > 0) progress(`paddock left ${hidden} sandboxes' cgroup.procs files on /sys/fs/cgroup's tmpfs under unified/paddock/${node.id}, removed`);
        }
    });
    const pdk = await Paddock.connect({ servers: cluster.url });
    // Interrupted runs may find NATS already gone: nothing is left to close then.
    onCleanup('sdk', () => pdk.close().catch(() => {}));

    // The node built (or found) the busybox image at start: the floor mounts the very same blob.
    const store = new ImageStore(imagesDir);
    const image = await store.get(BUSYBOX_IMAGE);
    if (!image) throw new Error(`no ${BUSYBOX_IMAGE} image in ${imagesDir} after the node started`);

    // The floor first, while the node idles: both sides then run next to the same background.
    progress(`floor: ${o.n} creates, ${execs} execs, ${o.n} kills with crun in a shell loop`);
    const floor = await runFloor({ n: o.n, execs, image, store });
    const p = await runPaddock(pdk, { n: o.n, execs });
    const conc = await runConcurrent(pdk, CONCURRENT);

    const ops = {} as Record<Op, OpReport>;
    for (const op of OPS) ops[op] = { paddock: summarize(p[op]), floor: summarize(floor.get(op) ?? []) };
    process.stdout.write(`${humanReport(o, execs, ops, floor, summarize(p.execNode), conc, note)}\n`);
    if (o.json) process.stdout.write(`${jsonReport(o.n, ops, conc)}\n`);
    ok = true;
  } finally {
    await finishRun(ok, cluster?.nodes);
  }
}

main().catch((err: unknown) => {
  const detail = err instanceof UsageError ? err.message : err instanceof Error ? (err.stack ?? err.message) : String(err);
  process.stderr.write(`bench failed: ${detail}\n`);
  process.exitCode = 1;
});
