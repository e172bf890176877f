/**
 * The host's process table as admission sees it. Every sandbox's pids limit is a share of one
 * table, kernel.pid_max (32,768 by default, here): at 32 sandboxes of the default 1,024 pids the
 * table was full and forks failed in every sandbox and on the host. A node therefore counts the
 * specs' pidsLimit against the table, and raises pid_max to the kernel's largest (2^22 on 64-bit)
 * at start where it may — it is one sysctl for the whole host (and, from Linux 6.14, per pid
 * namespace), which only ever makes room. kernel.threads-max, the other bound on tasks, follows
 * the host's RAM: kernel stacks are charged to the sandboxes' memory cgroups, which memory
 * admission already counts.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import type { Logger } from 'pino';

/** The kernel's largest pid_max on 64-bit (PID_MAX_LIMIT). */
export const PID_MAX_LIMIT = 4 * 1024 * 1024;
/** Pids left to the host itself: the node, its helpers, everything else on it. */
const HOST_RESERVE = 4096;

function readInt(path: string): number | undefined {
  try {
    const n = Number.parseInt(readFileSync(path, 'utf8'), 10);
    return Number.isFinite(n) ? n : undefined;
  } catch {
    return undefined;
  }
}

/** Raises kernel.pid_max when allowed and asked; returns the value in force. */
export function ensurePidMax(raise: boolean, log?: Logger): number {
  const path = '/proc/sys/kernel/pid_max';
  const before = readInt(path) ?? 32768;
  if (!raise || before >= PID_MAX_LIMIT) return before;
  try {
    writeFileSync(path, String(PID_MAX_LIMIT));
  } catch (err) {
    log?.warn({ err, pidMax: before }, 'kernel.pid_max could not be raised: admission counts pids against it as it is');
    return before;
  }
  const after = readInt(path) ?? before;
  log?.info({ from: before, to: after }, 'raised kernel.pid_max (one host-wide table shared by every sandbox)');
  return after;
}

/** Pids the node may promise its sandboxes: the table less what the host holds and a reserve. */
export function pidCapacity(pidMax: number): number {
  let inUse = 0;
  const stat = (() => {
    try {
      return readFileSync('/proc/loadavg', 'utf8');
    } catch {
      return '';
    }
  })();
  // loadavg's fourth field: runnable/total scheduling entities (threads) on the host.
  const m = /\s\d+\/(\d+)\s/.exec(stat);
  if (m?.[1]) inUse = Number(m[1]);
  return Math.max(0, pidMax - inUse - HOST_RESERVE);
}
