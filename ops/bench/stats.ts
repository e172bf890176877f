/**
 * Small statistics for benchmarks: percentiles of latency samples. Pure functions, no I/O, so any
 * benchmark (and its tests) can use them.
 */

export interface Summary {
  n: number;
  min: number;
  mean: number;
  p50: number;
  p95: number;
  p99: number;
  max: number;
}

/** Ascending copy: callers keep their samples in the order they were taken. */
export function sorted(samples: readonly number[]): number[] {
  return [...samples].sort((a, b) => a - b);
}

/**
 * The p-th percentile (0 ≤ p ≤ 100) of samples already sorted ascending, interpolating linearly
 * between the two closest ranks (numpy's default). With 50 samples the p99 is then a blend of the
 * two slowest rather than just the maximum, which is less jumpy from run to run.
 */
export function percentileSorted(asc: readonly number[], p: number): number {
  if (asc.length === 0) return Number.NaN;
  if (!(p >= 0 && p <= 100)) throw new RangeError(`percentile ${p} is outside 0..100`);
  const rank = (p / 100) * (asc.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  const a = asc[lo] as number;
  const b = asc[hi] as number;
  return a + (b - a) * (rank - lo);
}

/** The p-th percentile of unsorted samples. NaN when there are none. */
export function percentile(samples: readonly number[], p: number): number {
  return percentileSorted(sorted(samples), p);
}

export function summarize(samples: readonly number[]): Summary {
  const asc = sorted(samples);
  const sum = asc.reduce((s, x) => s + x, 0);
  return {
    n: asc.length,
    min: asc[0] ?? Number.NaN,
    mean: asc.length > 0 ? sum / asc.length : Number.NaN,
    p50: percentileSorted(asc, 50),
    p95: percentileSorted(asc, 95),
    p99: percentileSorted(asc, 99),
    max: asc[asc.length - 1] ?? Number.NaN,
  };
}

/** Rounds to 3 decimals (microseconds, for values in milliseconds). */
export function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}
