/**
 * How a node process is started. The node runs in a private mount namespace of its own: its
 * layer and overlay mounts are invisible to the host and vanish with it, and on a hybrid-cgroup
 * host it can unmount the empty cgroup2 at /sys/fs/cgroup/unified that makes crun refuse to run.
 * `setpriv`, `unshare` and `sh` exec in place, so the pid a caller gets is the node's own.
 */
import { fileURLToPath } from 'node:url';
import { detectCgroups } from '../runtime/cgroups.ts';
import { NS_MARK } from '../runtime/namespace.ts';

export { NS_MARK };

export function nodeMainPath(): string {
  // Started from the compiled CLI (dist/ops/launch.js), the node still runs from its
  // TypeScript sources: its C and Python helpers live beside them, and a process that runs for
  // hours does not mind tsx's second of start-up.
  const compiled = import.meta.url.endsWith('.js');
  return fileURLToPath(new URL(compiled ? '../../ops/node-main.ts' : './node-main.ts', import.meta.url));
}

/** The command line that runs a node: `unshare … node --import tsx ops/node-main.ts`. */
export function nodeCommand(o: { dieWithParent?: boolean } = {}): { cmd: string; args: string[]; env: Record<string, string> } {
  // crun still writes <cgroupsPath>/cgroup.procs under `unified` once it is unmounted; a private
  // tmpfs there keeps those writes inside the node's namespace instead of on the host's tmpfs.
  // Each live sandbox holds a 4 KiB page there (measured: 12.5 MiB at 3,200), so the bound is set
  // for ~30,000; a tmpfs only uses what is written.
  const prep = detectCgroups() === 'hybrid' ? 'umount /sys/fs/cgroup/unified && mount -t tmpfs -o size=128m,mode=755 paddock-unified /sys/fs/cgroup/unified && ' : '';
  // SIGTERM when the process that started the node dies, however it dies: the node then stops in
  // order and kills its sandboxes instead of running on with no one to stop it.
  // A bridge machine (bridge/providers/local) outlives the bridge that started it: a successor adopts it.
  const unshare = ['--mount', '--propagation', 'private', '--', '/bin/sh', '-c', `${prep}exec "$@"`, 'sh', process.execPath, '--import', import.meta.resolve('tsx'), nodeMainPath()];
  if (o.dieWithParent === false) return { cmd: 'unshare', args: unshare, env: { [NS_MARK]: '1' } };
  return {
    cmd: 'setpriv',
    args: ['--pdeathsig', 'TERM', '--', 'unshare', '--mount', '--propagation', 'private', '--', '/bin/sh', '-c', `${prep}exec "$@"`, 'sh', process.execPath, '--import', import.meta.resolve('tsx'), nodeMainPath()],
    env: { [NS_MARK]: '1' },
  };
}
