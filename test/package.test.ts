/**
 * Paddock as a dependency of another project: `npm pack`, `npm install <tarball>` in a scratch
 * project in a temp dir, then the SDK from plain Node (ESM, no loader flag) against a real cluster,
 * and its TypeScript types through tsc.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { clusterTest } from './helpers/cluster.ts';

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const test = clusterTest();

test('another project installs the packed tarball and drives a sandbox with plain node', async (t) => {
  t.timeout(600_000);
  const dir = await mkdtemp(join(tmpdir(), 'paddock-pack-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const packed = await run('npm', ['pack', '--pack-destination', dir, '--silent'], { cwd: ROOT, maxBuffer: 16 * 1024 * 1024 });
  const tarball = join(dir, packed.stdout.trim().split('\n').at(-1) as string);
  const project = join(dir, 'trainer');
  await run('mkdir', ['-p', project]);
  await writeFile(join(project, 'package.json'), JSON.stringify({ name: 'trainer', version: '1.0.0', type: 'module', private: true }));
  // --prefer-offline: the dependencies are in npm's cache from this clone's own install.
  await run('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', tarball], { cwd: project, maxBuffer: 16 * 1024 * 1024 });
  const installed = await readdir(join(project, 'node_modules', 'paddock', 'dist', 'sdk'));
  t.true(installed.includes('index.js') && installed.includes('index.d.ts'), 'compiled JavaScript and its types are in the package');

  // Top-level await in a plain ESM file: the failure a user hit when the package shipped sources.
  await writeFile(
    join(project, 'main.mjs'),
    `import { Paddock, NotFoundError } from 'paddock';
import { subjects } from 'paddock/protocol';
const pdk = await Paddock.connect();
const sb = await pdk.sandboxes.create({ labels: { test: 'package' } });
const r = await sb.exec(['sh', '-c', 'echo hi; exit 3']);
await sb.kill();
let missing = '';
try { await pdk.sandboxes.get('sb-doesnotexist00000'); } catch (e) { missing = e instanceof NotFoundError ? e.code : String(e); }
await pdk.close();
console.log(JSON.stringify({ exitCode: r.exitCode, stdout: r.stdout, verdict: r.verdict, missing, subject: subjects.placeCreate }));
`,
  );
  const env = { ...process.env, NATS_URL: t.context.cluster.url };
  const out = await run(process.execPath, ['main.mjs'], { cwd: project, env });
  t.deepEqual(JSON.parse(out.stdout), { exitCode: 3, stdout: 'hi\n', verdict: 'OK', missing: 'NOT_FOUND', subject: 'pdk.v1.place.create' });

  // The package's CLI runs its bundle, which finds the package's root (and its shipped files) from
  // inside node_modules/paddock/dist/cli/ rather than from a clone.
  t.true((await readdir(join(project, 'node_modules', 'paddock', 'dist', 'cli'))).includes('main.js'), "the CLI's bundle is in the package");
  const ps = await run(join(project, 'node_modules', '.bin', 'paddock'), ['ps', '--all', '--json'], { cwd: project, env });
  const listed = JSON.parse(ps.stdout) as Array<{ labels: Record<string, string> }>;
  t.true(Array.isArray(listed) && listed.some((s) => s.labels.test === 'package'), 'the installed paddock bin lists the sandbox the SDK made');

  // The types: a TypeScript consumer type-checks against the package's .d.ts files.
  await writeFile(
    join(project, 'main.ts'),
    `import { Paddock, type ExecResult } from 'paddock';
const pdk: Paddock = await Paddock.connect({ timeoutMs: 1000 });
const r: ExecResult = await (await pdk.sandboxes.create({ image: 'busybox' })).exec('true');
const code: number = r.exitCode;
// @ts-expect-error: exitCode is a number
const wrong: string = r.exitCode;
export { code, wrong };
`,
  );
  await writeFile(join(project, 'tsconfig.json'), JSON.stringify({ compilerOptions: { target: 'ES2022', module: 'NodeNext', moduleResolution: 'NodeNext', strict: true, noEmit: true, skipLibCheck: true, types: [] }, files: ['main.ts'] }));
  const tsc = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
  const checked = await run(process.execPath, [tsc, '-p', project], { cwd: project }).then(
    () => '',
    (e: { stdout?: string }) => e.stdout ?? 'tsc failed',
  );
  t.is(checked, '');
});
