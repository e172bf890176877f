/**
 * What a VMM runs as and inside: a host user of its own and a cgroup of its own.
 *
 * - **User.** QEMU starts as root, opens what it needs (disks, its RAM file, kernel, sockets), then
 *   drops to the first id of a range of its own (`-runas uid:gid`, the ranges containers use:
 *   runtime/ids.ts). From then on it has no capability and, its seccomp filter having set
 *   no_new_privs, cannot gain one. QEMU installs that filter before it drops, so the filter must
 *   allow set*id (`elevateprivileges=deny` made `-runas` die with SIGSYS, tried here); without
 *   CAP_SETUID the calls cannot take anything back.
 * - **Root.** It is chrooted (`-chroot`, applied with the drop) in its own VM directory, owned by
 *   that user, mode 0700: no other VMM can read or change it, and nothing of the host's files is
 *   reachable by path (no shell, no /proc, no other VM). What it writes after the drop (a
 *   screenshot) lands there; migrations go over sockets the node serves there, and its seccomp
 *   filter denies spawning anything.
 * - **Cgroup.** CPU bandwidth of the sandbox's `cpu` (all QEMU's threads together: vCPUs, the TCG
 *   translator, I/O), memory bounded to the guest's RAM plus QEMU's own overhead (VMM_OVERHEAD_MIB,
 *   measured), and pids. A QEMU that goes past its memory is killed by the kernel, and the sandbox
 *   ends as crashed; nothing else on the node is touched. The VMM enters its cgroup before `exec`
 *   (a shell writes its own pid, then execs QEMU), so not one page it touches is charged elsewhere.
 *
 * Cgroups are at /paddock-vmm/<node>/<name>, apart from the containers' /paddock/<node>, whose
 * recovery takes every directory there for a sandbox of its own.
 */
