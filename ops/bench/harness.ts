/**
 * What the lifecycle benchmarks (density, qos) share: a cleanup stack that runs on success, failure
 * and Ctrl-C; a local node on a temp home; host-side readings (/proc, cgroups) of that node; and the
 * report table. The benchmarks run on the node's own host, so reading its /proc and cgroup files
 * is fair game — that is where the evidence for a number lives.
 */
import { spawn } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm, rmdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { detectCgroups } from '../../runtime/cgroups.ts';
import { Paddock, type Sandbox } from '../../sdk/index.ts';
import { type LocalCluster, startLocalCluster } from '../local.ts';

/** A mistake in how a benchmark was asked to run: reported without a stack trace. */
export class UsageError extends Error {
  override name = 'UsageError';
}

export const progress = (msg: string) => process.stderr.write(`bench: ${msg}\n`);

/** Cleanups run once, last registered first, whether the run ends normally, fails or is interrupted. */
const cleanups: Array<{ what: string; fn: () => Promise<void> }> = [];
let cleaning: Promise<void> | undefined;

export function onCleanup(what: string, fn: () => Promise<void>): void {
  cleanups.push({ what, fn });
}

export function cleanUp(): Promise<void> {
  cleaning ??= (async () => {
    for (let c = cleanups.pop(); c; c = cleanups.pop()) {
      await c.fn().catch((err: unknown) => progress(`cleanup (${c?.what}) failed: ${(err as Error).message}`));
    }
  })();
  return cleaning;
}

let interrupted = false;

/** SIGINT/SIGTERM: clean up, then exit 130. */
export function cleanUpOnSignals(): void {
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    process.once(sig, () => {
      interrupted = true;
      progress(`${sig}: cleaning up`);
      void cleanUp().finally(() => process.exit(130));
    });
  }
}

/**
 * Runs `main`, prints a failure without a stack trace when it is a UsageError, sets the exit code,
 * and runs the cleanups on failure too (a failed image run left its 13 GiB scratch and its task
 * layers in the store).
 */
export function runMain(main: () => Promise<void>): void {
  void main()
    .catch((err: unknown) => {
      const detail = err instanceof UsageError ? err.message : err instanceof Error ? (err.stack ?? err.message) : String(err);
      process.stderr.write(`bench failed: ${detail}\n`);
      process.exitCode = 1;
    })
    .then(() => cleanUp());
}

/** Parses `--name V` / `--name=V` as a positive number (an integer unless `real`). */
export function numberArg(argv: readonly string[], i: number, name: string, usage: string, real = false): { value: number; next: number } {
  const a = argv[i] as string;
  const v = a === name ? argv[i + 1] : a.slice(name.length + 1);
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0 || (!real && !Number.isInteger(n))) throw new UsageError(`${name}: expected a positive ${real ? 'number' : 'integer'}, got ${v ?? 'nothing'}\n${usage}`);
  return { value: n, next: a === name ? i + 1 : i };
}

/** The flags most benchmarks take: `--n N` (runs) and `--json`. */
export function nJsonArgs(argv: readonly string[], defaultN: number, usage: string): { n: number; json: boolean } {
  const o = { n: defaultN, json: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === '--json') o.json = true;
    else if (a === '--n' || a.startsWith('--n=')) {
      const r = numberArg(argv, i, '--n', usage);
      o.n = r.value;
      i = r.next;
    } else throw new UsageError(`unknown argument ${a}\n${usage}`);
  }
  return o;
}

// ─── Cgroups ────────────────────────────────────────────────────────────────────────────────────

