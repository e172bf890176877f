/**
 * The node's small static C programs (the sandbox init and FnCall's runner, which it hands into
 * sandboxes, and its process spawner): built with the host's C compiler once per source version,
 * named by the hash of their source so that an edited program is rebuilt and nodes sharing a
 * directory share one binary. Static, they run in any image, busybox included, and need nothing
 * from it.
 */
import { createHash, randomBytes } from 'node:crypto';
import { access, mkdir, readFile, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { ProtocolError } from '../protocol/index.ts';
import { run } from './proc.ts';

/** Builds under way in this process, by output path: concurrent callers share one. */
const building = new Map<string, Promise<string>>();

export function buildStaticBinary(source: string, dir: string, name: string, purpose: string): Promise<string> {
  const key = `${dir}\0${name}\0${source}`;
  let b = building.get(key);
  if (!b) {
    b = build(source, dir, name, purpose).finally(() => building.delete(key));
    building.set(key, b);
  }
  return b;
}

async function build(source: string, dir: string, name: string, purpose: string): Promise<string> {
  const src = await readFile(source);
  const hash = createHash('sha256').update(src).digest('hex').slice(0, 16);
  const out = join(dir, `${name}-${hash}`);
  const built = await access(out).then(
    () => true,
    () => false,
  );
  if (built) return out;
  await mkdir(dir, { recursive: true });
  // Another process may build the same program at once: each writes its own file, and the rename is atomic.
  const tmp = `${out}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  const cc = await run('cc', ['-O2', '-static', '-Wall', '-o', tmp, source], { allowFail: true }).catch((e: unknown) => ({ code: 127, stdout: '', stderr: (e as Error).message }));
  if (cc.code !== 0) {
    await rm(tmp, { force: true });
    throw new ProtocolError('BACKEND_FAILED', `${purpose} needs a C compiler with a static libc on the node (apt-get install gcc libc6-dev): ${cc.stderr.trim().slice(0, 500)}`);
  }
  await rename(tmp, out);
  return out;
}
