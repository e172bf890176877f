/**
 * Putting a container to sleep and waking it, straight through its cgroup files: a write, not a
 * process spawn, so a group of thousands pauses in well under a second. (`crun pause` writes the
 * same freezer file, at the cost of a fork and exec each.)
 *
 * The freezer files are read and written synchronously: the kernel answers from memory (a write
 * starts the freezing and returns; a read looks at the cgroup's few tasks), while each promise-based
 * call is four round trips through libuv's thread pool — open, fstat, read, close: 30% of the node's
 * CPU while pausing a group of 1,500, in its profile.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ProtocolError } from '../../protocol/index.ts';
import { type CgroupMode, cgroupDir } from '../cgroups.ts';
import { readText } from '../sync-read.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const FREEZE_TIMEOUT_MS = 5000;

export class CgroupSleep {
  /**
   * Cgroups known not to be frozen: made here and not frozen since, or thawed. Killing thousands,
   * the freezer write each would otherwise get was 7% of the node's CPU; a cgroup this process has
   * not seen (adopted after a restart) is thawed whatever its state.
   */
  private readonly awake = new Set<string>();

  constructor(private readonly mode: CgroupMode) {}

  /** A cgroup made running (never frozen). */
  started(path: string): void {
    this.awake.add(path);
  }

  /** Thaws the cgroup unless it is known to be running, and forgets it: it is going away. */
  async thawForRemoval(path: string): Promise<void> {
    if (!this.awake.delete(path)) await this.thaw(path);
  }

  private file(path: string, controller: string, name: string): string {
    return join(cgroupDir(this.mode, path, controller), name);
  }

  /** Freezes every process of the cgroup; resolves once the kernel says they all are. */
  async freeze(path: string): Promise<void> {
    this.awake.delete(path);
    if (this.mode === 'v2') {
      writeFileSync(this.file(path, '', 'cgroup.freeze'), '1');
      const events = this.file(path, '', 'cgroup.events');
      await this.waitFor(() => /^frozen 1$/m.test(readFileSync(events, 'utf8')), path);
    } else {
      const f = this.file(path, 'freezer', 'freezer.state');
      writeFileSync(f, 'FROZEN');
      // FREEZING while tasks are still being stopped; writing FROZEN again retries the stragglers.
      await this.waitFor(() => {
        const st = readFileSync(f, 'utf8').trim();
        if (st === 'FREEZING') writeFileSync(f, 'FROZEN');
        return st === 'FROZEN';
      }, path);
    }
  }

  async thaw(path: string): Promise<void> {
    if (this.mode === 'v2') writeFileSync(this.file(path, '', 'cgroup.freeze'), '0');
    else writeFileSync(this.file(path, 'freezer', 'freezer.state'), 'THAWED');
    this.awake.add(path);
  }

  async isFrozen(path: string): Promise<boolean> {
    if (this.mode === 'v2') return /^frozen 1$/m.test(readText(this.file(path, '', 'cgroup.events')) ?? '');
    return (readText(this.file(path, 'freezer', 'freezer.state')) ?? '').trim() !== 'THAWED';
  }

  private async waitFor(done: () => boolean, path: string): Promise<void> {
    const until = Date.now() + FREEZE_TIMEOUT_MS;
    let wait = 1;
    while (!done()) {
      if (Date.now() > until) throw new ProtocolError('BACKEND_FAILED', `cgroup ${path} did not freeze within ${FREEZE_TIMEOUT_MS} ms`);
      await sleep(wait);
      wait = Math.min(wait * 2, 50);
    }
  }

  /** Bytes of memory the cgroup holds now (page cache included). */
  async memoryUsage(path: string): Promise<number> {
    const name = this.mode === 'v2' ? 'memory.current' : 'memory.usage_in_bytes';
    return Number((await readFile(this.file(path, 'memory', name), 'utf8')).trim());
  }

  /**
   * Gives the frozen cgroup's memory back to the node: its page cache always; its anonymous memory
   * too when the node has swap (or zswap in front of it). v2 has memory.reclaim; v1 does not, so
   * the limit is lowered for a moment — the kernel reclaims down to it, or answers EBUSY when it
   * cannot (anonymous memory with nowhere to go), never an OOM kill — and then put back.
   */
  async reclaim(path: string): Promise<{ bytes: number; swapped: boolean }> {
    const swapped = await swapAvailable();
    const before = await this.memoryUsage(path);
    if (this.mode === 'v2') {
      await writeFile(this.file(path, 'memory', 'memory.reclaim'), String(before)).catch(() => {
        // EAGAIN: it reclaimed what it could.
      });
    } else {
      const limitFile = this.file(path, 'memory', 'memory.limit_in_bytes');
      const limit = (await readFile(limitFile, 'utf8')).trim();
      const stat = await readFile(this.file(path, 'memory', 'memory.stat'), 'utf8');
      const rss = Number(/^total_rss (\d+)$/m.exec(stat)?.[1] ?? 0);
      const floor = 1024 * 1024;
      let target = swapped ? floor : rss + floor;
      try {
        for (let i = 0; i < 4 && target < before; i++) {
          try {
            await writeFile(limitFile, String(target));
            break;
          } catch (e) {
            if ((e as NodeJS.ErrnoException).code !== 'EBUSY') throw e;
            target = Math.ceil((target + before) / 2);
          }
        }
      } finally {
        await writeFile(limitFile, limit);
      }
    }
    const after = await this.memoryUsage(path);
    return { bytes: Math.max(0, before - after), swapped };
  }
}

async function swapAvailable(): Promise<boolean> {
  const swaps = await readFile('/proc/swaps', 'utf8').catch(() => '');
  return swaps.trim().split('\n').length > 1;
}
