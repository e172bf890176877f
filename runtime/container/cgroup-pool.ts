/**
 * Empty cgroups of killed sandboxes, kept for the next ones (cgroup v1 only).
 *
 * Removing a memory cgroup is what made a group kill slow here: the kernel offlines it
 * (`mem_cgroup_css_offline` → `memcg_reparent_list_lrus`), which walks the list_lrus of every
 * mounted superblock on the host, two per superblock, and each sandbox has about eight (its
 * writable layer, overlay, proc, sysfs, mqueue, devpts, /dev, shm). Each offline is O(live
 * sandboxes), a kill of N is O(N²), and in `perf` the kernel's workers doing it took ~50% of the
 * host's CPU while 3,200 sandboxes were killed. Creating one is the mirror cost: nine mkdirs and a
 * memory cgroup brought online. RL training kills a batch of sandboxes and creates the next: a
 * killed sandbox's cgroups, once empty of tasks, are renamed into the pool (a rename is a kernfs
 * operation, no offline), their limits lifted and the counters another sandbox could read through
 * lxcfs (CPU time, block I/O, peak memory) reset; a create renames one back under its own id, and
 * crun writes the new sandbox's limits into it as into a new one.
 *
 * An empty memory cgroup holds ~35 KiB of kernel memory here (slab and per-CPU counters, measured
 * over 1,000), so the pool is bounded (PADDOCK_CGROUP_POOL, default 4,096: ~140 MiB at most); past
 * it, and for a cgroup still charged with more than POOL_MAX_CHARGE of memory (what its sandbox left
 * in the page cache would count against the next one's limit), the cgroup is removed as before.
 * The node's next start removes a pool its predecessor left (recover takes every directory under
 * the node's cgroup), and a stopping node removes its own.
 *
 * cgroup v2 is left as it was: its single hierarchy has one memory cgroup to offline, and this
 * machine (where the cost was measured) runs v1.
 */
import { readFileSync, renameSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { cgroupDir } from '../cgroups.ts';

/** Memory a pooled cgroup may still be charged with (page cache, kernel objects of its old sandbox). */
const POOL_MAX_CHARGE = 16 * 1024 * 1024;

/** Writes that lift a cgroup's limits and reset what another tenant could read; in order (memsw before memory). */
const RESETS: Array<[controller: string, file: string, value: string]> = [
  ['memory', 'memory.memsw.limit_in_bytes', '-1'],
  ['memory', 'memory.limit_in_bytes', '-1'],
  ['memory', 'memory.soft_limit_in_bytes', '-1'],
  ['memory', 'memory.max_usage_in_bytes', '0'],
  ['memory', 'memory.memsw.max_usage_in_bytes', '0'],
  ['memory', 'memory.failcnt', '0'],
  ['memory', 'memory.memsw.failcnt', '0'],
  ['cpu', 'cpu.cfs_quota_us', '-1'],
  ['cpuacct', 'cpuacct.usage', '0'],
  ['pids', 'pids.max', 'max'],
  ['blkio', 'blkio.reset_stats', '1'],
];

export class CgroupPool {
  private readonly free: string[] = [];
  private seq = 0;

  constructor(
    /** The node's parent cgroup, e.g. /paddock/<node>: pooled ones are `pool-<n>` below it. */
    private readonly parent: string,
    private readonly hierarchies: readonly string[],
    readonly max = Number(process.env.PADDOCK_CGROUP_POOL ?? 4096),
  ) {}

  get size(): number {
    return this.free.length;
  }

  private dirs(path: string): string[] {
    return this.hierarchies.map((h) => cgroupDir('v1', path, h));
  }

  /**
   * Gives `path` (which must not exist) a pooled cgroup in every hierarchy; false when the pool is
   * empty. A hierarchy where the rename fails is left to crun, which makes what is missing.
   */
  take(path: string): boolean {
    const name = this.free.pop();
    if (name === undefined) return false;
    const from = this.dirs(`${this.parent}/${name}`);
    const to = this.dirs(path);
    for (const [i, d] of from.entries()) {
      try {
        renameSync(d, to[i] as string);
      } catch {
        try {
          rmdirSync(d);
        } catch {
          // gone already
        }
      }
    }
    return true;
  }

  /**
   * Keeps `path`, whose tasks are all gone, for a later sandbox; false when it is not kept (the
   * pool is full, it is still charged with memory, or it cannot be moved), and the caller removes it.
   */
  put(path: string): boolean {
    if (this.free.length >= this.max) return false;
    const charged = Number(read(cgroupDir('v1', path, 'memory'), 'memory.usage_in_bytes') ?? Number.POSITIVE_INFINITY);
    if (!(charged <= POOL_MAX_CHARGE)) return false;
    // A sandbox pinned to CPUs leaves its pin behind, and crun writes cpuset.cpus only for a
    // sandbox that asks for one: back to the parent's, as a new cgroup starts.
    const cpuset = this.hierarchies.includes('cpuset') ? cgroupDir('v1', this.parent, 'cpuset') : undefined;
    const resets: Array<[string, string, string | undefined]> = [...RESETS, ['cpuset', 'cpuset.cpus', cpuset && read(cpuset, 'cpuset.cpus')], ['cpuset', 'cpuset.mems', cpuset && read(cpuset, 'cpuset.mems')]];
    for (const [controller, file, value] of resets) {
      if (value === undefined || !this.hierarchies.includes(controller)) continue;
      try {
        writeFileSync(join(cgroupDir('v1', path, controller), file), value);
      } catch {
        // A file this kernel does not have (memsw without swap accounting, say).
      }
    }
    const name = `pool-${++this.seq}`;
    const from = this.dirs(path);
    const to = this.dirs(`${this.parent}/${name}`);
    let moved = 0;
    for (const [i, d] of from.entries()) {
      try {
        renameSync(d, to[i] as string);
        moved++;
      } catch {
        // Missing in this hierarchy: take() leaves it to crun.
      }
    }
    if (moved === 0) return false;
    this.free.push(name);
    return true;
  }

  /** Removes every pooled cgroup (the node stops); each is empty. */
  drain(): void {
    for (const name of this.free.splice(0)) {
      for (const d of this.dirs(`${this.parent}/${name}`)) {
        try {
          rmdirSync(d);
        } catch {
          // gone already
        }
      }
    }
  }
}

function read(dir: string, file: string): string | undefined {
  try {
    return readFileSync(join(dir, file), 'utf8').trim();
  } catch {
    return undefined;
  }
}
