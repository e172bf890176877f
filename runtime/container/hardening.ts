/**
 * The host-side parts of a hardened sandbox that the OCI config cannot express by itself:
 * - read-only layers seen through idmapped clones, so the sandbox's unprivileged root (a range of
 *   host ids of its own, ids.ts) owns what the image's root owned;
 * - a size-bounded writable layer;
 * - CPU pinning, so `nproc` inside counts the CPUs the sandbox may use;
 * - one lxcfs per node, whose /proc files show each reader its own cgroup's memory and CPUs.
 *
 * The writable layer is a tmpfs with `size=`: measured here, neither XFS nor ext4 project quotas
 * are built into this kernel (CONFIG_XFS_QUOTA off, no QFMT_V2), and a loop-mounted ext4 image per
 * sandbox costs ~20 ms of mkfs plus a loop device at every create. A tmpfs mount costs well under a
 * millisecond and its bound is exact; the price is that its pages are memory (charged to the memory
 * cgroup of the process that writes them, so a disk filler inside a sandbox also counts against
 * its memoryMiB, and the files API's writes against the node's) and that they need swap to leave
 * RAM while a sandbox hibernates. On a host with XFS project quotas, a shared XFS directory per
 * sandbox would be the cheaper-in-RAM choice.
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdir, readFile, rm, rmdir, writeFile } from 'node:fs/promises';
import { cpus as hostCpus } from 'node:os';
import { join, } from 'node:path';
import { type CgroupMode, cgroupDir, } from '../cgroups.ts';
import type { IdRange } from '../ids.ts';
import { run } from '../proc.ts';
import type { MountPlan } from '../spawner.ts';
import { SHARED_COUNTER_RLIMITS } from './oci.ts';

/**
 * The sandbox's own share of the kernel's per-user counters, in its user namespace's
 * /proc/sys/user. What a sandbox takes is also charged to the owner of its user namespace on the
 * host, against the host's per-user limits: when crun made the namespace that was root, and one
 * sandbox holding 128 inotify instances made host root's inotify_init fail with EMFILE, on every
 * node of the host. The owner is now the sandbox's own host uid (spawner.c sandbox_userns, which
 * also sets these), so those charges are its alone; these limits keep it well inside the host's
 * defaults (128 instances per user).
 */
const SANDBOX_UCOUNTS = { max_inotify_instances: 64, max_inotify_watches: 16384, max_fanotify_groups: 0, max_fanotify_marks: 0 };

/** CPUs lxcfs may use, all sandboxes' /proc reads together (boundLxcfs). */
const LXCFS_CPU = Number(process.env.PADDOCK_LXCFS_CPU) || 0.5;

export class Hardening {
  /** Sandboxes pinned to each CPU, to place the next one on the least busy. */
  private readonly pinned: number[];
  private readonly pins = new Map<string, number[]>();
  private lxcfsDir?: string;
  private lxcfsProc?: ReturnType<typeof spawn>;
  private lxcfsCgroupDir?: string;
  /** The previous run's lxcfs, still running (staleLxcfs). */
  private predecessor?: number;

  constructor(
    private readonly nodeDir: string,
    /** Where lxcfs runs under a CPU quota of its own (boundLxcfs). */
    private readonly lxcfsCgroup?: { mode: CgroupMode; path: string },
  ) {
    this.pinned = new Array(Math.max(1, onlineCpus().length)).fill(0);
  }

  /**
   * The sandbox's root filesystem, made in a mount namespace of its own by the spawner between its
   * fork and `crun run` (spawner.c): a tmpfs of `diskMiB` at `<dir>/disk` (the writable layer,
   * holding overlay's upper and work dirs) and the overlay of `lowers` (top first) on it at `rootfs`,
   * each layer through an idmapped clone owned by the sandbox's range of host ids `ids`.
   *
   * Neither mount is ever in the node's namespace. Each new mount namespace starts as a copy of the
   * one it is made from, and crun's pivot_root then detaches every copied mount: with two mounts per
   * live sandbox in the node's namespace, every create (and every `crun exec`, which reads the table)
   * paid for all the others — measured here, the sandbox-side CPU of a create grew from 4 to 10 ms
   * between 200 and 600 live sandboxes, and `crun exec` took 44 ms at 3,200. The namespace made here
   * is a copy of the node's few mounts; once crun has made the container's own from it and exited,
   * nothing holds it, and the container's namespace keeps just the overlay (and under it the tmpfs)
   * for as long as the container lives — so a crashed node leaves no mount behind either. The node
   * reaches the root through the init's /proc/<pid>/root.
   */
  /** Where ownMounts keeps the sandbox's user namespace for crun to join (ociConfig's `userns`). */
  userns(dir: string): string {
    return join(dir, 'disk', 'userns');
  }

