/**
 * The density benchmark: how many idle sandboxes one node holds, and what each costs.
 *
 *   npm run bench:density [-- --n 3200] [-- --concurrency 32] [-- --execs 200] [-- --json]
 *
 * One run, against one local node whose admission limits are raised to fit N small sandboxes
 * (busybox, cpu 0.01, 32 MiB with a 16 MiB writable layer — idle agents ask for little):
 *   0. the machine: kernel, page-table isolation, what a fork+exec costs, how busy the host is idle;
 *      then the floor: bare crun at the same density (below);
 *   1. creates N sandboxes of one group, `--concurrency` requests in flight, until N are live;
 *      reports creates per second (and per window of creates, to show whether it slows with N);
 *      at 50 live it stops for the p50 of `exec true` there (exec at N is compared with it);
 *   2. with all N live: the node's RSS (VmRSS of the node process), host memory used per sandbox
 *      ((MemTotal − MemAvailable) after − before) / N, and the p50 of `exec true` on random sandboxes;
 *   3. `pdk.groups.pause(g)` and `pdk.groups.resume(g)` on all N, timed around the SDK call; the
 *      reply must say ok = N, and a sample of the sandboxes' freezer files must agree;
 *   4. `pdk.groups.kill(g)`, and checks that nothing is left: no sandbox on the node, no cgroup (the
 *      emptied ones the node keeps for new sandboxes, cgroup-pool.ts, are counted apart), no mount,
 *      no bundle directory;
 *   5. with `--again`, creates N once more (a trainer's next batch, into the kept cgroups) and
 *      reports that rate beside the first.
 * Processes started on the host (/proc/stat's `processes`) are counted per create, exec, and
 * sandbox paused, resumed and killed: on a host where a fork+exec costs milliseconds they are the cost.
 *
 * The floor (`--floor-parallel P`, `--no-floor` to skip): a generated bash script creates the same N containers
 * with `crun run -d`, P at once, from bundles of the same OCI config (seccomp, capabilities, user
 * namespace, cgroup limits; the CPU quota written after the run, as the node does, and cpusets made
 * ahead without load balancing, as the node does), times `crun exec true` on random ones with all N
 * live, and deletes them P at once. It does less than Paddock: the root is the busybox layer mounted
 * once and read-only (no writable layer, no overlay per container), nothing is recorded anywhere.
 * Paddock's figures are given as ratios of it.
 *
 * Progress goes to stderr; stdout carries the table and, with --json, one JSON object as its last line.
 * `--cpu-profile DIR` has the node write a V8 CPU profile of the creates (step 1) into DIR, or of one
 * group verb with `--cpu-profile-phase pause|resume|kill`.
 */
import { mkdir, mkdtemp, readdir, readFile, rm, statfs, writeFile } from 'node:fs/promises';
import { cpus, release, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { decode, encode, type GroupReply, subjects, validateSpec } from '../../protocol/index.ts';
import { cgroupDir } from '../../runtime/cgroups.ts';
import { loadConfig } from '../../runtime/config.ts';
import { cfsBandwidth, ociConfig } from '../../runtime/container/oci.ts';
import { BUSYBOX_IMAGE } from '../../runtime/images/busybox.ts';
import { ImageStore } from '../../runtime/images/store.ts';
import { connectionOf } from '../../sdk/client.ts';
import { PaddockError, type Sandbox } from '../../sdk/index.ts';
import { EMIT_FN, type FloorBase, prepareFloor, runFloorScript, type Samples, scriptHead } from './floor.ts';
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
  onCleanup,
  progress,
  rssBytes,
  runMain,
  sleep,
  startBenchNode,
  table,
  UsageError,
} from './harness.ts';
import { round3, type Summary, summarize } from './stats.ts';

const USAGE = 'usage: density.ts [--n N] [--concurrency C] [--execs E] [--cpu CORES] [--floor-parallel P | --no-floor] [--cpu-profile DIR [--cpu-profile-phase create|pause|resume|kill]] [--again] [--json]';
/**
 * What every sandbox asks for; `--cpu` overrides the CPU (its CFS quota is cpu × 100 ms per 100 ms).
 * The smallest writable layer (16 MiB) is memory on the node, and may be at most half of memoryMiB.
 */
const SPEC = { image: BUSYBOX_IMAGE, cpu: 0.01, memoryMiB: 32, diskMiB: 16, ttlSec: 6 * 3600 } as const;
/** Creates per progress line (and per window of the create-rate trend). */
const WINDOW = 200;
/** Freezer files read to confirm what a group reply claims. */
const FREEZER_SAMPLE = 50;
const GROUP_TIMEOUT_MS = 600_000;
const WARMUP_EXECS = 5;

/** Live sandboxes at which exec is measured first: exec at N is compared with it. */
const EXEC_AT = 50;
const FLOOR_TIMEOUT_MS = 60 * 60_000;
/** Parent cgroup of the floor's containers: apart from Paddock's `/paddock/…`, so cleanup cannot touch a node's. */
const FLOOR_CGROUP = 'paddock-bench-density-floor';

/**
 * Ratios hold on any host; the absolute figures (create rate, exec) held on a host where a fork+exec
 * costs well under a millisecond, and are printed for such hosts.
 */
