/** Host id ranges per sandbox (runtime/ids.ts): real flock(1) locks in a directory of the test's own. */
import { execFile, spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import test from 'ava';

const dir = mkdtempSync(join(tmpdir(), 'paddock-ids-'));
process.env.PADDOCK_ID_LOCK_DIR = dir;
process.env.PADDOCK_ID_BLOCK = '4';
const { IdRanges, SANDBOX_IDS } = await import('../runtime/ids.ts');
const run = promisify(execFile);
test.after.always(() => rm(dir, { recursive: true, force: true }));

/** Whether another process could take the lock of `block` right now. */
async function free(block: number): Promise<boolean> {
  return run('flock', ['--nonblock', '--conflict-exit-code', '75', join(dir, String(block)), 'true']).then(
    () => true,
    () => false,
  );
}

test.serial('two nodes get disjoint ranges from blocks of their own; a range is reused last; close lets the blocks go', async (t) => {
  const a = new IdRanges();
  const b = new IdRanges();
  t.teardown(() => {
    a.close();
    b.close();
  });
  const fromA = await Promise.all(Array.from({ length: 6 }, () => a.take()));
  const fromB = await Promise.all(Array.from({ length: 3 }, () => b.take()));
  t.is(a.heldBlocks.length, 2);
  t.is(b.heldBlocks.length, 1);
  t.false(a.heldBlocks.some((x) => b.heldBlocks.includes(x)));
  const all = [...fromA, ...fromB].map((r) => r.hostId).sort((x, y) => x - y);
  t.is(new Set(all).size, all.length);
  for (let i = 1; i < all.length; i++) t.true((all[i] as number) - (all[i - 1] as number) >= SANDBOX_IDS.size);
  for (const r of [...fromA, ...fromB]) {
    t.is(r.size, 65536);
    t.true(r.hostId >= SANDBOX_IDS.hostId && r.hostId + r.size - 1 <= 0xffff_fffe);
  }
  // A range given back comes again only after the other free ones of the node.
  a.give(fromA[0] as (typeof fromA)[0]);
  const given = (fromA[0] as (typeof fromA)[0]).hostId;
  const next = [await a.take(), await a.take()].map((r) => r.hostId);
  t.false(next.includes(given));
  t.is((await a.take()).hostId, given);
  for (const block of [...a.heldBlocks, ...b.heldBlocks]) t.false(await free(block), `block ${block} is held`);
  const held = a.heldBlocks;
  a.close();
  await new Promise((r) => setTimeout(r, 200));
  for (const block of held) t.true(await free(block), `block ${block} is free after close`);
  await t.throwsAsync(a.take(), { code: 'UNAVAILABLE' } as never);
});

test.serial("a node killed with SIGKILL leaves no claim behind: its block is free at once", async (t) => {
  const child = spawn(process.execPath, ['--import', 'tsx', '-e', "const { IdRanges } = await import('./runtime/ids.ts'); const r = new IdRanges(); await r.take(); console.log(r.heldBlocks[0]); setInterval(() => {}, 1000);"], {
    env: { ...process.env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  t.teardown(() => child.kill('SIGKILL'));
  const block = await new Promise<number>((resolve, reject) => {
    child.stdout.once('data', (d: Buffer) => resolve(Number(d.toString().trim())));
    child.once('exit', (code) => reject(new Error(`exited ${code}`)));
  });
  t.false(await free(block));
  child.kill('SIGKILL');
  await new Promise((r) => child.once('exit', r));
  let isFree = false;
  for (let i = 0; i < 50 && !isFree; i++) {
    isFree = await free(block);
    if (!isFree) await new Promise((r) => setTimeout(r, 100));
  }
  t.true(isFree);
});
