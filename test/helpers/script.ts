/**
 * A test's helper program (a trainer, a client) as one plain JavaScript file, so that the many
 * processes a test starts run on plain `node`. Through tsx each start costs ~1 s of CPU in its
 * loader hooks (measured: 1.47 s of CPU to import the SDK through tsx, 0.5 s compiled), which 40
 * trainer starts on a two-core machine pay in wall time. esbuild bundles the program and what it
 * imports from the repository from their sources, so the bundle is never stale; packages stay
 * imports, resolved from node_modules beside the bundle.
 */
import { rmSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';

const OUT = fileURLToPath(new URL('../../node_modules/.cache/paddock-test/', import.meta.url));
const built = new Map<string, Promise<string>>();

/** The bundled program for the TypeScript entry `entry` (named `<base>-<pid>.mjs`): its path, built once per process. */
export function scriptBundle(entry: string): Promise<string> {
  let p = built.get(entry);
  if (!p) {
    p = (async () => {
      await mkdir(OUT, { recursive: true });
      const outfile = join(OUT, `${basename(entry, '.ts')}-${process.pid}.mjs`);
      await build({ entryPoints: [entry], outfile, bundle: true, platform: 'node', format: 'esm', target: 'node20', packages: 'external', logLevel: 'error' });
      // One bundle per test process (two workers building the same file would race); gone with it.
      process.once('exit', () => rmSync(outfile, { force: true }));
      return outfile;
    })();
    built.set(entry, p);
  }
  return p;
}
