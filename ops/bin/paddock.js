#!/usr/bin/env node
// The `paddock` bin runs the compiled CLI (dist/, built by `npm run build`, which set-up and
// `npm pack` run). A clone that was never built falls back to the TypeScript sources through tsx,
// at ~1 s more per command.
import { existsSync } from 'node:fs';

const compiled = new URL('../../dist/ops/cli/main.js', import.meta.url);
if (existsSync(compiled)) await import(compiled.href);
else {
  const { register } = await import('tsx/esm/api');
  register();
  await import('../cli/main.ts');
}
