import { readFileSync } from 'node:fs';

/**
 * A small file's text, or undefined if it cannot be read. Synchronous, for files on tmpfs, procfs or
 * cgroupfs only (the node's run directory, /proc/<pid>/…, a sandbox's cgroup counters): those never
 * wait on a disk, and a read through libuv's thread pool (open, fstat, read, close: four round trips)
 * costs the node more than the file.
 */
export function readText(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
}
