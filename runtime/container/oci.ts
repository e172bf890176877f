/**
 * The OCI runtime config of a container sandbox: pure data from the spec and the image, so it can
 * be read and tested without running anything.
 */
import type { SandboxSpec } from '../../protocol/index.ts';
import type { CgroupMode } from '../cgroups.ts';
import type { ImageManifest } from '../images/store.ts';

export interface OciInput {
  spec: SandboxSpec;
  image: ImageManifest;
  rootfs: string;
  cgroupsPath: string;
  cgroupMode: CgroupMode;
}

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
  '/sys/firmware',
  '/sys/devices/virtual/powercap',
];
export const READONLY_PATHS = ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger'];

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

export function ociConfig({ spec, image, rootfs, cgroupsPath, cgroupMode }: OciInput): Record<string, unknown> {
  const memory = spec.memoryMiB * 1024 * 1024;
  const period = 100_000;
  const namespaces = [{ type: 'pid' }, { type: 'network' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }];
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
      rlimits: [{ type: 'RLIMIT_NOFILE', hard: 1024, soft: 1024 }],
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
    ],
    linux: {
      cgroupsPath,
      namespaces,
      resources: {
        devices: [{ allow: false, access: 'rwm' }],
        memory: { limit: memory, swap: memory },
        // Best-effort sandboxes get the smallest weight the kernel takes: they run on what
        // latency-sensitive ones leave (their processes also run under SCHED_IDLE).
        cpu: { quota: Math.max(1000, Math.round(spec.cpu * period)), period, shares: spec.qos === 'be' ? 2 : Math.max(1024, Math.round(spec.cpu * 1024)) },
        pids: { limit: spec.pidsLimit },
      },
      maskedPaths: MASKED_PATHS,
      readonlyPaths: READONLY_PATHS,
    },
  };
}