/** Removes the cgroup `dir` and everything below it, killing whatever still runs there; returns what was removed. */
async function removeCgroupDir(dir: string): Promise<string[]> {
  const kids = await readdir(dir, { withFileTypes: true }).catch(() => null);
  if (!kids) return [];
  const removed: string[] = [];
  for (const k of kids) if (k.isDirectory()) removed.push(...(await removeCgroupDir(join(dir, k.name))));
  const procs = await readFile(join(dir, 'cgroup.procs'), 'utf8').catch(() => '');
  for (const pid of procs.split('\n').map((x) => Number.parseInt(x, 10))) {
    if (pid > 1) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }
  // A killed process leaves its cgroup a moment later: rmdir says EBUSY until then.
  for (let i = 0; i < 50; i++) {
    const err = await rmdir(dir).then(
      () => null,
      (e: NodeJS.ErrnoException) => e.code ?? 'EIO',
    );
    if (err === null) return [...removed, dir];
    if (err !== 'EBUSY') break;
    await new Promise((r) => setTimeout(r, 20));
  }
  return removed;
}

/** The cgroup hierarchies under /sys/fs/cgroup: the v2 root, or each v1 controller (named ones too). */
async function hierarchies(): Promise<string[]> {
  const base = '/sys/fs/cgroup';
  if (detectCgroups() === 'v2') return [base];
  return (await readdir(base).catch(() => [] as string[])).map((h) => join(base, h));
}

/** Removes the cgroup at `path` (relative to a hierarchy's root) from every hierarchy. */
export async function removeCgroup(path: string): Promise<string[]> {
  const removed: string[] = [];
  for (const h of await hierarchies()) removed.push(...(await removeCgroupDir(join(h, path))));
  return removed;
}

/** Child cgroups of `path` in any hierarchy (a node's sandboxes are `paddock/<node>/<id>`). */
export async function childCgroups(path: string): Promise<Set<string>> {
  const out = new Set<string>();
  for (const h of await hierarchies()) {
    for (const d of await readdir(join(h, path), { withFileTypes: true }).catch(() => [])) if (d.isDirectory()) out.add(d.name);
  }
  return out;
}

/** The host directory of cgroup `path` for controller `ctrl` (`cpu`, `freezer`, …). */
export function cgroupFile(path: string, ctrl: string, file: string): string {
  return detectCgroups() === 'v2' ? join('/sys/fs/cgroup', path, file) : join('/sys/fs/cgroup', ctrl, path, file);
}

/**
 * On a hybrid host, removes `unified/<path>` from /sys/fs/cgroup's own tmpfs, where crun leaves a
 * directory and a cgroup.procs file per container when `unified` is unmounted without a private
 * tmpfs over it. The host cannot see them under its cgroup2 mount: look from a namespace without
 * it. Returns how many containers' entries there were.
 */
export async function removeHiddenUnified(path: string): Promise<number> {
  if (detectCgroups() !== 'hybrid') return 0;
  const script = 'umount /sys/fs/cgroup/unified && d=/sys/fs/cgroup/unified/$1 && [ -d "$d" ] && find "$d" -name cgroup.procs | wc -l && rm -rf "$d"; true';
  const child = spawn('unshare', ['--mount', '--propagation', 'private', '--', 'sh', '-c', script, 'sh', path], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => {
    out += d.toString();
  });
  await new Promise<void>((resolve, reject) => {
    child.on('error', reject);
    child.on('close', () => resolve());
  });
  return Number.parseInt(out.trim(), 10) || 0;
}

// ─── A node to measure ──────────────────────────────────────────────────────────────────────────

export interface BenchCluster {
  cluster: LocalCluster;
  pdk: Paddock;
  home: string;
  nodeId: string;
  /** The node process's pid on this host (unshare and sh exec in place: it is the node itself). */
  nodePid: number;
}

/**
 * One local node on a temp home and the shared image store, with cleanup registered: the node is
 * stopped (which kills its sandboxes) and anything it should have removed but did not is reported,
 * then removed.
 */
