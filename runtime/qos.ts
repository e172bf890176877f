/**
 * What the host's scheduler offers the QoS classes beyond SCHED_IDLE and CPU weights.
 *
 * Core scheduling (CONFIG_SCHED_CORE, prctl PR_SCHED_CORE) keeps tasks of different trust or QoS
 * off the two hyperthreads of one core at the same time, so a best-effort neighbour cannot slow a
 * latency-sensitive step through the shared core. It needs the kernel option and SMT: without SMT
 * there is no sibling to keep apart, and the kernel refuses PR_SCHED_CORE with ENODEV.
 *
 * Detected, never assumed: the running kernel's config (/proc/config.gz, else
 * /boot/config-<release>) when it can be read, else a prctl probe through python3's ctypes (Node has
 * no prctl binding). Measured on the development VM (kernel 6.18): `# CONFIG_SCHED_CORE is not set`,
 * SMT `notsupported` — unavailable on both counts.
 */
import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { release } from 'node:os';
import { promisify } from 'node:util';
import { gunzip } from 'node:zlib';

export interface CoreScheduling {
  /** The kernel has it and there are hyperthreads to use it on. */
  available: boolean;
  /** CONFIG_SCHED_CORE in the running kernel; null when neither its config nor a probe could tell. */
  kernel: boolean | null;
  /** SMT active (/sys/devices/system/cpu/smt/active); null when the kernel does not say. */
  smt: boolean | null;
  /** Where `kernel` came from. */
  source: 'kconfig' | 'prctl' | 'unknown';
  /** One sentence for logs and reports. */
  detail: string;
}

const PR_SCHED_CORE = 62;
const PR_SCHED_CORE_GET = 0;
const EINVAL = 22;
const ENODEV = 19;

/** CONFIG_SCHED_CORE from a kernel config text: true, false, or null when the text does not mention it. */
export function schedCoreInConfig(config: string): boolean | null {
  if (/^CONFIG_SCHED_CORE=y$/m.test(config)) return true;
  if (/^# CONFIG_SCHED_CORE is not set$/m.test(config)) return false;
  return null;
}

async function kernelConfig(): Promise<{ text: string; file: string } | null> {
  const gz = await readFile('/proc/config.gz').catch(() => null);
  if (gz) {
    const text = await promisify(gunzip)(gz).then(
      (b) => b.toString(),
      () => null,
    );
    if (text) return { text, file: '/proc/config.gz' };
  }
  const file = `/boot/config-${release()}`;
  const text = await readFile(file, 'utf8').catch(() => null);
  return text ? { text, file } : null;
}

/**
 * errno of prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET, self) — 0 when it worked — or null when no probe
 * could run (no python3).
 */
async function prctlProbe(): Promise<number | null> {
  const script = [
    'import ctypes',
    'libc = ctypes.CDLL(None, use_errno=True)',
    'cookie = ctypes.c_ulong(0)',
    `r = libc.prctl(${PR_SCHED_CORE}, ${PR_SCHED_CORE_GET}, 0, 0, ctypes.byref(cookie))`,
    'print(0 if r == 0 else ctypes.get_errno())',
  ].join('\n');
  try {
    const { stdout } = await promisify(execFile)('python3', ['-c', script], { timeout: 5000 });
    const errno = Number.parseInt(stdout.trim(), 10);
    return Number.isInteger(errno) ? errno : null;
  } catch {
    return null;
  }
}

async function smtActive(): Promise<boolean | null> {
  const s = await readFile('/sys/devices/system/cpu/smt/active', 'utf8').catch(() => null);
  return s === null ? null : s.trim() === '1';
}

export async function coreSchedulingAvailable(): Promise<CoreScheduling> {
  const smt = await smtActive();
  let kernel: boolean | null = null;
  let source: CoreScheduling['source'] = 'unknown';
  let how = 'the kernel config is not readable and no prctl probe could run';
  const cfg = await kernelConfig();
  const fromConfig = cfg ? schedCoreInConfig(cfg.text) : null;
  if (cfg && fromConfig !== null) {
    kernel = fromConfig;
    source = 'kconfig';
    how = `${cfg.file}: ${fromConfig ? 'CONFIG_SCHED_CORE=y' : 'CONFIG_SCHED_CORE is not set'}`;
  } else {
    const errno = await prctlProbe();
    if (errno !== null) {
      source = 'prctl';
      // EINVAL: the option does not exist in this kernel. ENODEV: it does, but there is no SMT.
      kernel = errno !== EINVAL;
      how = `prctl(PR_SCHED_CORE): ${errno === 0 ? 'ok' : errno === EINVAL ? 'EINVAL (not built in)' : errno === ENODEV ? 'ENODEV (built in, no SMT)' : `errno ${errno}`}`;
    }
  }
  const available = kernel === true && smt !== false;
  const smtText = smt === null ? 'SMT unknown' : smt ? 'SMT active' : 'no SMT';
  const detail = available
    ? `core scheduling available (${how}; ${smtText})`
    : `core scheduling unavailable (${how}; ${smtText}): best-effort isolation relies on SCHED_IDLE and CPU weight alone`;
  return { available, kernel, smt, source, detail };
}
