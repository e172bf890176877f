/**
 * The OCI runtime config of a container sandbox: pure data from the spec and the image, so it can
 * be read and tested without running anything.
 */
import { readFileSync } from 'node:fs';
import type { SandboxSpec } from '../../protocol/index.ts';
import type { CgroupMode } from '../cgroups.ts';
import { type IdRange, SANDBOX_IDS } from '../ids.ts';
import type { ImageManifest } from '../images/store.ts';
import { seccompProfile } from './seccomp.ts';

export interface OciInput {
  spec: SandboxSpec;
  image: ImageManifest;
  rootfs: string;
  cgroupsPath: string;
  cgroupMode: CgroupMode;
  /** Host ids that the sandbox's 0…size-1 map to (default: the first range, SANDBOX_IDS). */
  ids?: IdRange;
  /** A user namespace made for the sandbox beforehand, with those maps, for crun to join (hardening.ts ownMounts). */
  userns?: string;
  /** CPUs to pin to (`nproc` inside then tells the truth), e.g. "1" or "0-3". */
  cpus?: string;
  /** lxcfs's mount point: its /proc files replace the host's, so meminfo shows the sandbox's limit. */
  lxcfs?: string;
}

/** /proc files lxcfs virtualizes from the reader's cgroup. */
export const LXCFS_PROC_FILES = ['cpuinfo', 'diskstats', 'loadavg', 'meminfo', 'stat', 'swaps', 'uptime'];

const CAPS = ['CAP_AUDIT_WRITE', 'CAP_KILL', 'CAP_NET_BIND_SERVICE', 'CAP_CHOWN', 'CAP_DAC_OVERRIDE', 'CAP_FOWNER', 'CAP_FSETID', 'CAP_SETGID', 'CAP_SETUID', 'CAP_SETPCAP'];

// /proc files that leak host state or can hurt the host (a recursive grep reaching
// /proc/kpagecgroup crashed the reference system's kernel).
export const MASKED_PATHS = [
  '/proc/acpi',
  '/proc/asound',
  '/proc/kcore',
  '/proc/keys',
  '/proc/latency_stats',
  '/proc/timer_list',
  '/proc/timer_stats',
  '/proc/sched_debug',
  '/proc/scsi',
  '/proc/kpagecgroup',
  '/proc/kpageflags',
  '/proc/kpagecount',
  '/proc/kallsyms',
  '/proc/kmsg',
  '/proc/sysrq-trigger',
  '/proc/config.gz',
  '/sys/firmware',
  '/sys/devices/virtual/powercap',
];
/**
 * Read-only, besides the usual: pid 1's OOM rank. crun mounts these while the container's process
 * is already pid 1 of its namespace, so the paths are the init's own. A non-dumpable init's /proc
 * files belong to the sandbox's root (the kernel's task_dump_owner), and raising an
 * oom_score_adj needs no privilege: `echo 1000 > /proc/1/oom_score_adj` and a memory hog killed
 * the init.
 */
export const READONLY_PATHS = ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger', '/proc/1/oom_score_adj', '/proc/1/oom_adj', '/proc/1/task/1/oom_score_adj', '/proc/1/task/1/oom_adj'];

/**
 * Pending signals (RT signals queued) and POSIX message-queue bytes are counted per user, and a
 * sandbox's counts are also charged to the owner of its user namespace on the host: when that was
 * root (crun made it), a sandbox holding them made host root's sigqueue fail with EAGAIN and its
 * mq_open with ENOMEM. Each uid inside is bounded by these; the namespace is now owned by the
 * sandbox's own host uid and made with the same limits (spawner.c sandbox_userns), which bounds the
 * sum over all uids inside.
 */
export const SHARED_COUNTER_RLIMITS = [
  { type: 'RLIMIT_SIGPENDING', ...capped(1024, 'Max pending signals') },
  { type: 'RLIMIT_MSGQUEUE', ...capped(64 * 1024, 'Max msgqueue size') },
];

/** `want`, or the node's own hard limit of that name when lower (a hard limit can only be lowered). */
function capped(want: number, name: string): { hard: number; soft: number } {
  const line = readFileSync('/proc/self/limits', 'utf8')
    .split('\n')
    .find((l) => l.startsWith(name));
  const hard = Number(line?.slice(name.length).trim().split(/\s+/)[1]);
  const v = Number.isFinite(hard) ? Math.min(want, hard) : want;
  return { hard: v, soft: v };
}

/** Environment of every process: image defaults, overridden by the spec. */
export function baseEnv(image: ImageManifest, spec: SandboxSpec): string[] {
  const env = new Map<string, string>();
  for (const kv of image.env) {
    const i = kv.indexOf('=');
    if (i > 0) env.set(kv.slice(0, i), kv.slice(i + 1));
  }
  for (const [k, v] of Object.entries(spec.env)) env.set(k, v);
  return [...env].map(([k, v]) => `${k}=${v}`);
}

