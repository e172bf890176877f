/**
 * Which cgroup layout the host has. Production hosts are mostly pure v2; this development machine
 * is hybrid (v1 controllers plus an empty cgroup2 at /sys/fs/cgroup/unified), which crun refuses —
 * so the node unmounts `unified` inside its own private mount namespace (see ops/launch.ts).
 */
import { readFileSync } from 'node:fs';
import { mkdir, stat } from 'node:fs/promises';
import { dirname } from 'node:path';
import { sysMount } from './images/fuse.ts';

export type CgroupMode = 'v2' | 'hybrid' | 'v1';

interface MountLine {
  target: string;
  fstype: string;
}

export function mounts(mountinfo = readFileSync('/proc/self/mountinfo', 'utf8')): MountLine[] {
  const out: MountLine[] = [];
  for (const line of mountinfo.split('\n')) {
    if (!line) continue;
    const [pre, post] = line.split(' - ');
    const target = pre?.split(' ')[4];
    const fstype = post?.split(' ')[0];
    // The kernel escapes space, tab, newline and backslash in paths as octal.
    if (target && fstype) out.push({ target: target.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8))), fstype });
  }
  return out;
}

/**
 * Whether `path` is a mount point: its device differs from its parent directory's (what
 * mountpoint(1) falls back to). Two stat calls, where a look in /proc/self/mountinfo makes the
 * kernel format the whole mount table — at 3,000 sandboxes thousands of overlay option strings, tens
 * of ms on the event loop for every destroy. A bind mount of a directory of the same filesystem is
 * not told apart; the backend's own mounts (overlay, tmpfs) always bring a device of their own.
 */
export async function isMountPoint(path: string): Promise<boolean> {
  const missing = (e: NodeJS.ErrnoException) => e.code === 'ENOENT' || e.code === 'ENOTDIR';
  const [self, parent] = await Promise.all([stat(path).catch((e: NodeJS.ErrnoException) => (missing(e) ? null : e)), stat(dirname(path)).catch(() => null)]);
  if (self === null || parent === null) return false;
  // Not even stat works (ENOTCONN under a dead FUSE server, EIO): a mount, and a broken one.
  if (self instanceof Error) return true;
  return self.dev !== parent.dev;
}

export function detectCgroups(mountinfo?: string): CgroupMode {
  const m = mounts(mountinfo);
  if (m.some((x) => x.target === '/sys/fs/cgroup' && x.fstype === 'cgroup2')) return 'v2';
  if (m.some((x) => x.target === '/sys/fs/cgroup/unified' && x.fstype === 'cgroup2')) return 'hybrid';
  return 'v1';
}

/** The host directory of a sandbox's cgroup for one controller (`memory`, `pids`, …). */
export function cgroupDir(mode: CgroupMode, path: string, controller: string): string {
  return mode === 'v2' ? `/sys/fs/cgroup${path}` : `/sys/fs/cgroup/${controller}${path}`;
}

/**
 * The v1 hierarchies mounted under /sys/fs/cgroup (named ones such as `systemd` included: crun
 * creates the sandbox's cgroup in every one of them, so cleanup must visit them all).
 */
export function v1Hierarchies(mountinfo?: string): string[] {
  return mounts(mountinfo)
    .filter((m) => m.fstype === 'cgroup' && m.target.startsWith('/sys/fs/cgroup/'))
    .map((m) => m.target.slice('/sys/fs/cgroup/'.length));
}

/**
 * Moving a process into a cgroup (every `crun run` and `crun exec` does, once per hierarchy) takes
 * a global percpu rwsem for writing, and by default the first writer after a quiet spell waits
 * for an RCU grace period: measured here, 9–19 ms inside the first cgroup.procs write of each
 * `crun exec`, more than the rest of the exec together. The `favordynmods` option turns that
 * around — migrations stop waiting, and fork/exit take the rwsem's slower read path (an atomic
 * instead of a per-CPU increment) — the right trade for a host that starts thousands of
 * processes in fresh cgroups. It is a property of the kernel's rwsem, so mounting any cgroup v1
 * hierarchy with it is enough; a named one with no controllers changes nothing else. Mounted in
 * the node's private mount namespace, it lasts exactly as long as the node (the kernel drops a
 * hierarchy, and the option with it, when its last mount goes). Returns whether it is in effect.
 */
export async function favorDynamicCgroups(dir: string): Promise<boolean> {
  if (await isMountPoint(dir)) return true;
  await mkdir(dir, { recursive: true });
  return sysMount('paddock-dyn', dir, 'cgroup', 0, 'none,name=paddock-dyn,favordynmods').then(
    () => true,
    () => false,
  );
}