  ownMounts(dir: string, diskMiB: number, lowers: string[], rootfs: string, ids: IdRange): MountPlan {
    const disk = join(dir, 'disk');
    // Inodes are memory too: bound them with the size, generously (many small files are normal).
    const inodes = Math.max(16384, diskMiB * 256);
    return {
      disk,
      tmpfsOptions: `size=${diskMiB}m,nr_inodes=${inodes},mode=0700`,
      rootUid: ids.hostId,
      idCount: ids.size,
      msgqueueBytes: SHARED_COUNTER_RLIMITS.find((l) => l.type === 'RLIMIT_MSGQUEUE')?.hard ?? 0,
      sigpending: SHARED_COUNTER_RLIMITS.find((l) => l.type === 'RLIMIT_SIGPENDING')?.hard ?? 0,
      ucounts: Object.entries(SANDBOX_UCOUNTS)
        .map(([k, v]) => `${k}=${v}`)
        .join(','),
      layers: lowers,
      // Relative to the disk, where the spawner mounts the overlay from (its idmapped clones of the
      // layers are l0, l1, …): mountinfo inside shows them as written, naming no node path.
      overlayOptions: `lowerdir=${lowers.map((_, i) => `l${i}`).join(':')},upperdir=upper,workdir=work`,
      rootfs,
    };
  }

  /** CPUs for a sandbox of `cpu` cores: ceil(cpu) of them, the least used first. */
  pin(id: string, cpu: number): string | undefined {
    // PADDOCK_PIN_CPUS=0: no pinning (nproc then shows the node's CPUs; the CFS quota still holds).
    if (process.env.PADDOCK_PIN_CPUS === '0') return undefined;
    const online = onlineCpus();
    if (online.length === 0) return undefined;
    const n = Math.min(online.length, Math.max(1, Math.ceil(cpu - 1e-9)));
    const order = online.map((c, i) => ({ c, i })).sort((a, b) => (this.pinned[a.i] ?? 0) - (this.pinned[b.i] ?? 0) || a.i - b.i);
    const chosen = order.slice(0, n);
    for (const { i } of chosen) this.pinned[i] = (this.pinned[i] ?? 0) + 1;
    this.pins.set(
      id,
      chosen.map(({ i }) => i),
    );
    return chosen
      .map(({ c }) => c)
      .sort((a, b) => a - b)
      .join(',');
  }

  /** The CPUs a sandbox of a previous run was pinned to (pinsOf), counted again. */
  repin(id: string, cpus: number[]): void {
    for (const i of cpus) this.pinned[i] = (this.pinned[i] ?? 0) + 1;
    this.pins.set(id, [...cpus]);
  }

  /** The CPU indexes a sandbox is pinned to, for its record. */
  pinsOf(id: string): number[] | undefined {
    return this.pins.get(id);
  }

  unpin(id: string): void {
    for (const i of this.pins.get(id) ?? []) this.pinned[i] = Math.max(0, (this.pinned[i] ?? 1) - 1);
    this.pins.delete(id);
  }

  /**
   * Starts lxcfs for this node (inside the node's mount namespace, so the FUSE mount is the
   * node's alone); returns its mount point, or undefined when lxcfs is not installed or fails —
   * sandboxes then see the host's /proc/meminfo, which is a degradation, not an error.
   */
  async startLxcfs(): Promise<string | undefined> {
    if (process.env.PADDOCK_LXCFS === '0') return undefined;
    const dir = join(this.nodeDir, 'lxcfs');
    const pidFile = join(this.nodeDir, 'lxcfs.pid');
    this.predecessor = await staleLxcfs(pidFile);
    await mkdir(dir, { recursive: true });
    // Outlives a node killed by SIGKILL: the sandboxes it leaves running read their /proc files
    // through it until the next start takes them up. The layer daemon then detaches its mount in
    // that node's namespace (lazyfs-main.ts), so it ends with the last sandbox that uses it.
    const proc = spawn('lxcfs', ['--foreground', '--pidfile', pidFile, dir], { stdio: 'ignore' });
    const ok = await new Promise<boolean>((resolve) => {
      proc.on('error', () => resolve(false));
      proc.on('exit', () => resolve(false));
      const started = Date.now();
      const poll = async () => {
        if (await readFile(join(dir, 'proc', 'meminfo'), 'utf8').then(Boolean, () => false)) return resolve(true);
        if (Date.now() - started > 5000) return resolve(false);
        setTimeout(() => void poll(), 20);
      };
      void poll();
    });
    if (!ok) {
      proc.kill('SIGKILL');
      return undefined;
    }
    this.lxcfsProc = proc;
    this.lxcfsDir = dir;
    if (proc.pid !== undefined) await this.boundLxcfs(proc.pid);
    return dir;
  }

