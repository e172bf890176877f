/**
 * Empties a directory tree inside a sandbox's root with one directory fd open at a time, whatever
 * its depth, in a worker thread. A recursion holding an fd per level took the node to 19,749 of
 * its 20,000 fds on a tree 30,000 deep (EMFILE, and the tree stayed); the walk that replaced it,
 * on fs/promises, paid a thread-pool round trip for each of its ~12 calls per level: 0.9 ms a level
 * on this VM, 25 s for that tree, almost all of it in futex and epoll waits. The same calls made
 * synchronously take a tenth of that, and in a worker they never block the node's event loop (a
 * directory of a lazily loaded layer can wait on the store for seconds).
 *
 * Going back up is through `..` of the fd in hand, checked to be the directory it came down from
 * (the agent may move directories while we walk): if it is not, the walk stops with `Changed`
 * (FORBIDDEN to the caller) rather than delete elsewhere. No protocol imports: the worker starts
 * with node:fs alone.
 */
import { closeSync, constants, fstatSync, lstatSync, openSync, readdirSync, rmdirSync, unlinkSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import { moduleFile } from './source.ts';

const { O_RDONLY, O_DIRECTORY, O_NOFOLLOW } = constants;

export interface TreeJob {
  /** The directory to empty, as a path the worker can open (`/proc/self/fd/<fd>/<name>`: fds are the process's). */
  top: string;
  topIno: number;
  /** The name the caller gave, for messages. */
  shown: string;
  /** The only device whose directories may be entered (one-filesystem roots). */
  dev?: number;
}

/** Why the walk stopped short of deleting something it should not: the tree changed under it, or reached another filesystem. */
export type TreeRefusal = { kind: 'changed' | 'other-filesystem'; name: string };

export type TreeOutcome = { ok: true } | { ok: false; refusal: TreeRefusal } | { ok: false; errno?: string; message: string };

class Refused extends Error {
  constructor(readonly refusal: TreeRefusal) {
    super(refusal.kind);
  }
}

const errnoOf = (e: unknown) => (e as NodeJS.ErrnoException | undefined)?.code;
const via = (fd: number, name: Buffer) => Buffer.concat([Buffer.from(`/proc/self/fd/${fd}/`), name]);

interface Level {
  name: Buffer;
  ino: number;
  subdirs: Buffer[];
}

/** Unlinks every non-directory in the directory `fd`; returns the names of its subdirectories. */
function clearFiles(fd: number, dev: number | undefined, shown: string): Buffer[] {
  const subdirs: Buffer[] = [];
  for (const name of readdirSync(`/proc/self/fd/${fd}`, { encoding: 'buffer' })) {
    const p = via(fd, name);
    let st: ReturnType<typeof lstatSync>;
    try {
      st = lstatSync(p);
    } catch (e) {
      if (errnoOf(e) === 'ENOENT') continue;
      throw e;
    }
    if (st?.isDirectory()) {
      if (dev !== undefined && st.dev !== dev) throw new Refused({ kind: 'other-filesystem', name: `${shown}/…/${name.toString()}` });
      subdirs.push(name);
    } else {
      try {
        unlinkSync(p);
      } catch (e) {
        if (errnoOf(e) !== 'ENOENT') throw e;
      }
    }
  }
  return subdirs;
}

/** The walk itself, synchronous: run it in the worker (emptyTree), not on the node's event loop. */
export function emptyTreeSync(job: TreeJob): void {
  const { dev, shown } = job;
  let cur = openSync(job.top, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  const levels: Level[] = [];
  try {
    if (fstatSync(cur).ino !== job.topIno) throw new Refused({ kind: 'changed', name: shown });
    levels.push({ name: Buffer.from(shown), ino: job.topIno, subdirs: clearFiles(cur, dev, shown) });
    for (;;) {
      const level = levels[levels.length - 1] as Level;
      const sub = level.subdirs.pop();
      if (sub !== undefined) {
        let next: number;
        try {
          next = openSync(via(cur, sub), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
        } catch (e) {
          // Gone or swapped for a file or link since it was listed: the next listing sees what it is now.
          if (['ENOENT', 'ENOTDIR', 'ELOOP'].includes(errnoOf(e) ?? '')) continue;
          throw e;
        }
        const st = fstatSync(next);
        if (dev !== undefined && st.dev !== dev) {
          closeSync(next);
          throw new Refused({ kind: 'other-filesystem', name: sub.toString() });
        }
        closeSync(cur);
        cur = next;
        levels.push({ name: sub, ino: st.ino, subdirs: clearFiles(cur, dev, shown) });
        continue;
      }
      // This level is empty of what was listed: anything made since sends it round once more.
      const again = clearFiles(cur, dev, shown);
      if (again.length > 0) {
        level.subdirs = again;
        continue;
      }
      if (levels.length === 1) return;
      const up = openSync(`/proc/self/fd/${cur}/..`, O_RDONLY | O_DIRECTORY);
      const parent = levels[levels.length - 2] as Level;
      const ust = fstatSync(up);
      if (ust.ino !== parent.ino || (dev !== undefined && ust.dev !== dev)) {
        closeSync(up);
        throw new Refused({ kind: 'changed', name: shown });
      }
      closeSync(cur);
      cur = up;
      levels.pop();
      try {
        rmdirSync(via(cur, level.name));
      } catch (e) {
        if (!['ENOENT', 'ENOTEMPTY'].includes(errnoOf(e) ?? '')) throw e;
      }
    }
  } finally {
    closeSync(cur);
  }
}

/** emptyTreeSync's outcome as a message (what the worker posts). */
export function runTreeJob(job: TreeJob): TreeOutcome {
  try {
    emptyTreeSync(job);
    return { ok: true };
  } catch (e) {
    if (e instanceof Refused) return { ok: false, refusal: e.refusal };
    const errno = errnoOf(e);
    return { ok: false, ...(errno ? { errno } : {}), message: (e as Error).message };
  }
}

/**
 * The worker's module, compiled, or from its TypeScript source: a worker does not inherit the
 * `--import tsx` hooks of its process (Node 20 runs them per thread), so it registers them first.
 */
function workerEntry(): [string | URL, { eval?: boolean }] {
  const file = moduleFile('runtime/tree-remove-worker');
  if (file.endsWith('.js')) return [file, {}];
  const code = `import(${JSON.stringify(import.meta.resolve('tsx/esm/api'))}).then((m) => { m.register(); return import(${JSON.stringify(pathToFileURL(file).href)}); });`;
  return [code, { eval: true }];
}

/**
 * Walks at once, node-wide; the rest queue. A worker is ~10 MiB: a thousand concurrent recursive
 * removes from one agent must not be a thousand threads. Two keep both cores busy.
 */
const MAX_WORKERS = 2;
let running = 0;
const waiting: Array<() => void> = [];

/** Empties the tree in a worker thread (at most MAX_WORKERS at a time); resolves with what the walk found. */
export async function emptyTree(job: TreeJob): Promise<TreeOutcome> {
  // A slot is handed from a finished walk straight to the next waiter, never freed in between.
  if (running >= MAX_WORKERS) await new Promise<void>((r) => waiting.push(r));
  else running++;
  try {
    return await walkInWorker(job);
  } finally {
    const next = waiting.shift();
    if (next) next();
    else running--;
  }
}

function walkInWorker(job: TreeJob): Promise<TreeOutcome> {
  return new Promise((resolve, reject) => {
    const [entry, how] = workerEntry();
    const w = new Worker(entry, { ...how, workerData: job, resourceLimits: { maxOldGenerationSizeMb: 256 } });
    let done = false;
    w.once('message', (m: TreeOutcome) => {
      done = true;
      resolve(m);
    });
    w.once('error', (err) => {
      done = true;
      reject(err);
    });
    w.once('exit', (code) => {
      if (!done) reject(new Error(`the tree removal's worker exited (${code}) without an answer`));
    });
  });
}
