/**
 * Where the files that ship beside the code are, whether a module runs from its TypeScript source
 * (through tsx) or compiled under dist/ (tsc keeps the folders, so dist/runtime/spawner.js is
 * runtime/spawner.ts). The C and Python helpers, the dashboard page and package.json are not
 * compiled: a compiled module finds them in the source tree, not beside itself.
 */
import { readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const COMPILED = import.meta.url.endsWith('.js');
/** The repository (or installed package) root: above runtime/, or above dist/runtime/. */
export const ROOT = fileURLToPath(new URL(COMPILED ? '../../' : '../', import.meta.url)).replace(/\/$/, '');
const DIST = join(ROOT, 'dist');

/** Whether the module at `metaUrl` runs compiled (from dist/). */
export function isCompiled(metaUrl: string): boolean {
  return metaUrl.endsWith('.js') && fileURLToPath(metaUrl).startsWith(DIST + sep);
}

/** A file that ships beside the source of the module at `metaUrl` (`./spawner.c`), from either tree. */
export function sourceFile(metaUrl: string, rel: string): string {
  const here = dirname(fileURLToPath(metaUrl));
  const dir = isCompiled(metaUrl) ? join(ROOT, relative(DIST, here)) : here;
  return resolve(dir, rel);
}

/** A module beside the one at `metaUrl`, in the same tree (`./lazyfs-main` → .ts or .js), to fork or run. */
export function siblingModule(metaUrl: string, base: string): string {
  return fileURLToPath(new URL(`${base}${isCompiled(metaUrl) ? '.js' : '.ts'}`, metaUrl));
}

/** The folders and files `npm run build` compiles (tsconfig.build.json), as ops/setup.sh checks them. */
const BUILD_INPUTS = ['protocol', 'actors', 'bridge', 'chronus', 'runtime', 'ops', 'sdk'];
const BUILD_CONFIG = ['package.json', 'tsconfig.json', 'tsconfig.build.json'];

function newestInput(dir: string): number {
  let newest = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) newest = Math.max(newest, newestInput(p));
    else if (e.name.endsWith('.ts') || e.name.endsWith('.json')) newest = Math.max(newest, statSync(p).mtimeMs);
  }
  return newest;
}

let current: boolean | undefined;
/**
 * Whether dist/ was built after the last change to any source (dist/.built, which ops/setup.sh
 * touches after each build). Checked once per process: ~150 stats, a few milliseconds.
 */
export function distIsCurrent(): boolean {
  if (current !== undefined) return current;
  try {
    const built = statSync(join(DIST, '.built')).mtimeMs;
    let newest = 0;
    for (const d of BUILD_INPUTS) newest = Math.max(newest, newestInput(join(ROOT, d)));
    for (const f of BUILD_CONFIG) newest = Math.max(newest, statSync(join(ROOT, f)).mtimeMs);
    current = newest <= built;
  } catch {
    current = false;
  }
  return current;
}
