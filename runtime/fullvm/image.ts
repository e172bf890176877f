/**
 * The `desktop` image of full VMs, built from Debian's packages like every other image: an X
 * server for QEMU's VGA (the modesetting driver on bochs DRM), evdev input, a light window
 * manager with a task bar (IceWM), a terminal (xterm), a browser (Dillo), a text editor
 * (Mousepad), a file manager (PCManFM) and xdotool, on bookworm minbase. Paddock's own files
 * (the start script, IceWM's keys and launchers) are the workspace layer, from desktop-root/.
 */
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { type BuildOptions, type BuildSpec, buildImage, currentImage, DEFAULT_ENV } from '../images/build.ts';
import { withHostLock } from '../images/lock.ts';
import type { ImageManifest, ImageStore } from '../images/store.ts';
import { sourceFile } from '../source.ts';

const ROOT = sourceFile('runtime/fullvm/desktop-root');

/** The files of desktop-root as one digest: the recipe names a directory, not what is in it. */
function rootDigest(dir = ROOT): string {
  const h = createHash('sha256');
  const walk = (d: string) => {
    for (const n of readdirSync(d).sort()) {
      const p = join(d, n);
      const st = statSync(p);
      h.update(`${relative(ROOT, p)}\0${st.mode & 0o7777}\0`);
      if (st.isDirectory()) walk(p);
      else h.update(readFileSync(p));
    }
  };
  walk(dir);
  return h.digest('hex').slice(0, 16);
}

export const DESKTOP_PACKAGES = [
  'xserver-xorg-core',
  'xserver-xorg-input-evdev',
  'xkb-data',
  'x11-xserver-utils',
  'x11-utils',
  'xdotool',
  'icewm',
  'xterm',
  'fonts-dejavu-core',
  'dillo',
  'mousepad',
  'pcmanfm',
];

export function desktopSpec(name = 'desktop'): BuildSpec {
  return {
    name,
    base: { suite: 'bookworm', variant: 'minbase' },
    toolkit: { packages: DESKTOP_PACKAGES },
    workspace: { dir: ROOT, content: rootDigest() },
    env: [...DEFAULT_ENV, 'DISPLAY=:0'],
    cwd: '/root',
    init: ['/usr/local/bin/paddock-desktop'],
  };
}

/** The `desktop` image, built once per store (a few minutes and ~150 MB of packages the first time). */
export async function ensureDesktopImage(store: ImageStore, o: Omit<BuildOptions, 'store'> = {}, name = 'desktop'): Promise<ImageManifest> {
  const spec = desktopSpec(name);
  const have = await currentImage(store, spec);
  if (have) return have;
  await store.init();
  return withHostLock(
    join(store.root, 'tmp', `${name}.lock`),
    () => buildImage(spec, { ...o, store }),
    () => currentImage(store, spec),
  );
}