  /**
   * lxcfs answers every sandbox's reads of /proc/meminfo, cpuinfo, stat, … from its own threads:
   * a 0.25-CPU sandbox reading them in a loop made it burn 5.1 s of host CPU in 8 s, 2.5× the
   * sandbox's own share, outside any sandbox's quota. In a cgroup of its own with a quota of
   * LXCFS_CPU and the smallest weight, what all sandboxes together can make it do is bounded; a
   * flood of reads then slows the others' /proc reads (lxcfs is shared) but not the node.
   */
  private async boundLxcfs(pid: number): Promise<void> {
    const cg = this.lxcfsCgroup;
    if (!cg) return;
    const dir = cgroupDir(cg.mode, cg.path, 'cpu');
    try {
      await mkdir(dir, { recursive: true });
      if (cg.mode === 'v2') {
        await writeFile(join(dir, 'cpu.max'), `${Math.round(LXCFS_CPU * 100_000)} 100000`);
        await writeFile(join(dir, 'cpu.weight'), '1');
      } else {
        await writeFile(join(dir, 'cpu.cfs_quota_us'), String(Math.round(LXCFS_CPU * 100_000)));
        await writeFile(join(dir, 'cpu.shares'), '2');
      }
      await writeFile(join(dir, 'cgroup.procs'), String(pid));
      this.lxcfsCgroupDir = dir;
    } catch (err) {
      // Not bounded is a degradation, not a reason to refuse sandboxes.
      this.lxcfsCgroupDir = undefined;
      process.emitWarning(`lxcfs runs without a CPU quota: ${(err as Error).message}`);
    }
  }

  /**
   * Stops the lxcfs a previous run left, once no sandbox of that run was taken up (they read their
   * /proc files through it). One that serves taken-up sandboxes ends with the last of them.
   */
  stopPredecessor(): void {
    const pid = this.predecessor;
    this.predecessor = undefined;
    if (pid === undefined) return;
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }

  get lxcfs(): string | undefined {
    return this.lxcfsDir;
  }

  async close(): Promise<void> {
    if (this.lxcfsDir) {
      await run('umount', ['-l', this.lxcfsDir], { allowFail: true });
      this.lxcfsProc?.kill('SIGTERM');
      this.lxcfsDir = undefined;
    }
    const cg = this.lxcfsCgroupDir;
    this.lxcfsCgroupDir = undefined;
    for (let i = 0; cg && i < 50; i++) {
      if (await rmdir(cg).then(() => true, (e: NodeJS.ErrnoException) => e.code === 'ENOENT')) break;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}

/** The lxcfs a previous run of the node left running, if one did. */
async function staleLxcfs(pidFile: string): Promise<number | undefined> {
  const pid = Number.parseInt(await readFile(pidFile, 'utf8').catch(() => ''), 10);
  await rm(pidFile, { force: true });
  if (!(pid > 1)) return undefined;
  const comm = await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '');
  return comm.trim() === 'lxcfs' ? pid : undefined;
}

/**
 * CPUs this process may run on (the node's own cpuset, not every CPU of the host). Read at most
 * once a second: /proc/self/status is long to format, and CPUs come and go far less often than
 * sandboxes.
 */
function onlineCpus(): number[] {
  const now = Date.now();
  if (cpusRead && now - cpusRead.at < 1000) return cpusRead.list;
  const m = /Cpus_allowed_list:\s*(\S+)/.exec(readFileSync('/proc/self/status', 'utf8'));
  const list = m?.[1] ? parseList(m[1]) : [];
  cpusRead = { at: now, list: list.length > 0 ? list : hostCpus().map((_, i) => i) };
  return cpusRead.list;
}
let cpusRead: { at: number; list: number[] } | undefined;

export function parseList(list: string): number[] {
  const out: number[] = [];
  for (const part of list.split(',')) {
    const [a, b] = part.split('-').map((x) => Number.parseInt(x, 10));
    if (a === undefined || Number.isNaN(a)) continue;
    for (let c = a; c <= (b ?? a); c++) out.push(c);
  }
  return out;
}
