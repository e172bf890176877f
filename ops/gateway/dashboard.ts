/**
 * The dashboard: static files from ops/gateway/dashboard/ and the browser builds that npm
 * packages ship (xterm.js, Chart.js), served as they are from node_modules: no build step.
 */
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { sourceFile } from '../../runtime/source.ts';

// The page is not compiled: beside the sources, from dist/ too.
const pageDir = sourceFile('ops/gateway/dashboard');
const require = createRequire(import.meta.url);
/** A package's folder: from its main file up to its package.json (chart.js exports no package.json). */
function pkgDir(name: string): string {
  let d = dirname(require.resolve(name));
  while (!existsSync(join(d, 'package.json'))) d = dirname(d);
  return d;
}

/** URL → file, for everything the page loads. */
function assets(): Record<string, { file: string; type: string }> {
  const js = 'text/javascript; charset=utf-8';
  const css = 'text/css; charset=utf-8';
  return {
    '/': { file: join(pageDir, 'index.html'), type: 'text/html; charset=utf-8' },
    '/ui/app.js': { file: join(pageDir, 'app.js'), type: js },
    '/ui/app.css': { file: join(pageDir, 'app.css'), type: css },
    '/ui/vendor/xterm.js': { file: join(pkgDir('@xterm/xterm'), 'lib', 'xterm.js'), type: js },
    '/ui/vendor/xterm.css': { file: join(pkgDir('@xterm/xterm'), 'css', 'xterm.css'), type: css },
    '/ui/vendor/addon-fit.js': { file: join(pkgDir('@xterm/addon-fit'), 'lib', 'addon-fit.js'), type: js },
    '/ui/vendor/chart.js': { file: join(pkgDir('chart.js'), 'dist', 'chart.umd.min.js'), type: js },
  };
}

export function serveDashboard(app: FastifyInstance): void {
  for (const [url, a] of Object.entries(assets())) {
    app.get(url, async (_req, reply) => reply.type(a.type).header('cache-control', 'no-cache').send(await readFile(a.file)));
  }
}
