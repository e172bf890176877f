/**
 * Waiting for a container's init to finish its execve. `crun run -d` returns as soon as the init
 * has called execve, but with lazily loaded layers the kernel may still be reading the program and
 * its interpreter from the store for a while; until the exec passes its point of no return, the
 * process is not dumpable and `crun exec` cannot join its namespaces (setns: EPERM). The kernel
 * renames the process (`comm`) at that point, so that is what we wait for.
 */
import { basename } from 'node:path';
import { readText } from '../sync-read.ts';

/**
 * `pidFile`: what `crun run --pid-file` wrote (reading it saves a `crun state` spawn per create).
 * Resolves with the init's pid, or undefined when there is none to read.
 */
export async function waitExecuted(o: { pidFile: string; init: string[]; timeoutMs?: number }): Promise<number | undefined> {
  const pid = Number.parseInt((readText(o.pidFile) ?? '').trim(), 10);
  if (!(pid > 1)) return undefined;
  const want = basename(o.init[0] ?? '').slice(0, 15);
  const deadline = Date.now() + (o.timeoutMs ?? 60_000);
  for (let delay = 2; ; delay = Math.min(delay * 2, 50)) {
    const comm = readText(`/proc/${pid}/comm`)?.trim();
    // Gone (the init failed: crun's error says why elsewhere) or renamed: either way, done waiting.
    if (comm === undefined || comm === want || Date.now() > deadline) return pid;
    await new Promise((r) => setTimeout(r, delay));
  }
}