export async function startBenchNode(o: { prefix: string; env: Record<string, string> }): Promise<BenchCluster> {
  const imagesDir = process.env.PADDOCK_IMAGES_DIR || '/var/lib/paddock/images';
  const home = await mkdtemp(join(tmpdir(), 'paddock-bench-'));
  onCleanup('home', () => rm(home, { recursive: true, force: true }));
  progress(`starting a local node (home ${home}, images ${imagesDir})`);
  // A prefix of our own keeps this run's cgroups (/paddock/<node id>) apart from other clusters'.
  const cluster = await startLocalCluster({ home, nodes: 1, prefix: `${o.prefix}${process.pid}n`, imagesDir, env: o.env });
  onCleanup('cluster', async () => {
    await cluster.stop();
    for (const node of cluster.nodes) {
      const left = await removeCgroup(`paddock/${node.id}`);
      if (left.length > 0) progress(`paddock left ${left.length} cgroup(s) behind, removed: ${left.slice(0, 10).join(' ')}${left.length > 10 ? ' …' : ''}`);
      const hidden = await removeHiddenUnified(`paddock/${node.id}`);
      if (hidden > 0) progress(`paddock left ${hidden} sandboxes' cgroup.procs files on /sys/fs/cgroup's tmpfs under unified/paddock/${node.id}, removed`);
    }
  });
  const pdk = await Paddock.connect({ servers: cluster.url, timeoutMs: 120_000 });
  // Interrupted runs may find NATS already gone: nothing is left to close then.
  onCleanup('sdk', () => pdk.close().catch(() => {}));
  const node = cluster.nodes[0];
  if (!node?.proc.pid) throw new Error('the node has no pid');
  return { cluster, pdk, home, nodeId: node.id, nodePid: node.proc.pid };
}

export async function tailOf(file: string | undefined, lines: number): Promise<string> {
  if (!file) return '';
  const text = await readFile(file, 'utf8').catch(() => '');
  return text.trimEnd().split('\n').slice(-lines).join('\n');
}

/**
 * The end of a bench run: after a failure, the nodes' last log lines (a failure may be a node's;
 * an interrupt is not), then the cleanup stack.
 */
export async function finishRun(ok: boolean, nodes: ReadonlyArray<{ id: string; logFile?: string }> | undefined): Promise<void> {
  if (!ok && !interrupted) {
    for (const node of nodes ?? []) {
      const tail = await tailOf(node.logFile, 20);
      if (tail) progress(`last lines of ${node.id}'s log:\n${tail}`);
    }
  }
  await cleanUp();
}

// ─── Host readings ──────────────────────────────────────────────────────────────────────────────

/** A `Key:  123 kB` field of a /proc status-like file, in bytes. */
function kbField(text: string, key: string): number {
  const m = new RegExp(`^${key}:\\s+(\\d+) kB$`, 'm').exec(text);
  return m ? Number(m[1]) * 1024 : Number.NaN;
}

/** Resident memory of process `pid` (VmRSS), in bytes. */
export async function rssBytes(pid: number): Promise<number> {
  return kbField(await readFile(`/proc/${pid}/status`, 'utf8'), 'VmRSS');
}

/** Host memory in use, MemTotal − MemAvailable, in bytes. */
export async function hostUsedBytes(): Promise<number> {
  const m = await readFile('/proc/meminfo', 'utf8');
  return kbField(m, 'MemTotal') - kbField(m, 'MemAvailable');
}

/** Clock ticks per second of /proc's CPU times (USER_HZ: 100 on every Linux architecture we run on). */
export const CLK_TCK = 100;

/**
 * CPU seconds of process `pid`: its own, and its children's — reaped ones (crun, mount, …) and live
 * ones with what they reaped (a node's process spawner and the crun runs it started).
 */
export async function cpuSeconds(pid: number): Promise<{ self: number; children: number }> {
  const own = await statCpu(pid);
  const live = (await readFile(`/proc/${pid}/task/${pid}/children`, 'utf8').catch(() => '')).split(' ').filter(Boolean);
  let children = own.children;
  for (const c of live) {
    const t = await statCpu(Number(c)).catch(() => ({ self: 0, children: 0 }));
    children += t.self + t.children;
  }
  return { self: own.self, children };
}

