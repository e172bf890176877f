/**
 * Where the files that ship beside the code are, whether Paddock runs from its TypeScript sources
 * (through tsx), compiled under dist/ (tsc keeps the folders: dist/runtime/spawner.js is
 * runtime/spawner.ts), or as the CLI's bundle (dist/cli/, where every module's import.meta.url is
 * a chunk's). The C and Python helpers, the dashboard page and package.json are not compiled: they
 * are named by their path in the source tree, from the root, never from a module's own URL.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const COMPILED = import.meta.url.endsWith('.js');

/** The repository (or installed package) root: the nearest folder above this module whose package.json is Paddock's. */
export const ROOT = (() => {
  const here = dirname(fileURLToPath(import.meta.url));
  for (let dir = here; ; dir = dirname(dir)) {
    const pkg = join(dir, 'package.json');
    if (existsSync(pkg) && (JSON.parse(readFileSync(pkg, 'utf8')) as { name?: string }).name === 'paddock') return dir;
    if (dirname(dir) === dir) throw new Error(`Paddock's package.json is not above ${here}`);
  }
})();
const DIST = join(ROOT, 'dist');

/** Whether the module at `metaUrl` runs compiled (from dist/, tsc's tree or the CLI's bundle). */
export function isCompiled(metaUrl: string): boolean {
  return metaUrl.endsWith('.js') && fileURLToPath(metaUrl).startsWith(DIST + sep);
}

/** A file shipped in the source tree, by its path from the root (`runtime/spawner.c`). */
export function sourceFile(rel: string): string {
  return join(ROOT, rel);
}

/** A module to fork or run, by its path from the root without extension (`runtime/images/lazyfs-main`): compiled when this process runs compiled. */
export function moduleFile(rel: string): string {
  return COMPILED ? join(DIST, `${rel}.js`) : join(ROOT, `${rel}.ts`);
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
