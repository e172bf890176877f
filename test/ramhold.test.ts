/**
 * ramhold.c through RamHold: a template's RAM file, mostly holes, is read in and stays mapped, so
 * reclaim of unmapped cold page cache leaves it; bad paths fail with a reason and the holder
 * serves on; a holder that dies is started again and maps again what it held.
 */
import { execFileSync } from 'node:child_process';
import { mkdtemp, readFile, rm, truncate, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'ava';
import { RamHold } from '../runtime/microvm/ramhold.ts';
import { sourceFile } from '../runtime/source.ts';
import { buildStaticBinary } from '../runtime/static-binary.ts';
import { mappers, resident } from './helpers/pages.ts';
import { eventually } from './helpers/wait.ts';

function holderPids(bin: string): number[] {
  try {
    return execFileSync('pgrep', ['-f', `^${bin}$`], { encoding: 'utf8' }).split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

test('holds a sparse file read in and mapped; bad paths fail with a reason; a holder that dies is replaced and maps it again', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'paddock-ramhold-'));
  const bin = await buildStaticBinary(sourceFile('runtime/microvm/ramhold.c'), dir, 'ramhold', 'the test');
  const hold = new RamHold(bin);
  t.teardown(async () => {
    hold.close();
    await rm(dir, { recursive: true, force: true });
  });
  const mem = join(dir, 'mem');
  await writeFile(mem, 'the guest wrote this');
  await truncate(mem, 64 * 1024 * 1024);

  await hold.hold(mem);
  t.is(resident(mem), 64 * 1024 * 1024, 'every page, holes included, is in the page cache');
  const [pid] = holderPids(bin);
  t.truthy(pid);
  t.deepEqual(mappers([pid as number], mem), [pid], 'and mapped by the holder');

  await t.throwsAsync(hold.hold(join(dir, 'absent')), { message: /No such file or directory/ });
  await t.throwsAsync(hold.hold(dir), { message: /not a regular file/ });
  await t.throwsAsync(hold.hold(`${mem}\nx`), { message: /newline/ });
  const other = join(dir, 'other');
  await writeFile(other, '');
  await truncate(other, 4096);
  await hold.hold(other);

  process.kill(pid as number, 'SIGKILL');
  const again = await eventually(async () => {
    const now = holderPids(bin);
    return now.length === 1 && now[0] !== pid && mappers(now, mem).length === 1 && mappers(now, other).length === 1;
  });
  t.true(again, 'a new holder maps both files again');
  t.is((await readFile(mem)).subarray(0, 20).toString(), 'the guest wrote this', 'read-only: the file is as it was');

  hold.close();
  t.true(await eventually(async () => holderPids(bin).length === 0), 'close ends the holder');
  await t.throwsAsync(hold.hold(mem), { message: /closed/ });
});
