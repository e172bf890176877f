/**
 * `npm test`'s ava run: the whole suite, then — only if some files failed — those files once
 * more, on their own, with the first run's failures printed above. A file that fails twice fails
 * the suite. This is for the intermittent failures a loaded two-core machine still shows (a
 * request past its 60 s timeout while image builds run beside it); each one the retry hides is
 * named here, so it is seen, not lost.
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { runAva } from './helpers/ava-run.ts';

const root = fileURLToPath(new URL('..', import.meta.url));
// Inside npm test's 45 minutes: a quiet two-core machine runs the whole suite in about 13.
const FULL_BUDGET_MS = (Number(process.env.PADDOCK_TEST_BUDGET_MIN) || 32) * 60_000;
const RETRY_BUDGET_MS = 10 * 60_000;

/** The test files a run's output names as failed: `✘ [fail]: <file> › …`, and files left pending at a timeout. */
function failedFiles(out: string): string[] {
  const files = new Set<string>();
  for (const m of out.matchAll(/✘ \[fail\]: ([a-z0-9-]+) ›/g)) files.add(`test/${m[1]}.test.ts`);
  for (const m of out.matchAll(/✘ \d+ tests? remaining in (test\/[^\s]+\.test\.ts)/g)) files.add(m[1] as string);
  for (const m of out.matchAll(/tests? (?:were|was) pending in (test\/[^\s]+\.test\.ts)/g)) files.add(m[1] as string);
  // A worker ended from outside: one the watchdog took for hung (helpers/ava-run.ts), or a crash.
  for (const m of out.matchAll(/✘ (test\/[^\s]+\.test\.ts) exited/g)) files.add(m[1] as string);
  return [...files].filter((f) => existsSync(join(root, f)));
}

// On a fresh machine the FnCall images take minutes to make, and the FnCall files that need them
// come early: each waited on the image lock in one of ava's two slots while nothing else ran.
// Started here, beside the first files, the build is done (or nearly) when they come; they take
// the same host lock, so they wait for it or find the images, and take over if it dies. The full
// VMs' desktop image comes after them (its test file sorts late).
const PREBUILD = "await (await import('./test/helpers/fncall.ts')).ensureFnImages(); await (await import('./test/helpers/desktop.ts')).ensureTestDesktop()";
const prebuild = process.argv.length <= 2 ? spawn('nice', ['-n', '5', process.execPath, '--import', 'tsx', '--input-type=module', '-e', PREBUILD], { cwd: root, stdio: ['ignore', 'ignore', 'inherit'] }) : undefined;
prebuild?.once('exit', (code) => {
  if (code !== 0) process.stdout.write(`\npaddock: the FnCall image build beside the suite exited with ${code}; the FnCall tests make the images themselves\n`);
});
const first = await runAva(process.argv.slice(2), { budgetMs: FULL_BUDGET_MS, label: 'the full run' });
if (prebuild && prebuild.exitCode === null) prebuild.kill('SIGTERM');
if (first.code === 0) process.exit(0);
if (first.overBudget) process.exit(1);
const files = failedFiles(first.out);
if (files.length === 0) process.exit(first.code);
process.stdout.write(`\npaddock: ${files.length} test file(s) failed in the full run: ${files.join(' ')}\npaddock: running them once more on their own\n\n`);
const again = await runAva(files, { budgetMs: RETRY_BUDGET_MS, label: 'the retry' });
process.stdout.write(again.code === 0 ? `\npaddock: the retry passed; the failures above were intermittent (${files.join(' ')})\n` : '\npaddock: the retry failed too\n');
process.exit(again.code);
