// Bundles the CLI into dist/cli/ (run by `npm run build`, after tsc): one ES module per command,
// split so that a command loads only what it uses. Why: Node resolves and compiles each of the
// ~400 modules of tsc's tree at every start, and `paddock ps` spent most of its half second there
// (ops/bench/cli.ts measures both). Modules find their shipped files from the package root
// (runtime/source.ts), never from their own URL, which inside a bundle is a chunk's.
import { rmSync } from 'node:fs';
import { build } from 'esbuild';

// msgpackr's optional native string extractor: loading it (dlopen, and node-gyp-build's search for
// the binary) cost ~17 ms of every command, and it pays only on large string-heavy messages, which
// a CLI does not decode; nodes, which do, run tsc's tree and keep it. msgpackr skips a null module.
const noNativeMsgpack = {
  name: 'no-native-msgpack',
  setup(b) {
    b.onResolve({ filter: /^msgpackr-extract$/ }, () => ({ path: 'msgpackr-extract', namespace: 'no-native' }));
    b.onLoad({ filter: /.*/, namespace: 'no-native' }, () => ({ contents: 'module.exports = null;', loader: 'js' }));
  },
};

const outdir = new URL('../dist/cli/', import.meta.url).pathname;
rmSync(outdir, { recursive: true, force: true });
await build({
  entryPoints: [new URL('./cli/main.ts', import.meta.url).pathname],
  outdir,
  bundle: true,
  splitting: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  minify: process.env.PADDOCK_BUNDLE_MINIFY !== '0',
  sourcemap: 'linked',
  plugins: [noNativeMsgpack],
  // CommonJS dependencies call require() for Node's own modules, which an ES module lacks.
  banner: { js: "import{createRequire as __pdkRequire}from'node:module';const require=__pdkRequire(import.meta.url);" },
  logLevel: 'warning',
});
