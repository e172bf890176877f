/**
 * A lock file shared by every process of this host (test workers, nodes, the CLI): one image build
 * at a time per store, one user of the deb cache at a time. The file names its holder by pid and
 * start time, so a holder that died (SIGKILL, `process.exit` in a stop handler, a killed test
 * worker) does not keep the others waiting: its lock is taken over at once. A lock with no holder
 * it can name used to be waited out for ten minutes per image, which is how one killed node
 * stretched a test run past its limit.
 */
import { link, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { procStat } from '../sync-read.ts';

const POLL_MS = 250;

/** The start time of `pid` in clock ticks since boot, or undefined if it is gone. */
const startTime = (pid: number): string | undefined => procStat(pid)?.start;

const self = `${process.pid} ${startTime(process.pid) ?? ''}`;

function holderAlive(content: string): boolean {
  const [pid, start] = content.trim().split(' ');
  const n = Number(pid);
  if (!Number.isInteger(n) || n <= 0) return false;
  const now = startTime(n);
  return now !== undefined && (!start || now === start);
}

/**
 * Runs `fn` holding the lock at `path`, unless `done` (when given) has an answer first: while
 * another live process holds the lock, and once it is ours, `done` is asked whether the other
 * holder already made what we wanted.
 */
export async function withHostLock<T>(path: string, fn: () => Promise<T>, done?: () => Promise<T | null | undefined>): Promise<T> {
  await mkdir(dirname(path), { recursive: true });
  // Written whole, then linked into place: the lock never exists without its holder's name.
  const mine = `${path}.${process.pid}.${Math.random().toString(36).slice(2)}`;
  await writeFile(mine, self);
  try {
    for (;;) {
      try {
        await link(mine, path);
        break;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      }
      const holder = await readFile(path, 'utf8').catch(() => null);
      if (holder !== null && !holderAlive(holder)) {
        // Re-read just before removing: another waiter may have taken the lock over meanwhile.
        if ((await readFile(path, 'utf8').catch(() => null)) === holder) await rm(path, { force: true });
        continue;
      }
      const answer = await done?.();
      if (answer) return answer;
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  } finally {
    await rm(mine, { force: true });
  }
  try {
    // The previous holder may have made it just before letting go.
    return (await done?.()) || (await fn());
  } finally {
    await rm(path, { force: true });
  }
}
