/**
 * The default `busybox` image: one small EROFS layer made from Debian's busybox-static. Built on
 * first start, reused after.
 */
import { chmod, copyFile, mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { run } from '../proc.ts';
import type { ImageManifest, ImageStore } from './store.ts';

export const BUSYBOX_IMAGE = 'busybox';

/**
 * PID 1 of a sandbox. It must reap: processes orphaned by an exec (`cmd &`, a killed tree) are
 * re-parented to it, and `sleep` would leave them zombies. The shell's `wait` reaps every child,
 * adopted ones included.
 */
export const BUSYBOX_INIT = ['/bin/sh', '-c', 'while :; do sleep 2147483647 & wait; done'];

function findBusybox(): string {
  return process.env.PADDOCK_BUSYBOX || '/bin/busybox';
}

export async function ensureBusyboxImage(store: ImageStore): Promise<ImageManifest> {
  const existing = await store.get(BUSYBOX_IMAGE);
  if (existing) {
    // Stores written by an older Paddock: chunk indexes (lazy loading needs them) and the reaping init.
    const current = existing.layers.every((l) => l.index) && JSON.stringify(existing.init) === JSON.stringify(BUSYBOX_INIT);
    return current ? existing : store.putManifest({ ...existing, init: BUSYBOX_INIT });
  }
  const dir = await mkdtemp(join(tmpdir(), 'paddock-busybox-'));
  try {
    const bb = findBusybox();
    for (const d of ['bin', 'etc', 'proc', 'sys', 'dev', 'tmp', 'root', 'work', 'home', 'var', 'run']) await mkdir(join(dir, d));
    await chmod(join(dir, 'tmp'), 0o1777);
    await copyFile(bb, join(dir, 'bin', 'busybox'));
    await chmod(join(dir, 'bin', 'busybox'), 0o755);
    const { stdout } = await run(bb, ['--list']);
    for (const applet of stdout.split('\n').map((s) => s.trim())) {
      if (applet && applet !== 'busybox' && /^[A-Za-z0-9_.[-]+$/.test(applet)) await symlink('busybox', join(dir, 'bin', applet)).catch(() => {});
    }
    await writeFile(join(dir, 'etc', 'passwd'), 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n');
    await writeFile(join(dir, 'etc', 'group'), 'root:x:0:\nnogroup:x:65534:\n');
    await writeFile(join(dir, 'etc', 'hostname'), 'sandbox\n');
    await writeFile(join(dir, 'etc', 'hosts'), '127.0.0.1 localhost sandbox\n::1 localhost\n');
    await store.init();
    const layer = await store.buildLayer(dir);
    const manifest: ImageManifest = {
      name: BUSYBOX_IMAGE,
      layers: [layer],
      env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOME=/root'],
      cwd: '/',
      user: { uid: 0, gid: 0 },
      init: BUSYBOX_INIT,
    };
    return await store.putManifest(manifest);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
