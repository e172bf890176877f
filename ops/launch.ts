/**
 * How a node process is started. The node runs in a private mount namespace of its own: its
 * layer and overlay mounts are invisible to the host and vanish with it, and on a hybrid-cgroup
 * host it can unmount the empty cgroup2 at /sys/fs/cgroup/unified that makes crun refuse to run.
 * `setpriv`, `unshare` and `sh` exec in place, so the pid a caller gets is the node's own.
 */
import { join } from 'node:path';
import { detectCgroups } from '../runtime/cgroups.ts';
import { NS_MARK } from '../runtime/namespace.ts';
import { distIsCurrent, isCompiled, ROOT } from '../runtime/source.ts';

export { NS_MARK };

/**
 * The node's entry point and the flags node needs for it. Compiled (dist/ops/node-main.js) when
 * this module runs compiled or dist/ is current, else the TypeScript source through tsx. tsx's
 * loader hooks cost ~1 s of CPU per start (measured: importing the node host takes 1.43 s of CPU
 * through tsx, 0.52 s compiled, even when tsx loads the compiled files), which a suite that starts
 * hundreds of nodes on two cores pays in wall time.
 */
export function nodeEntry(): { main: string; execArgv: string[] } {
  if (isCompiled(import.meta.url) || distIsCurrent()) return { main: join(ROOT, 'dist', 'ops', 'node-main.js'), execArgv: [] };
  return { main: join(ROOT, 'ops', 'node-main.ts'), execArgv: ['--import', import.meta.resolve('tsx')] };
}

/**
 * glibc's allocator settings for the Node processes Paddock starts (nodes, a gateway of its own).
 * By default glibc hands the top of its heap back to the kernel whenever 128 KiB of it is free,
 * and the next allocation faults those pages in again. A streamed exec allocates and frees ~64 KiB
 * buffers ~1,600 times a second per 100 MiB/s, and a page fault costs ~13 µs on this kind of VM:
 * the node took 48–79 faults per MiB streamed. Kept now: up to 32 MiB free at the heap's top, and
 * allocations of up to 4 MiB from the heap rather than from mmap (setting any of these fixes the
 * mmap threshold glibc would otherwise raise by itself). Measured on a 48 MiB stream: the node's
 * CPU 4.6–5.9 → 3.2–3.5 ms per MiB, 4–6 faults per MiB. A value already in the environment wins.
 */
const ALLOCATOR_ENV: Record<string, string> = { MALLOC_TRIM_THRESHOLD_: String(32 << 20), MALLOC_TOP_PAD_: String(16 << 20), MALLOC_MMAP_THRESHOLD_: String(4 << 20) };

/** Names the variables allocatorEnv set, for the process to take them out again (dropAllocatorEnv). */
const ALLOCATOR_MARK = 'PADDOCK_ALLOCATOR_SET';

export function allocatorEnv(env: NodeJS.ProcessEnv = process.env): Record<string, string> {
  const set = Object.fromEntries(Object.entries(ALLOCATOR_ENV).filter(([k]) => env[k] === undefined));
  return Object.keys(set).length > 0 ? { ...set, [ALLOCATOR_MARK]: Object.keys(set).join(',') } : {};
}

/**
 * Takes the variables allocatorEnv set out of this process's environment, once glibc has read
 * them at its start: what the node starts (QEMU, crun, its spawner) inherits the node's
 * environment, and a VMM under a memory bound of its guest's RAM plus a measured overhead must
 * not keep up to 32 MiB of freed heap, nor grow its heap 16 MiB at a time.
 */
export function dropAllocatorEnv(): void {
  for (const k of (process.env[ALLOCATOR_MARK] ?? '').split(',')) if (k in ALLOCATOR_ENV) delete process.env[k];
  delete process.env[ALLOCATOR_MARK];
}

/**
 * V8's settings for a node. A node's heap is ~20 MiB until it holds many sandboxes, and V8 sized
 * its old generation's limit to that: the output buffers a streamed exec holds for a few
 * milliseconds (its resume buffer, what NATS has not taken yet) were promoted and tripped that
 * limit, and the node ran a full mark-compact every ~60 ms while streaming (38–121 per 300 MiB,
 * "finalize incremental marking via task"). Starting the limit at 64 MiB took that to 4–5, the
 * node's CPU per streamed MiB from 6–12 ms to 2.5–3.5, and the SDK's stream in bench:gateway from
 * 73–94 to 110–150 MiB/s. A busy node's heap is past 64 MiB anyway; an idle one may keep up to
 * that much garbage a while longer.
 */
const NODE_V8_FLAGS = ['--initial-old-space-size=64'];

/** The command line that runs a node: `unshare … node dist/ops/node-main.js` (nodeEntry). */
export function nodeCommand(o: { dieWithParent?: boolean } = {}): { cmd: string; args: string[]; env: Record<string, string> } {
  // crun still writes <cgroupsPath>/cgroup.procs under `unified` once it is unmounted; a private
  // tmpfs there keeps those writes inside the node's namespace instead of on the host's tmpfs.
  // Each live sandbox holds a 4 KiB page there (measured: 12.5 MiB at 3,200), so the bound is set
  // for ~30,000; a tmpfs only uses what is written.
  const prep = detectCgroups() === 'hybrid' ? 'umount /sys/fs/cgroup/unified && mount -t tmpfs -o size=128m,mode=755 paddock-unified /sys/fs/cgroup/unified && ' : '';
  // SIGTERM when the process that started the node dies, however it dies: the node then stops in
  // order and kills its sandboxes instead of running on with no one to stop it.
  // A bridge machine (bridge/providers/local) outlives the bridge that started it: a successor adopts it.
  const { main, execArgv } = nodeEntry();
  const unshare = ['--mount', '--propagation', 'private', '--', '/bin/sh', '-c', `${prep}exec "$@"`, 'sh', process.execPath, ...NODE_V8_FLAGS, ...execArgv, main];
  if (o.dieWithParent === false) return { cmd: 'unshare', args: unshare, env: { [NS_MARK]: '1', ...allocatorEnv() } };
  return {
    cmd: 'setpriv',
    args: ['--pdeathsig', 'TERM', '--', 'unshare', ...unshare],
    env: { [NS_MARK]: '1', ...allocatorEnv() },
  };
}
