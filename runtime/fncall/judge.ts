/**
 * Judging, as pure functions: how a run's outcome becomes a verdict, how output is compared with
 * what a test expects, and how the tests of one invocation add up. No I/O: unit-tested alone.
 */
import { constants } from 'node:os';
import type { FnCompareMode, FnRunResult, FnTestResult, FnVerdict } from '../../protocol/index.ts';
import type { RunLimits, RunOutcome } from './member.ts';

const ERRNO_NAMES: Record<number, string> = Object.fromEntries(Object.entries(constants.errno).map(([k, v]) => [v, k]));
const SIGNAL_NAMES: Record<number, string> = Object.fromEntries(Object.entries(constants.signals).map(([k, v]) => [v, k]));

export function signalName(n: number): string {
  return SIGNAL_NAMES[n] ?? `signal ${n}`;
}

/** Whitespace at the ends of lines (\r included, so CRLF output passes) and blank lines at the end. */
function lines(b: Uint8Array): string[] {
  const out = Buffer.from(b).toString('utf8').split('\n').map((l) => l.replace(/[ \t\r\f\v]+$/, ''));
  while (out.length > 0 && out[out.length - 1] === '') out.pop();
  return out;
}

function tokens(b: Uint8Array): string[] {
  return Buffer.from(b)
    .toString('utf8')
    .split(/\s+/)
    .filter((t) => t !== '');
}

export function sameOutput(actual: Uint8Array, expected: Uint8Array, mode: FnCompareMode): boolean {
  switch (mode) {
    case 'exact':
      return Buffer.from(actual).equals(Buffer.from(expected));
    case 'lines': {
      const a = lines(actual);
      const e = lines(expected);
      return a.length === e.length && a.every((l, i) => l === e[i]);
    }
    case 'tokens': {
      const a = tokens(actual);
      const e = tokens(expected);
      return a.length === e.length && a.every((t, i) => t === e[i]);
    }
  }
}

/**
 * The verdict of one run. Limits first (they say why a program ended: memory, then time, then
 * output), then how it ended (RUNTIME_ERROR), then what it printed (WRONG_ANSWER).
 */
export function judgeRun(o: RunOutcome, limits: RunLimits, expected: Uint8Array | undefined, compare: FnCompareMode, pidsLimit: number): FnRunResult {
  const r: FnRunResult = {
    verdict: 'OK',
    exitCode: o.exitCode,
    stdout: o.stdout,
    stderr: o.stderr,
    timeMs: Math.round(o.cpuMs * 1000) / 1000,
    wallMs: Math.round(o.wallMs * 1000) / 1000,
    memoryBytes: o.maxRssBytes,
  };
  if (o.signal !== undefined) r.signal = signalName(o.signal);
  const v = (verdict: FnVerdict, reason?: string) => {
    r.verdict = verdict;
    if (reason) r.reason = reason;
    return r;
  };
  switch (o.limit) {
    case 'memory':
      return v('MEMORY_LIMIT', `the program used more than ${limits.memoryMiB} MiB`);
    case 'time':
      return v('TIME_LIMIT', (o.timeBy ?? (o.cpuMs > limits.timeMs || o.wallMs < limits.wallMs ? 'cpu' : 'wall')) === 'cpu' ? `the program used more than ${limits.timeMs} ms of CPU time` : `the program ran past ${limits.wallMs} ms of wall-clock time`);
    case 'output':
      return v('OUTPUT_LIMIT', `the program wrote more than ${limits.outputBytes} bytes`);
    case 'pids':
      return v('RUNTIME_ERROR', `the program reached the limit of ${pidsLimit} processes and threads and was stopped`);
  }
  if (o.execErrno !== undefined) return v('RUNTIME_ERROR', `the program could not be started: ${ERRNO_NAMES[o.execErrno] ?? `errno ${o.execErrno}`}`);
  if (o.signal !== undefined) return v('RUNTIME_ERROR', `the program was killed by ${signalName(o.signal)}`);
  if (o.exitCode !== 0) return v('RUNTIME_ERROR', `the program exited with code ${o.exitCode}`);
  if (expected !== undefined && !sameOutput(o.stdout, expected, compare)) return v('WRONG_ANSWER');
  return r;
}

/** A test's result with its output cut to a preview. */
export function previewOf(r: FnRunResult, max: number): FnTestResult {
  const t: FnTestResult = { ...r };
  if (r.stdout.length > max || r.stderr.length > max) {
    t.stdout = r.stdout.subarray(0, max);
    t.stderr = r.stderr.subarray(0, max);
    t.outputCut = true;
  }
  return t;
}

/**
 * The invocation's verdict over its tests: OK when all pass, else the first failure's. Its output
 * and exit are that test's (or the last test's when all pass); time and memory are the largest.
 */
export function aggregate(tests: FnRunResult[]): FnRunResult & { passed: number } {
  const first = tests.find((t) => t.verdict !== 'OK') ?? tests[tests.length - 1];
  if (!first) throw new Error('aggregate of no tests');
  return {
    ...first,
    timeMs: Math.max(...tests.map((t) => t.timeMs)),
    wallMs: Math.round(tests.reduce((s, t) => s + t.wallMs, 0) * 1000) / 1000,
    memoryBytes: Math.max(...tests.map((t) => t.memoryBytes)),
    passed: tests.filter((t) => t.verdict === 'OK').length,
  };
}