async function statCpu(pid: number): Promise<{ self: number; children: number }> {
  const s = await readFile(`/proc/${pid}/stat`, 'utf8');
  const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
  const n = (i: number) => Number(f[i]);
  // Fields after the name: utime 14, stime 15, cutime 16, cstime 17 (1-based in proc(5)) → 11..14 here.
  return { self: (n(11) + n(12)) / CLK_TCK, children: (n(13) + n(14)) / CLK_TCK };
}

/** CPU seconds used so far by every process that ever ran in cgroup `path` (and below it). */
export async function cgroupCpuSeconds(path: string): Promise<number> {
  if (detectCgroups() === 'v2') {
    const stat = await readFile(join('/sys/fs/cgroup', path, 'cpu.stat'), 'utf8').catch(() => '');
    return Number(/^usage_usec (\d+)$/m.exec(stat)?.[1] ?? Number.NaN) / 1e6;
  }
  return Number((await readFile(join('/sys/fs/cgroup/cpuacct', path, 'cpuacct.usage'), 'utf8').catch(() => 'NaN')).trim()) / 1e9;
}

/** Jiffies the host's CPUs spent busy and in total, from /proc/stat (diff two readings). */
export async function hostCpu(): Promise<{ busy: number; total: number }> {
  const line = (await readFile('/proc/stat', 'utf8')).split('\n')[0] ?? '';
  const v = line.trim().split(/\s+/).slice(1).map(Number);
  const total = v.reduce((a, b) => a + b, 0);
  const idle = (v[3] ?? 0) + (v[4] ?? 0);
  return { busy: total - idle, total };
}

/** Mounts in the mount namespace of process `pid` (those whose mount point contains `under`, if given). */
export async function mountCount(pid: number, under?: string): Promise<number> {
  const lines = (await readFile(`/proc/${pid}/mountinfo`, 'utf8')).split('\n').filter(Boolean);
  return under === undefined ? lines.length : lines.filter((l) => l.split(' ')[4]?.includes(under)).length;
}

// ─── Report ─────────────────────────────────────────────────────────────────────────────────────

export const fmt = (x: number, digits = 3) => (Number.isFinite(x) ? x.toFixed(digits) : '—');

export function table(rows: string[][]): string {
  const widths = rows[0]?.map((_, c) => Math.max(...rows.map((r) => (r[c] ?? '').length))) ?? [];
  const line = (r: string[]) => r.map((cell, c) => (c === 0 ? cell.padEnd(widths[c] ?? 0) : cell.padStart(widths[c] ?? 0))).join(' | ');
  const rule = widths.map((w) => '-'.repeat(w)).join('-+-');
  const [head, ...body] = rows;
  return [line(head ?? []), rule, ...body.map(line)].join('\n');
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

type CreateArgs = Parameters<Paddock['sandboxes']['create']>;

/** `pdk.sandboxes.create` that remembers what it made; `keep` adds sandboxes made otherwise (a fork's copies). */
export type SandboxMaker = ((spec: CreateArgs[0], opts?: CreateArgs[1]) => Promise<Sandbox>) & { keep(...made: Sandbox[]): void };

/** Creates sandboxes for a run and kills every one of them at cleanup, a failed or interrupted run included. */
export function sandboxMaker(pdk: Paddock): SandboxMaker {
  const live: Sandbox[] = [];
  onCleanup('sandboxes', async () => {
    await Promise.allSettled(live.map((s) => s.kill()));
  });
  const make = async (spec: CreateArgs[0], opts?: CreateArgs[1]) => {
    const sb = await pdk.sandboxes.create(spec, opts);
    live.push(sb);
    return sb;
  };
  return Object.assign(make, { keep: (...made: Sandbox[]) => void live.push(...made) });
}