const TARGETS = {
  live: 3200,
  supervisorRssBytes: 1024 ** 3,
  execP50Ms: 10,
  createPerSec: 100,
  groupPauseMs: 2000,
  groupKillMs: 20_000,
  /** Paddock's create rate at N over bare crun's at N. */
  createVsFloor: 0.8,
  /** Paddock's create rate at N over its own at 200 live. */
  createVsAt200: 0.7,
  /** Exec p50 at N over exec p50 at 50 live. */
  execVsAt50: 2,
  /** Exec p50 at N over bare crun's at N. */
  execVsFloor: 1,
};

interface Options {
  n: number;
  concurrency: number;
  execs: number;
  cpu: number;
  json: boolean;
  /** crun runs at once in the floor; 0: no floor. */
  floorParallel: number;
  /** Where the node writes a V8 CPU profile of the create phase (PADDOCK_CPU_PROFILE). */
  cpuProfile?: string;
  /** What the profile covers: the creates (default), or one group verb. */
  cpuProfilePhase: 'create' | GroupVerbName;
  /** After the kill, create N again (a trainer's next batch: the node reuses what the kill left, cgroup-pool.ts). */
  again: boolean;
}

type GroupVerbName = 'pause' | 'resume' | 'kill';

function parseArgs(argv: readonly string[]): Options {
  const o: Options = { n: 3200, concurrency: 32, execs: 200, cpu: SPEC.cpu, json: false, floorParallel: 8, cpuProfilePhase: 'create', again: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    const named = (name: string) => a === name || a.startsWith(`${name}=`);
    if (a === '--json') o.json = true;
    else if (a === '--again') o.again = true;
    else if (a === '--cpu-profile' || a.startsWith('--cpu-profile=')) {
      const dir = a === '--cpu-profile' ? argv[++i] : a.slice('--cpu-profile='.length);
      if (!dir) throw new UsageError(`--cpu-profile: expected a directory\n${USAGE}`);
      o.cpuProfile = dir;
    } else if (named('--n')) ({ value: o.n, next: i } = numberArg(argv, i, '--n', USAGE));
    else if (named('--concurrency')) ({ value: o.concurrency, next: i } = numberArg(argv, i, '--concurrency', USAGE));
    else if (named('--execs')) ({ value: o.execs, next: i } = numberArg(argv, i, '--execs', USAGE));
    else if (named('--cpu')) ({ value: o.cpu, next: i } = numberArg(argv, i, '--cpu', USAGE, true));
    else if (a === '--no-floor') o.floorParallel = 0;
    else if (named('--cpu-profile-phase')) {
      const v = a === '--cpu-profile-phase' ? argv[++i] : a.slice('--cpu-profile-phase='.length);
      if (v !== 'create' && v !== 'pause' && v !== 'resume' && v !== 'kill') throw new UsageError(`--cpu-profile-phase: create, pause, resume or kill, not ${v ?? 'nothing'}\n${USAGE}`);
      o.cpuProfilePhase = v;
    }
    else if (named('--floor-parallel')) ({ value: o.floorParallel, next: i } = numberArg(argv, i, '--floor-parallel', USAGE));
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

// ─── The machine and the floor ──────────────────────────────────────────────────────────────────

/** Processes started on the host since boot (/proc/stat `processes`): diff two readings. */
async function processesStarted(): Promise<number> {
  return Number(/^processes (\d+)$/m.exec(await readFile('/proc/stat', 'utf8'))?.[1] ?? Number.NaN);
}

interface Machine {
  kernel: string;
  /** /sys/devices/system/cpu/vulnerabilities/meltdown: "Mitigation: PTI" makes every syscall and fork dearer. */
  meltdown: string;
  /** One fork+exec of /bin/true from bash, the mean of 200. */
  forkExecMs: number;
  /** Host CPU busy while nothing of this run works (2 s before the first create): what others take. */
  idleBusyPct: number;
}

async function machineFacts(): Promise<Machine> {
  const dir = await mkdtemp(join(tmpdir(), 'paddock-bench-fork-'));
  onCleanup('fork probe', () => rm(dir, { recursive: true, force: true }));
  const script = join(dir, 'fork.sh');
  await writeFile(script, `export LC_ALL=C\n${EMIT_FN}\nt0=$EPOCHREALTIME\nfor ((i = 0; i < 200; i++)); do /bin/true; done\nemit forkexec "$t0" "$EPOCHREALTIME"\n`);
  const forkExecMs = ((await runFloorScript(script, 120_000)).get('forkexec')?.[0] ?? Number.NaN) / 200;
  const h0 = await hostCpu();
  await sleep(2000);
  const h1 = await hostCpu();
  return {
    kernel: release(),
    meltdown: (await readFile('/sys/devices/system/cpu/vulnerabilities/meltdown', 'utf8').catch(() => 'unknown')).trim(),
    forkExecMs,
    idleBusyPct: (100 * (h1.busy - h0.busy)) / Math.max(1, h1.total - h0.total),
  };
}

interface Floor {
  parallel: number;
  createPerSec: number;
  /** Creates per second over the last WINDOW creates: the rate at N live. */
  createPerSecAtN: number;
  create: Summary;
  exec: Summary;
  killMs: number;
  processesPerCreate: number;
  processesPerExec: number;
  processesPerKill: number;
}

interface FloorPlan extends FloorBase {
  /** The busybox layers and, on top, the mount points the image lacks: mounted once, read-only, shared. */
  shared: string;
  parallel: number;
  execs: number;
  /** Each container's CPU quota goes to `<quotaDir>/<id>/<quotaFile>`. */
  quotaDir: string;
  quotaFile: string;
  quota: string;
}

/**
 * The floor as a bash script: P loops of `crun run -d` then the quota write (a builtin), each
 * create's latency and its end since the start; `crun exec true` on random containers, one at a
 * time; P loops of `crun delete -f`. `procs` reads /proc/stat with builtins only (a $(…) would fork).
 */
function floorScript(p: FloorPlan): string {
  return `${scriptHead(p, { shared: p.shared, par: p.parallel, execs: p.execs, quota: p.quota, qdir: p.quotaDir, qfile: p.quotaFile })}
procs() { local k v r; while read -r k v r; do if [[ $k == processes ]]; then P_NOW=$v; return; fi; done < /proc/stat; }
count() { printf '%s %d.000\\n' "$1" $(( P_NOW - $2 )); }

cleanup() {
  set +e
  for id in "\${ids[@]}"; do
    [[ -d $root/$id ]] && crun --root "$root" delete -f "$id" >/dev/null 2>&1
  done
  umount "$shared" 2>/dev/null
  for ((l = 0; l < nl; l++)); do umount "$base/.l$l" 2>/dev/null; done
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# The layers and, on top, the mount points the image lacks (/proc, /dev, /sys): read-only, no upper.
lower=$base/.points
for ((l = nl - 1; l >= 0; l--)); do
  mkdir -p "$base/.l$l"
  mount -t erofs -o ro "\${layers[l]}" "$base/.l$l"
  lower=$lower:$base/.l$l
done
mount -t overlay overlay -o "lowerdir=$lower" "$shared"

creator() {
  local i id t0 t1
  for ((i = $1; i < n; i += par)); do
    id=\${ids[i]}
    t0=$EPOCHREALTIME
    # The container's init inherits crun's stdio: keep it off our stdout, or the reader never sees EOF.
    if ! crun --root "$root" run -d --bundle "$base/$id" "$id" </dev/null >/dev/null 2>"$base/$id/crun.err"; then
      echo "crun run $id: $(<"$base/$id/crun.err")" >&2
      exit 1
    fi
    echo "$quota" > "$qdir/$id/$qfile"
    t1=$EPOCHREALTIME
    emit create "$t0" "$t1"
    emit created "$start" "$t1"
  done
}

killer() {
  local i id
  for ((i = $1; i < n; i += par)); do
    id=\${ids[i]}
    crun --root "$root" delete -f "$id"
  done
}

run_all() {
  local pids=() w
  for ((w = 0; w < par; w++)); do "$1" "$w" & pids+=($!); done
  for w in "\${pids[@]}"; do wait "$w"; done
}

procs; p0=$P_NOW
start=$EPOCHREALTIME
run_all creator
emit createwall "$start" "$EPOCHREALTIME"
procs; count procs.create "$p0"

procs; p0=$P_NOW
for ((i = 0; i < 5 + execs; i++)); do
  id=\${ids[RANDOM % n]}
  t0=$EPOCHREALTIME
  crun --root "$root" exec "$id" true </dev/null >/dev/null
  t1=$EPOCHREALTIME
  ((i < 5)) || emit exec "$t0" "$t1"
done
procs; count procs.exec "$p0"

procs; p0=$P_NOW
t0=$EPOCHREALTIME
run_all killer
emit killwall "$t0" "$EPOCHREALTIME"
procs; count procs.kill "$p0"
`;
}

/** Bare crun at the density Paddock is asked for: see the header. */
async function runFloor(o: Options): Promise<Floor> {
  const store = new ImageStore(process.env.PADDOCK_IMAGES_DIR || '/var/lib/paddock/images');
  const image = await store.get(BUSYBOX_IMAGE);
  if (!image) throw new Error(`no ${BUSYBOX_IMAGE} image in the store: run the benchmark once without the floor (the node makes it)`);
  const base = await prepareFloor({ name: 'dfloor', cgroup: FLOOR_CGROUP, n: o.n, layers: image.layers.map((l) => store.blobPath(l.digest)) });
  const { cgroupMode } = base;
  const spec = validateSpec({ ...SPEC, cpu: o.cpu });
  // As the node does: the quota is written once crun is done, so crun's setup is not throttled.
  const bw = cfsBandwidth(spec.cpu);
  const plan: FloorPlan = {
    ...base,
    shared: join(base.dir, 'root'),
    parallel: o.floorParallel,
    execs: o.execs,
    quotaDir: cgroupDir(cgroupMode, `/${FLOOR_CGROUP}`, cgroupMode === 'v2' ? '' : 'cpu'),
    quotaFile: cgroupMode === 'v2' ? 'cpu.max' : 'cpu.cfs_quota_us',
    quota: cgroupMode === 'v2' ? `${bw.quota} ${bw.period}` : String(bw.quota),
  };
  await mkdir(plan.shared);
  for (const d of ['proc', 'dev', 'sys']) await mkdir(join(plan.bundles, '.points', d), { recursive: true, mode: 0o755 });
  progress(`floor: preparing ${o.n} bundles`);
  for (const id of plan.ids) {
    const b = join(plan.bundles, id);
    await mkdir(b, { recursive: true });
    const config = ociConfig({ spec, image, rootfs: plan.shared, cgroupsPath: `/${FLOOR_CGROUP}/${id}`, cgroupMode }) as {
      root: { readonly: boolean };
      linux: { resources: { cpu: { quota?: number } } };
    };
    config.root.readonly = true;
    delete config.linux.resources.cpu.quota;
    await writeFile(join(b, 'config.json'), JSON.stringify(config));
    // As the node does: a cpuset without load balancing (writing CPUs to a balancing one rebuilds the scheduler domains).
    if (cgroupMode === 'v1') {
      const cs = cgroupDir(cgroupMode, `/${FLOOR_CGROUP}/${id}`, 'cpuset');
      await mkdir(cs, { recursive: true });
      await writeFile(join(cs, 'cpuset.sched_load_balance'), '0');
    }
  }
  const script = join(base.dir, 'floor.sh');
  await writeFile(script, floorScript(plan), { mode: 0o755 });
  progress(`floor: ${o.n} crun run -d, ${o.floorParallel} at once; ${o.execs} crun exec with all live; ${o.n} crun delete -f`);
  let made = 0;
  const samples: Samples = await runFloorScript(script, FLOOR_TIMEOUT_MS, (line) => {
    if (line.startsWith('created ') && ++made % (WINDOW * 4) === 0) progress(`floor: ${made}/${o.n} created`);
  });
  const get = (k: string) => samples.get(k) ?? [];
  const created = get('created').sort((a, b) => a - b);
  if (created.length !== o.n || get('exec').length !== o.execs) throw new Error(`floor: ${created.length} creates and ${get('exec').length} execs, expected ${o.n} and ${o.execs}`);
  const last = Math.min(WINDOW, created.length - 1);
  const tail = (created.at(-1) as number) - (created.at(-1 - last) as number);
  return {
    parallel: o.floorParallel,
    createPerSec: o.n / ((get('createwall')[0] as number) / 1000),
    createPerSecAtN: last / (tail / 1000),
    create: summarize(get('create')),
    exec: summarize(get('exec')),
    killMs: get('killwall')[0] as number,
    processesPerCreate: (get('procs.create')[0] as number) / o.n,
    processesPerExec: (get('procs.exec')[0] as number) / (o.execs + 5),
    processesPerKill: (get('procs.kill')[0] as number) / o.n,
  };
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
  /** Of the host's, what neither the node, the sandboxes, nats-server nor this client took: pid 1, kernel threads, crun's work before it joins the cgroup. */
  otherCpuMsPerCreate: number;
  hostBusyPct: number;
}

interface CreatePhase {
  live: Sandbox[];
  wallMs: number;
  /** Processes started on the host while creating. */
  processes: number;
  latencies: number[];
  windows: Window[];
  errors: Record<string, number>;
  firstError?: string;
}

/**
 * Creates up to N sandboxes, `concurrency` at a time. The first failure stops new creates (the rest
 * in flight finish): at scale, the point where it breaks and why is the finding, not a retry.
 */
async function createAll(b: BenchCluster, o: Options, group: string, upTo: number, into?: CreatePhase): Promise<CreatePhase> {
  const live: Sandbox[] = into?.live ?? [];
  const latencies: number[] = into?.latencies ?? [];
  const windows: Window[] = into?.windows ?? [];
  const errors: Record<string, number> = into?.errors ?? {};
  let firstError = into?.firstError;
  let next = live.length;
  let stop = firstError !== undefined;
  const t0 = performance.now();
  const p0 = await processesStarted();
  const sandboxesCgroup = `paddock/${b.nodeId}`;
  const natsPid = b.cluster.nats.proc.pid ?? 0;
  // The node's cgroup parent appears with its first sandbox: none yet reads as 0 (NaN || 0).
  const reading = async () => {
    const own = process.cpuUsage();
    return {
      t: performance.now(),
      cpu: await cpuSeconds(b.nodePid),
      sb: (await cgroupCpuSeconds(sandboxesCgroup)) || 0,
      init: (await cpuSeconds(1).catch(() => ({ self: Number.NaN }))).self,
      nats: (await cpuSeconds(natsPid).catch(() => ({ self: Number.NaN }))).self,
      bench: (own.user + own.system) / 1e6,
      host: await hostCpu(),
    };
  };
  let win = { ...(await reading()), from: latencies.length };
  const closeWindow = async () => {
    const { t: now, cpu, sb, init, nats, bench, host } = await reading();
    const count = latencies.length - win.from;
    if (count === 0) return;
    const node = cpu.self + cpu.children - win.cpu.self - win.cpu.children;
    const hostMs = (((host.busy - win.host.busy) / CLK_TCK) * 1000) / count;
    const w: Window = {
      upTo: latencies.length,
      perSec: count / ((now - win.t) / 1000),
      p50Ms: summarize(latencies.slice(win.from)).p50,
      nodeRssBytes: await rssBytes(b.nodePid).catch(() => Number.NaN),
      nodeCpuMsPerCreate: (node * 1000) / count,
      nodeSelfCpuMsPerCreate: ((cpu.self - win.cpu.self) * 1000) / count,
      nodeChildrenCpuMsPerCreate: ((cpu.children - win.cpu.children) * 1000) / count,
      sandboxCpuMsPerCreate: ((sb - win.sb) * 1000) / count,
      initCpuMsPerCreate: ((init - win.init) * 1000) / count,
      hostCpuMsPerCreate: hostMs,
      otherCpuMsPerCreate: hostMs - ((node + (sb - win.sb) + (nats - win.nats) + (bench - win.bench)) * 1000) / count,
      hostBusyPct: (100 * (host.busy - win.host.busy)) / Math.max(1, host.total - win.host.total),
    };
    windows.push(w);
    progress(
      `created ${w.upTo}/${o.n}: ${w.perSec.toFixed(1)}/s, p50 ${w.p50Ms.toFixed(1)} ms, node ${(w.nodeRssBytes / 2 ** 20).toFixed(0)} MiB RSS; CPU-ms per create: node ${w.nodeCpuMsPerCreate.toFixed(1)} (self ${w.nodeSelfCpuMsPerCreate.toFixed(1)} + children ${w.nodeChildrenCpuMsPerCreate.toFixed(1)}), sandbox ${w.sandboxCpuMsPerCreate.toFixed(1)}, pid 1 ${w.initCpuMsPerCreate.toFixed(1)}, not Paddock's ${w.otherCpuMsPerCreate.toFixed(1)}; host ${w.hostBusyPct.toFixed(0)}% busy`,
    );
    win = { t: now, cpu, sb, init, nats, bench, host, from: latencies.length };
  };
  let windowing = Promise.resolve();
  const worker = async () => {
    while (!stop && next < upTo) {
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
  const processes = (await processesStarted()) - p0;
  await windowing;
  if (latencies.length % WINDOW !== 0) await closeWindow();
  return { live, wallMs: (into?.wallMs ?? 0) + wallMs, processes: (into?.processes ?? 0) + processes, latencies, windows, errors, ...(firstError ? { firstError } : {}) };
}

interface ExecPhase {
  /** Processes started on the host per exec (warm-ups included). */
  processesPerExec: number;
  roundTrip: number[];
  /** The node's own measure of each `crun exec`. */
  node: number[];
}

async function execRandom(live: Sandbox[], samples: number): Promise<ExecPhase> {
  progress(`exec true on ${samples} random sandboxes of ${live.length} (after ${WARMUP_EXECS} warm-ups)`);
  const pick = () => live[Math.floor(Math.random() * live.length)] as Sandbox;
  const p0 = await processesStarted();
  for (let i = 0; i < WARMUP_EXECS; i++) await pick().exec(['true']);
  const out: ExecPhase = { processesPerExec: 0, roundTrip: [], node: [] };
  for (let i = 0; i < samples; i++) {
    const sb = pick();
    const t0 = performance.now();
    const r = await sb.exec(['true']);
    out.roundTrip.push(performance.now() - t0);
    if (r.exitCode !== 0) throw new Error(`exec true in ${sb.id} exited ${r.exitCode}: ${r.stderr}`);
    out.node.push(r.durationMs);
  }
  out.processesPerExec = ((await processesStarted()) - p0) / (samples + WARMUP_EXECS);
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
  /** Processes started on the host per sandbox of the group (the kill: until none is left). */
  processesPerSandbox: number;
  reply: GroupReply;
  freezer?: { matched: number; of: number };
  /** Kill: when the node had no sandbox left (the reply may come first, or time out first). */
  goneMs?: number;
}

async function nodeSandboxes(b: BenchCluster): Promise<number> {
  const m = await connectionOf(b.pdk).request(subjects.node(b.nodeId, 'info'), encode({}), { timeout: 60_000 });
  return (decode(m.data) as { ok: boolean; result: { sandboxes: number } }).result.sandboxes;
}

async function groupVerb(b: BenchCluster, o: Options, group: string, verb: GroupVerbName, live: Sandbox[]): Promise<GroupPhase> {
  progress(`group ${verb} of ${live.length}`);
  const profiling = o.cpuProfile !== undefined && o.cpuProfilePhase === verb;
  if (profiling) process.kill(b.nodePid, 'SIGUSR2');
  const p0 = await processesStarted();
  const t0 = performance.now();
  const reply = await b.pdk.groups[verb](group, { timeoutMs: GROUP_TIMEOUT_MS });
  const ms = performance.now() - t0;
  if (profiling) {
    process.kill(b.nodePid, 'SIGUSR2');
    progress(`CPU profile of the node during the group ${verb}: ${o.cpuProfile}/node-${b.nodeId}-${b.nodePid}-0.cpuprofile`);
  }
  progress(`group ${verb}: ${fmt(ms, 0)} ms, total ${reply.total}, ok ${reply.ok}, failed ${reply.failed.length}${reply.failed[0] ? ` (first: ${reply.failed[0].code} ${reply.failed[0].message})` : ''}, unreachable ${reply.unreachable.length}`);
  const out: GroupPhase = { ms, reply, processesPerSandbox: 0 };
  if (verb !== 'kill') out.freezer = await freezerSample(b, live, verb === 'pause' ? 'FROZEN' : 'THAWED');
  else {
    // Placement gives up on a node after its own timeout; the node goes on killing. Wait for it.
    for (let left = await nodeSandboxes(b); left > 0 && performance.now() - t0 < GROUP_TIMEOUT_MS; left = await nodeSandboxes(b)) {
      progress(`kill: ${left} sandboxes still on the node after ${fmt((performance.now() - t0) / 1000, 0)} s`);
      await sleep(5000);
    }
    out.goneMs = performance.now() - t0;
  }
  out.processesPerSandbox = ((await processesStarted()) - p0) / Math.max(1, live.length);
  return out;
}

interface Leftovers {
  nodeSandboxes: number;
  /** Cgroups of sandboxes; the node's pool of emptied ones (runtime/container/cgroup-pool.ts) apart. */
  cgroups: number;
  pooled: number;
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
  const cgroups = [...(await childCgroups(`paddock/${b.nodeId}`))];
  const pooled = cgroups.filter((n) => /^pool-\d+$/.test(n)).length;
  return {
    nodeSandboxes: await nodeSandboxes(b),
    cgroups: cgroups.length - pooled,
    pooled,
    bundles: bundles.length,
    sandboxMounts: await mountCount(b.nodePid, sandboxesDir(b)),
    unifiedFiles: (await unifiedUsage(b.nodePid))?.files ?? 0,
  };
}

// ─── Report ─────────────────────────────────────────────────────────────────────────────────────

interface Result {
  o: Options;
  note: string;
  machine: Machine;
  floor?: Floor;
  create: CreatePhase;
  createPerSec: number;
  /** The first window that reaches 200 live (from 50: the creates before are the exec-at-50 stop). */
  createPerSecAt200: number;
  /** The last window: the rate at N live. */
  createPerSecAtN: number;
  execAt50: ExecPhase;
  execAt50Live: number;
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
  /** --again: N created once more after the kill. */
  again?: { create: CreatePhase; perSec: number; pooledBefore: number };
}

const MiB = 2 ** 20;

function humanReport(r: Result): string {
  const live = r.create.live.length;
  const execS = summarize(r.exec.roundTrip);
  const execNode = summarize(r.exec.node);
  const createS = summarize(r.create.latencies);
  const pass = (ok: boolean) => (ok ? 'PASS' : 'FAIL');
  const exec50 = summarize(r.execAt50.roundTrip);
  const f = r.floor;
  const ratio = (a: number, b: number | undefined) => (b === undefined ? Number.NaN : a / b);
  const killMs = r.kill.goneMs ?? r.kill.ms;
  const createVsFloor = ratio(r.createPerSecAtN, f?.createPerSecAtN);
  const execVsFloor = ratio(execS.p50, f?.exec.p50);
  const rows: string[][] = [
    ['measure', 'value', 'bare crun (floor)', 'ratio', 'target', 'result'],
    ['live sandboxes', String(live), f ? String(r.o.n) : '—', '—', `≥ ${TARGETS.live}`, pass(live >= TARGETS.live)],
    [`create rate at ${live} live (last ${WINDOW})`, `${fmt(r.createPerSecAtN, 1)}/s`, f ? `${fmt(f.createPerSecAtN, 1)}/s` : '—', `${fmt(createVsFloor, 2)}×`, `≥ ${TARGETS.createVsFloor}× floor`, f ? pass(createVsFloor >= TARGETS.createVsFloor) : '—'],
    ['create rate at N / at 200 live', `${fmt(r.createPerSecAtN, 1)} / ${fmt(r.createPerSecAt200, 1)}/s`, '—', `${fmt(r.createPerSecAtN / r.createPerSecAt200, 2)}×`, `≥ ${TARGETS.createVsAt200}×`, pass(r.createPerSecAtN / r.createPerSecAt200 >= TARGETS.createVsAt200)],
    ['create throughput, 0 to N', `${fmt(r.createPerSec, 1)}/s`, f ? `${fmt(f.createPerSec, 1)}/s` : '—', `${fmt(ratio(r.createPerSec, f?.createPerSec), 2)}×`, `≥ ${TARGETS.createPerSec}/s (fast fork)`, pass(r.createPerSec >= TARGETS.createPerSec)],
    [`exec true p50 at ${live} live`, `${fmt(execS.p50)} ms`, f ? `${fmt(f.exec.p50)} ms` : '—', `${fmt(execVsFloor, 2)}×`, `≤ ${TARGETS.execVsFloor}× floor`, f ? pass(execVsFloor <= TARGETS.execVsFloor) : '—'],
    [`exec true p50 at ${live} / at ${r.execAt50Live} live`, `${fmt(execS.p50)} / ${fmt(exec50.p50)} ms`, '—', `${fmt(execS.p50 / exec50.p50, 2)}×`, `≤ ${TARGETS.execVsAt50}×`, pass(execS.p50 / exec50.p50 <= TARGETS.execVsAt50)],
    ['exec true p50, absolute', `${fmt(execS.p50)} ms`, '—', '—', `≤ ${TARGETS.execP50Ms} ms (fast fork)`, pass(execS.p50 <= TARGETS.execP50Ms)],
    ['supervisor RSS', `${fmt(r.rssAfter / MiB, 0)} MiB`, '—', '—', `≤ ${TARGETS.supervisorRssBytes / MiB} MiB`, pass(r.rssAfter <= TARGETS.supervisorRssBytes)],
    ['host memory / sandbox', `${fmt(r.hostBytesPerSandbox / 1024, 0)} KiB`, '—', '—', '—', '—'],
    [`group pause (${live})`, `${fmt(r.pause.ms, 0)} ms`, '—', '—', `≤ ${TARGETS.groupPauseMs} ms`, pass(r.pause.ms <= TARGETS.groupPauseMs && r.pause.reply.ok === live)],
    [`group resume (${live})`, `${fmt(r.resume.ms, 0)} ms`, '—', '—', '—', r.resume.reply.ok === live ? 'ok' : 'FAIL'],
    [`group kill (${live}), until none left`, `${fmt(killMs, 0)} ms`, f ? `${fmt(f.killMs, 0)} ms` : '—', `${fmt(ratio(killMs, f?.killMs), 2)}×`, `≤ ${TARGETS.groupKillMs} ms`, pass(killMs <= TARGETS.groupKillMs && r.kill.reply.ok === live)],
  ];
  const per = (x: number) => fmt(x, 2);
  const m = r.machine;
  const machineLine = `machine: kernel ${m.kernel}; meltdown: ${m.meltdown}; fork+exec of /bin/true from bash ${fmt(m.forkExecMs, 2)} ms; host ${fmt(m.idleBusyPct, 1)}% busy while this run was idle`;
  const processLine = `processes started on the host: per create ${per(r.create.processes / Math.max(1, live))}${f ? ` (floor ${per(f.processesPerCreate)})` : ''}, per exec ${per(r.exec.processesPerExec)}${f ? ` (floor ${per(f.processesPerExec)})` : ''}, per sandbox paused ${per(r.pause.processesPerSandbox)}, resumed ${per(r.resume.processesPerSandbox)}, killed ${per(r.kill.processesPerSandbox)}${f ? ` (floor ${per(f.processesPerKill)})` : ''}`;
  const floorLine = f
    ? `floor: bare crun, ${f.parallel} at once, same OCI config, a shared read-only root: ${fmt(f.createPerSec, 1)} creates/s over all (${fmt(f.createPerSecAtN, 1)}/s for the last ${WINDOW}), crun run p50 ${fmt(f.create.p50, 1)} ms; crun exec true p50 ${fmt(f.exec.p50)} / p95 ${fmt(f.exec.p95)} ms with ${r.o.n} live; delete of all ${fmt(f.killMs, 0)} ms`
    : 'floor: not run (--no-floor)';
  const trend = table([
    ['creates up to', 'per s', 'p50 ms', 'node RSS MiB', 'CPU-ms/create: node', 'node self', 'node children', 'sandbox', 'pid 1', 'not Paddock', 'whole host', 'host busy %'],
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
      fmt(w.otherCpuMsPerCreate, 1),
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
    machineLine,
    floorLine,
    '',
    table(rows),
    '',
    processLine,
    `create: ${live} live in ${fmt(r.create.wallMs / 1000, 1)} s; latency p50 ${fmt(createS.p50, 1)} / p95 ${fmt(createS.p95, 1)} / p99 ${fmt(createS.p99, 1)} ms${errs.length ? `; errors ${errs.join(', ')} — ${r.create.firstError}` : ''}`,
    trend,
    `create CPU: node ${fmt(avg((w) => w.nodeCpuMsPerCreate), 1)} (self ${fmt(avg((w) => w.nodeSelfCpuMsPerCreate), 1)} + children ${fmt(avg((w) => w.nodeChildrenCpuMsPerCreate), 1)}) + sandbox ${fmt(avg((w) => w.sandboxCpuMsPerCreate), 1)} ms per create on average${last ? ` (${fmt(last.nodeCpuMsPerCreate, 1)} + ${fmt(last.sandboxCpuMsPerCreate, 1)} ms in the last window)` : ''}: ${cpus().length} otherwise idle cores would allow ~${fmt((cpus().length * 1000) / own, 0)} creates/s; pid 1 took ${fmt(avg((w) => w.initCpuMsPerCreate), 1)} ms per create more, and the whole host ${fmt(avg((w) => w.hostCpuMsPerCreate), 1)} ms (with crun's work in a container before it joins the sandbox's cgroup, nats-server, this client and kernel threads, which none of the above is charged for)`,
    `supervisor RSS: ${fmt(r.rssBefore / MiB, 0)} MiB before the first create, ${fmt(r.rssAfter / MiB, 0)} MiB with ${live} live (${fmt((r.rssAfter - r.rssBefore) / Math.max(1, live) / 1024, 1)} KiB per sandbox)`,
    `node mount namespace: ${fmt(r.mountsPerSandbox, 2)} mounts per sandbox${r.unified ? `; private tmpfs at cgroup/unified: ${r.unified.files} files, ${fmt(r.unified.usedBytes / MiB, 1)} of ${fmt(r.unified.sizeBytes / MiB, 0)} MiB` : ''}`,
    `exec true at ${r.execAt50Live} live: p50 ${fmt(exec50.p50)} / p95 ${fmt(exec50.p95)} ms round-trip; the node's crun exec p50 ${fmt(summarize(r.execAt50.node).p50)} ms`,
    `exec true: p50 ${fmt(execS.p50)} / p95 ${fmt(execS.p95)} / p99 ${fmt(execS.p99)} ms round-trip (${execS.n} samples); the node's crun exec p50 ${fmt(execNode.p50)} / p95 ${fmt(execNode.p95)} / p99 ${fmt(execNode.p99)} ms`,
    `group pause: ${g(r.pause)}`,
    `group resume: ${g(r.resume)}`,
    `group kill: ${g(r.kill)}`,
    `after kill: ${clean ? 'clean' : 'NOT CLEAN'} — ${left.nodeSandboxes} sandboxes on the node, ${left.cgroups} cgroups (and ${left.pooled} emptied ones kept for new sandboxes), ${left.bundles} bundle dirs, ${left.sandboxMounts} sandbox mounts, ${left.unifiedFiles} files on the unified tmpfs`,
    ...(r.again
      ? [
          `created again after the kill (--again, ${r.again.pooledBefore} cgroups in the pool): ${r.again.create.live.length} in ${fmt(r.again.create.wallMs / 1000, 1)} s, ${fmt(r.again.perSec, 1)}/s over all (the first time ${fmt(r.createPerSec, 1)}/s); latency p50 ${fmt(summarize(r.again.create.latencies).p50, 1)} ms (the first time ${fmt(createS.p50, 1)} ms); per window: ${r.again.create.windows.map((w) => `${w.upTo}: ${fmt(w.perSec, 1)}/s`).join(', ')}`,
        ]
      : []),
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
    groupKillMs: round3(r.kill.goneMs ?? r.kill.ms),
    createPerSecAt200: round3(r.createPerSecAt200),
    createPerSecAtN: round3(r.createPerSecAtN),
    execP50At50Ms: round3(summarize(r.execAt50.roundTrip).p50),
    floorCreatePerSec: r.floor ? round3(r.floor.createPerSecAtN) : null,
    floorCreatePerSecOverall: r.floor ? round3(r.floor.createPerSec) : null,
    floorExecP50Ms: r.floor ? round3(r.floor.exec.p50) : null,
    floorKillMs: r.floor ? round3(r.floor.killMs) : null,
    forkExecMs: round3(r.machine.forkExecMs),
    meltdown: r.machine.meltdown,
    kernel: r.machine.kernel,
    processesPerCreate: round3(r.create.processes / Math.max(1, r.create.live.length)),
    processesPerExec: round3(r.exec.processesPerExec),
    processesPerKill: round3(r.kill.processesPerSandbox),
    ...(r.again ? { createPerSecAgain: round3(r.again.perSec) } : {}),
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
    // The node is up and idle (it made the busybox image the floor uses).
    await sleep(1000);
    const machine = await machineFacts();
    progress(`machine: kernel ${machine.kernel}, meltdown: ${machine.meltdown}, fork+exec ${fmt(machine.forkExecMs, 2)} ms, host ${fmt(machine.idleBusyPct, 1)}% busy idle`);
    const floor = o.floorParallel > 0 ? await runFloor(o) : undefined;
    if (floor) progress(`floor: ${fmt(floor.createPerSec, 1)} creates/s (${fmt(floor.createPerSecAtN, 1)}/s at the end), exec p50 ${fmt(floor.exec.p50)} ms at ${o.n} live, delete ${fmt(floor.killMs, 0)} ms`);
    // This is the floor that N sandboxes add to.
    await sleep(1000);
    const hostBefore = await hostUsedBytes();
    const rssBefore = await rssBytes(b.nodePid);

    progress(`creating ${o.n} sandboxes, ${o.concurrency} in flight (${note})`);
    // SIGUSR2 starts and stops the node's profiler (ops/telemetry.ts): the creates and nothing else.
    const profiling = o.cpuProfile !== undefined && o.cpuProfilePhase === 'create';
    if (profiling) process.kill(b.nodePid, 'SIGUSR2');
    const execAt50Live = Math.min(EXEC_AT, o.n);
    let create = await createAll(b, o, group, execAt50Live);
    const execAt50 = await execRandom(create.live, o.execs);
    create = await createAll(b, o, group, o.n, create);
    if (profiling) {
      process.kill(b.nodePid, 'SIGUSR2');
      progress(`CPU profile of the node during the creates: ${o.cpuProfile}/node-${b.nodeId}-${b.nodePid}-0.cpuprofile`);
    }
    const live = create.live;
    if (live.length === 0) throw new Error(`no sandbox could be created: ${create.firstError ?? 'unknown'}`);
    const createPerSec = live.length / (create.wallMs / 1000);
    const createPerSecAt200 = create.windows.find((w) => w.upTo >= 200)?.perSec ?? Number.NaN;
    const createPerSecAtN = create.windows.at(-1)?.perSec ?? Number.NaN;

    // Let creates' transient memory (crun, mount, page cache of bundles) settle before reading.
    await sleep(3000);
    const hostAfter = await hostUsedBytes();
    const rssAfter = await rssBytes(b.nodePid);
    const mountsPerSandbox = (await mountCount(b.nodePid, sandboxesDir(b))) / live.length;
    const unified = await unifiedUsage(b.nodePid);
    progress(`${live.length} live: node RSS ${fmt(rssAfter / MiB, 0)} MiB, host +${fmt((hostAfter - hostBefore) / MiB, 0)} MiB`);

    const exec = await execRandom(live, o.execs);
    const pause = await groupVerb(b, o, group, 'pause', live);
    const resume = await groupVerb(b, o, group, 'resume', live);
    const kill = await groupVerb(b, o, group, 'kill', live);
    // Directory writes and cgroup removal trail the reply a little.
    await sleep(1000);
    const left = await leftovers(b);
    let again: Result['again'];
    if (o.again) {
      progress(`creating ${o.n} again (${left.pooled} emptied cgroups kept by the kill)`);
      const create2 = await createAll(b, o, `${group}-again`, o.n);
      again = { create: create2, perSec: create2.live.length / (create2.wallMs / 1000), pooledBefore: left.pooled };
      await groupVerb(b, o, `${group}-again`, 'kill', create2.live);
    }

    const r: Result = { o, note, machine, ...(floor ? { floor } : {}), create, createPerSec, createPerSecAt200, createPerSecAtN, execAt50, execAt50Live, rssBefore, rssAfter, hostBytesPerSandbox: (hostAfter - hostBefore) / live.length, mountsPerSandbox, unified, exec, pause, resume, kill, left, ...(again ? { again } : {}) };
    process.stdout.write(`${humanReport(r)}\n`);
    if (o.json) process.stdout.write(`${jsonReport(r)}\n`);
    ok = true;
  } finally {
    await finishRun(ok, b?.cluster.nodes);
  }
}

runMain(main);
