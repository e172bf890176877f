import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'ava';
import { withHostLock } from '../runtime/images/lock.ts';

async function dir(t: import('ava').ExecutionContext): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), 'paddock-lock-'));
  t.teardown(() => rm(d, { recursive: true, force: true }));
  return d;
}

test('a lock whose holder was killed is taken over, and released after use', async (t) => {
  const d = await dir(t);
  const lock = join(d, 'x.lock');
  // A real holder: a process that takes the lock and is then killed with SIGKILL, so no finally runs.
  const src = `import { withHostLock } from ${JSON.stringify(new URL('../runtime/images/lock.ts', import.meta.url).href)};
await withHostLock(${JSON.stringify(lock)}, async () => { process.stdout.write('held'); await new Promise(() => {}); });`;
  const holder = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', src], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((r) => holder.stdout.once('data', () => r()));
  t.regex(await readFile(lock, 'utf8'), new RegExp(`^${holder.pid} `));
  holder.kill('SIGKILL');
  await new Promise((r) => holder.once('exit', r));
  t.is(await withHostLock(lock, async () => 'mine'), 'mine');
  await t.throwsAsync(readFile(lock), { code: 'ENOENT' });
});

test('a lock file naming no live process (empty, garbage, a pid long gone) does not hold anyone up', async (t) => {
  const d = await dir(t);
  for (const content of ['', 'garbage', '999999999 1', `${process.ppid} 1`]) {
    const lock = join(d, 'y.lock');
    await writeFile(lock, content);
    t.is(await withHostLock(lock, async () => content), content, JSON.stringify(content));
  }
});

test('a waiter gets what the holder made without running its own build; one at a time otherwise', async (t) => {
  const d = await dir(t);
  const lock = join(d, 'z.lock');
  let made: string | null = null;
  let inside = 0;
  let most = 0;
  const build = async (who: string) => {
    inside++;
    most = Math.max(most, inside);
    await new Promise((r) => setTimeout(r, 50));
    inside--;
    made = who;
    return who;
  };
  const results = await Promise.all(['a', 'b', 'c'].map((who) => withHostLock(lock, () => build(who), async () => made)));
  t.is(most, 1);
  t.is(new Set(results).size, 1, 'every caller got the first build');
});
