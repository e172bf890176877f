/**
 * Verdicts of an exec: which of the sandbox's limits ended it. The kernel counts every time a limit
 * bites (pids.events `max`, the memory cgroup's `oom_kill`), so the exec reads the counters before
 * and after and compares; the writable layer is full when its tmpfs has no block left.
 *
 * The counters are the sandbox's, not the exec's: an exec running beside another one that hits a
 * limit sees it too. The verdict from them is runtime/backend.ts verdictOf, the microVMs' too.
 */
import { statfs } from 'node:fs/promises';
import { type ExecOutcome, type LimitCounters, verdictOf } from '../backend.ts';
import { type CgroupMode, cgroupDir } from '../cgroups.ts';
import { readText } from '../sync-read.ts';


/** `key value` lines (pids.events, memory.events, memory.oom_control) → the value of `key`. */
export function counter(text: string, key: string): number {
  const m = new RegExp(`^${key}\\s+(\\d+)`, 'm').exec(text);
  return m ? Number(m[1]) : 0;
}

export class LimitWatch {
  constructor(
    private readonly mode: CgroupMode,
    private readonly cgroupPath: string,
  ) {}

  private file(ctrl: string, name: string): string {
    return readText(`${cgroupDir(this.mode, this.cgroupPath, ctrl)}/${name}`) ?? '';
  }

  /** Synchronous (readText): read before and after every exec, through the thread pool they were 16 round trips of its latency. */
  read(): LimitCounters {
    const pids = this.file('pids', 'pids.events');
    const mem = this.mode === 'v2' ? this.file('', 'memory.events') : this.file('memory', 'memory.oom_control');
    return { pidsMax: counter(pids, 'max'), oomKills: counter(mem, 'oom_kill') };
  }
}

/** Whether the filesystem holding `path` has no room left: less than one 4 KiB page, or no inode. */
export async function diskFull(path: string): Promise<boolean> {
  const s = await statfs(path).catch(() => null);
  return s !== null && (s.bavail * s.bsize < 4096 || s.ffree === 0);
}

/** How often a running exec checks whether the pids limit bit. */
const PIDS_POLL_MS = 200;

/**
 * Runs one exec between two counter readings and gives its outcome a verdict. Hitting the pids
 * limit also ends the exec at once: a fork bomb never ends by itself and would burn its CPU
 * share until the timeout.
 */
export async function judged(watch: LimitWatch, disk: string, outer: AbortSignal | undefined, run: (signal: AbortSignal) => Promise<ExecOutcome>): Promise<ExecOutcome> {
  const before = watch.read();
  const ctl = new AbortController();
  const onOuter = () => ctl.abort();
  if (outer?.aborted) ctl.abort();
  else outer?.addEventListener('abort', onOuter, { once: true });
  const poll = setInterval(() => {
    if (watch.read().pidsMax > before.pidsMax) ctl.abort();
  }, PIDS_POLL_MS);
  try {
    const o = await run(ctl.signal);
    const after = watch.read();
    o.verdict = verdictOf(o, before, after, o.exitCode !== 0 && (await diskFull(disk)), outer);
    return o;
  } finally {
    clearInterval(poll);
    outer?.removeEventListener('abort', onOuter);
  }
}
