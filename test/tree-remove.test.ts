/** The tree walk of files.remove, on the real filesystem, in its worker threads. */
import { lstatSync, mkdirSync, writeFileSync } from 'node:fs';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'ava';
import { emptyTree } from '../runtime/tree-remove.ts';

function deepTree(top: string, depth: number): void {
  let dir = top;
  mkdirSync(dir);
  for (let i = 0; i < depth; i++) {
    writeFileSync(join(dir, 'f'), 'x');
    dir = join(dir, 'd');
    mkdirSync(dir);
  }
}

test('ten concurrent walks, queued two at a time, each empty its tree and nothing else', async (t) => {
  const base = await mkdtemp(join(tmpdir(), 'paddock-tree-'));
  t.teardown(() => rm(base, { recursive: true, force: true }));
  const tops = Array.from({ length: 10 }, (_, i) => join(base, `t${i}`));
  for (const top of tops) deepTree(top, 200);
  writeFileSync(join(base, 'keep'), 'beside the trees');
  const outcomes = await Promise.all(tops.map((top) => emptyTree({ top, topIno: lstatSync(top).ino, shown: top })));
  t.deepEqual(outcomes, tops.map(() => ({ ok: true })));
  for (const top of tops) t.deepEqual(await readdir(top), [], `${top} is empty`);
  t.deepEqual((await readdir(base)).sort(), [...tops.map((p) => p.slice(base.length + 1)), 'keep'].sort());
});

test('a top that is not the directory the caller saw is refused, not walked', async (t) => {
  const base = await mkdtemp(join(tmpdir(), 'paddock-tree-'));
  t.teardown(() => rm(base, { recursive: true, force: true }));
  mkdirSync(join(base, 'a'));
  mkdirSync(join(base, 'b'));
  writeFileSync(join(base, 'b', 'f'), 'x');
  const r = await emptyTree({ top: join(base, 'b'), topIno: lstatSync(join(base, 'a')).ino, shown: 'b' });
  t.deepEqual(r, { ok: false, refusal: { kind: 'changed', name: 'b' } });
  t.deepEqual(await readdir(join(base, 'b')), ['f'], 'nothing removed');
});
