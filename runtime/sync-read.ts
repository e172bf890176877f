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

/**
 * Fields of /proc/<pid>/stat: its state letter (3), parent (4), process group (5) and start time in
 * clock ticks since boot (22: with the pid, what names one process for good). undefined once it is gone.
 */
export function procStat(pid: number): { state: string; ppid: number; pgid: number; start: string } | undefined {
  const text = readText(`/proc/${pid}/stat`);
  if (!text) return undefined;
  // Its name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
  const f = text.slice(text.lastIndexOf(')') + 2).split(' ');
  const [state, start] = [f[0], f[19]];
  return state && start ? { state, ppid: Number(f[1]), pgid: Number(f[2]), start } : undefined;
}