import { chmod, chown, mkdir, readdir, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { type CgroupMode, cgroupDir, detectCgroups } from '../cgroups.ts';
import { type IdRange, IdRanges } from '../ids.ts';
import { readText } from '../sync-read.ts';

/**
 * QEMU's memory beyond the guest's RAM, MiB. Measured under TCG here: an idle VMM holds 16–20 MiB
 * (heap, its translation cache filling up to 32 MiB); a 512 MiB guest that touched all the RAM it
 * could left 496 MiB of anonymous memory in the VMM's cgroup. The rest of what the cgroup is
 * charged is page cache the kernel takes back at the bound (the template's RAM file as the clone
 * reads it, a hibernation's state as `cat` writes it: a 512 MiB VM's hibernation peaked at the
 * bound, 704 MiB, and went through). Room to spare above that: only a VMM gone wrong meets it.
 */
export const VMM_OVERHEAD_MIB = Number(process.env.PADDOCK_VMM_OVERHEAD_MIB) || 192;
/** QEMU's threads: vCPUs, its I/O worker pool (up to 64), the main loop. */
const VMM_PIDS = 512;
const PERIOD_US = 100_000;
const V1_CONTROLLERS = ['cpu', 'memory', 'pids'];
/** How long a release waits for the cgroup's last task (a VMM's `cat` may outlive it briefly). */
const EMPTY_WAIT_MS = 10_000;

export interface Jailed {
  name: string;
  ids: IdRange;
  /** The cgroup (below each controller's root). */
  cgroup: string;
  /** Its VM directory, its own (0700) and its root once started (`-chroot`). */
  dir: string;
}

export class VmmJail {
  private readonly mode: CgroupMode = detectCgroups();
  private readonly ranges = new IdRanges();
  private readonly parent: string;

  constructor(nodeId: string) {
    this.parent = `/paddock-vmm/${nodeId}`;
  }

  private dirs(path: string): string[] {
    return this.mode === 'v2' ? [cgroupDir('v2', path, '')] : V1_CONTROLLERS.map((c) => cgroupDir(this.mode, path, c));
  }

  /**
   * A user and a cgroup for one VMM; `dir` (its own directory) becomes that user's, 0700. `cpu` is
   * the CPUs its sandbox may use, `memoryMiB` its guest's RAM.
   */
  async enter(name: string, dir: string, limits: { cpu: number; memoryMiB: number }): Promise<Jailed> {
    const ids = await this.ranges.take();
    const j: Jailed = { name, ids, cgroup: `${this.parent}/${name}`, dir };
    try {
      if (this.mode === 'v2') await this.delegateV2();
      for (const d of this.dirs(j.cgroup)) await mkdir(d, { recursive: true });
      await this.setCpu(j, limits.cpu);
      const mem = (limits.memoryMiB + VMM_OVERHEAD_MIB) * 1024 * 1024;
      if (this.mode === 'v2') {
        await writeFile(join(cgroupDir('v2', j.cgroup, ''), 'memory.max'), String(mem));
        await writeFile(join(cgroupDir('v2', j.cgroup, ''), 'memory.swap.max'), '0').catch(() => {});
        await writeFile(join(cgroupDir('v2', j.cgroup, ''), 'pids.max'), String(VMM_PIDS));
      } else {
        await writeFile(join(cgroupDir(this.mode, j.cgroup, 'memory'), 'memory.limit_in_bytes'), String(mem));
        await writeFile(join(cgroupDir(this.mode, j.cgroup, 'pids'), 'pids.max'), String(VMM_PIDS));
      }
      await mkdir(dir, { recursive: true });
      await chown(dir, ids.hostId, ids.hostId);
      await chmod(dir, 0o700);
    } catch (e) {
      await this.release(j);
      throw e;
    }
    return j;
  }

  /** The CPU bandwidth of the VMM's cgroup: `cpu` CPUs' worth per period, all its threads together. */
  async setCpu(j: Jailed, cpu: number): Promise<void> {
    const quota = Math.max(1000, Math.round(cpu * PERIOD_US));
    if (this.mode === 'v2') await writeFile(join(cgroupDir('v2', j.cgroup, ''), 'cpu.max'), `${quota} ${PERIOD_US}`);
    else {
      const d = cgroupDir(this.mode, j.cgroup, 'cpu');
      await writeFile(join(d, 'cpu.cfs_period_us'), String(PERIOD_US));
      await writeFile(join(d, 'cpu.cfs_quota_us'), String(quota));
    }
  }

  /** The command that starts `argv` (QEMU's) inside the cgroup, dropping to the VMM's user once QEMU has opened its files. */
  command(j: Jailed, qemu: string, args: string[]): { cmd: string; args: string[] } {
    const procs = this.dirs(j.cgroup).map((d) => join(d, 'cgroup.procs'));
    return { cmd: '/bin/sh', args: ['-c', `for f in ${procs.map(shellQuote).join(' ')}; do echo $$ > "$f" || exit 126; done; exec "$@"`, 'sh', qemu, ...args, '-chroot', j.dir, '-runas', `${j.ids.hostId}:${j.ids.hostId}`] };
  }

  /** Once the VMM has exited: ends what is left in its cgroup, removes it, and gives its user back. */
  async release(j: Jailed): Promise<void> {
    await this.empty(j.cgroup);
    this.ranges.give(j.ids);
  }

  /** Cgroups of VMMs a previous run of this node left (their QEMU killed with it or not). */
  async recover(): Promise<void> {
    for (const d of await readdir(this.dirs(this.parent)[0] as string, { withFileTypes: true }).catch(() => [])) {
      if (d.isDirectory()) await this.empty(`${this.parent}/${d.name}`).catch(() => {});
    }
  }

  /** Lets go of the users' blocks, and removes this node's (now empty) parent cgroups. */
  async close(): Promise<void> {
    this.ranges.close();
    const parts = this.parent.split('/').filter(Boolean);
    // /paddock-vmm/<node>/<backend>, then /paddock-vmm/<node>: a sibling backend's may still be there (EBUSY).
    for (let n = parts.length; n > 1; n--) for (const d of this.dirs(`/${parts.slice(0, n).join('/')}`)) await rmdir(d).catch(() => {});
  }

  private async empty(path: string): Promise<void> {
    const deadline = Date.now() + EMPTY_WAIT_MS;
    for (const d of this.dirs(path)) {
      for (let wait = 5; ; wait = Math.min(100, wait * 2)) {
        const err = await rmdir(d).then(
          () => undefined,
          (e: NodeJS.ErrnoException) => e,
        );
        if (!err || err.code === 'ENOENT') break;
        if (err.code !== 'EBUSY' || Date.now() > deadline) throw err;
        for (const p of (readText(join(d, 'cgroup.procs')) ?? '').split('\n')) {
          const pid = Number.parseInt(p, 10);
          if (pid > 1) {
            try {
              process.kill(pid, 'SIGKILL');
            } catch {
              // gone meanwhile
            }
          }
        }
        await new Promise((r) => setTimeout(r, wait));
      }
    }
  }

  /** Under cgroup v2 a controller reaches a cgroup only when every ancestor hands it down. */
  private async delegateV2(): Promise<void> {
    const parts = this.parent.split('/').filter(Boolean);
    for (let i = 0; i <= parts.length; i++) {
      const d = cgroupDir('v2', `/${parts.slice(0, i).join('/')}`.replace(/\/$/, ''), '');
      await mkdir(d, { recursive: true });
      await writeFile(join(d, 'cgroup.subtree_control'), '+cpu +memory +pids').catch(() => {});
    }
  }
}

function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}