/** The kernel's CFS bandwidth period of a new cgroup (cpu.cfs_period_us, and cpu.max's second field). */
export const DEFAULT_CFS_PERIOD_US = 100_000;
/** The longest CFS period the kernel takes. */
const MAX_CFS_PERIOD_US = 1_000_000;
/** The least CPU time a sandbox may use in one go before it is throttled: see cfsBandwidth. */
const MIN_CFS_QUOTA_US = 10_000;

/**
 * The CFS quota and period of a sandbox of `cpu` cores. The share is `cpu` either way; the period
 * sets how much of it may be spent at once. At the default 100 ms a 0.01-CPU sandbox may run 1 ms,
 * then waits for the next period: starting a command (`crun exec` joins the sandbox's cgroup, then
 * sets up namespaces, capabilities and seccomp and execs) took more than that on a host where a
 * fork+exec costs ~14 ms (page-table isolation under a paravirtualised MMU), so every exec in an
 * idle 0.01-CPU sandbox waited out two to six periods: `crun exec true` 100–600 ms, 28 ms unthrottled,
 * measured at 1,000 live. Small shares get a longer period instead, up to the kernel's 1 s, so that
 * each period holds at least 10 ms: the same share over a second, spent in bursts an exec fits in.
 */
export function cfsBandwidth(cpu: number): { quota: number; period: number } {
  const period = Math.min(MAX_CFS_PERIOD_US, Math.max(DEFAULT_CFS_PERIOD_US, Math.ceil(MIN_CFS_QUOTA_US / cpu / 1000) * 1000));
  return { quota: Math.max(1000, Math.round(cpu * period)), period };
}

export function ociConfig({ spec, image, rootfs, cgroupsPath, cgroupMode, ids = SANDBOX_IDS, userns, cpus, lxcfs }: OciInput): Record<string, unknown> {
  const memory = spec.memoryMiB * 1024 * 1024;
  const namespaces: Array<{ type: string; path?: string }> = [{ type: 'user', ...(userns ? { path: userns } : {}) }, { type: 'pid' }, { type: 'network' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }];
  const idMap = [{ containerID: 0, hostID: ids.hostId, size: ids.size }];
  const lxcfsMounts = lxcfs ? LXCFS_PROC_FILES.map((f) => ({ destination: `/proc/${f}`, type: 'bind', source: `${lxcfs}/proc/${f}`, options: ['rbind', 'ro', 'nosuid', 'nodev', 'noexec'] })) : [];
  if (cgroupMode === 'v2') namespaces.push({ type: 'cgroup' });
  return {
    ociVersion: '1.0.2',
    process: {
      terminal: false,
      user: image.user,
      args: image.init,
      env: baseEnv(image, spec),
      cwd: spec.cwd ?? image.cwd,
      capabilities: { bounding: CAPS, effective: CAPS, permitted: CAPS },
      // The hard limit here must stay under the node's own: root may lack CAP_SYS_RESOURCE.
      rlimits: [{ type: 'RLIMIT_NOFILE', hard: 1024, soft: 1024 }, ...SHARED_COUNTER_RLIMITS],
      noNewPrivileges: true,
    },
    root: { path: rootfs, readonly: false },
    hostname: 'sandbox',
    mounts: [
      { destination: '/proc', type: 'proc', source: 'proc' },
      { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
      { destination: '/dev/pts', type: 'devpts', source: 'devpts', options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620'] },
      { destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'noexec', 'nodev', 'mode=1777', 'size=65536k'] },
      { destination: '/dev/mqueue', type: 'mqueue', source: 'mqueue', options: ['nosuid', 'noexec', 'nodev'] },
      { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
      ...lxcfsMounts,
    ],
    linux: {
      cgroupsPath,
      namespaces,
      uidMappings: idMap,
      gidMappings: idMap,
      seccomp: seccompProfile(),
      resources: {
        devices: [{ allow: false, access: 'rwm' }],
        memory: { limit: memory, swap: memory },
        // Best-effort sandboxes get the smallest weight the kernel takes: they run on what
        // latency-sensitive ones leave (their processes also run under SCHED_IDLE).
        cpu: { ...cfsBandwidth(spec.cpu), shares: spec.qos === 'be' ? 2 : Math.max(1024, Math.round(spec.cpu * 1024)), ...(cpus ? { cpus } : {}) },
        pids: { limit: spec.pidsLimit },
      },
      maskedPaths: MASKED_PATHS,
      readonlyPaths: READONLY_PATHS,
    },
  };
}
