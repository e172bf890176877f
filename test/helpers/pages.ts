/** What the kernel says of a file's pages: how many are cached, and which processes map it. */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

/** Bytes of `file` in the page cache (util-linux fincore). */
export function resident(file: string): number {
  return Number(execFileSync('fincore', ['--bytes', '--noheadings', '--output', 'RES', file], { encoding: 'utf8' }).trim());
}

/** Those of `pids` that map `file` (their /proc/<pid>/maps name it); a process gone meanwhile does not. */
export function mappers(pids: number[], file: string): number[] {
  return pids.filter((p) => {
    try {
      return readFileSync(`/proc/${p}/maps`, 'utf8').includes(file);
    } catch {
      return false;
    }
  });
}
