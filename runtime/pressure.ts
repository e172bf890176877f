/**
 * The node's memory gauge: MemAvailable from /proc/meminfo and the `some avg10` stall share from
 * PSI (/proc/pressure/memory, where the kernel has it). Pressure starts when either crosses its
 * threshold and ends only when both are comfortably back (hysteresis), so the node does not flap.
 */
import { readFile } from 'node:fs/promises';

export interface PressureConfig {
  /** Pressure when MemAvailable falls under this many MiB. */
  minAvailableMiB: number;
  /** Pressure when PSI memory `some avg10` (percent of time stalled) rises over this. */
  psiAvg10: number;
}

export interface MemoryReading {
  availableMiB: number;
  /** null when the kernel has no PSI. */
  psiAvg10: number | null;
}

export async function readMemory(): Promise<MemoryReading> {
  const meminfo = await readFile('/proc/meminfo', 'utf8');
  const kb = Number(/^MemAvailable:\s+(\d+) kB$/m.exec(meminfo)?.[1] ?? 0);
  const psi = await readFile('/proc/pressure/memory', 'utf8').catch(() => null);
  const avg = psi ? Number(/^some avg10=([\d.]+)/m.exec(psi)?.[1] ?? Number.NaN) : Number.NaN;
  return { availableMiB: Math.floor(kb / 1024), psiAvg10: Number.isFinite(avg) ? avg : null };
}

/** 'pressure', 'relieved' or 'hold' (between the marks: stay as you are). Pure. */
export function judge(r: MemoryReading, c: PressureConfig): 'pressure' | 'relieved' | 'hold' {
  const psi = r.psiAvg10 ?? 0;
  if (r.availableMiB < c.minAvailableMiB || psi > c.psiAvg10) return 'pressure';
  if (r.availableMiB > c.minAvailableMiB * 1.25 && psi < c.psiAvg10 / 2) return 'relieved';
  return 'hold';
}

export function describe(r: MemoryReading): string {
  return `MemAvailable ${r.availableMiB} MiB, PSI some avg10 ${r.psiAvg10 ?? 'n/a'}`;
}
