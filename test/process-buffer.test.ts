/** The node's buffer of a background process's output: the newest bytes, by offset, with what was dropped. */
import test from 'ava';
import { Ring } from '../actors/processes.ts';

const b = (s: string) => Buffer.from(s);
const text = (r: Ring, from: number) => {
  const got = r.from(from);
  return { lost: got.lost, text: got.chunks.map((c) => c.d.toString()).join(''), at: got.chunks[0]?.at };
};

test('keeps the newest bytes, cutting the oldest chunk where the bound falls', (t) => {
  const r = new Ring(8);
  t.is(r.append(b('abcde')), 0);
  t.is(r.append(b('fghij')), 5);
  t.is(r.total, 10);
  t.is(r.start, 2);
  t.deepEqual(text(r, 0), { lost: { o: 0, bytes: 2 }, text: 'cdefghij', at: 2 });
  t.deepEqual(text(r, 2), { lost: undefined, text: 'cdefghij', at: 2 });
  t.deepEqual(text(r, 6), { lost: undefined, text: 'ghij', at: 6 });
  t.deepEqual(text(r, 10), { lost: undefined, text: '', at: undefined });
});

test('a chunk larger than the bound keeps only its tail', (t) => {
  const r = new Ring(4);
  r.append(b('0123456789'));
  t.is(r.start, 6);
  t.deepEqual(text(r, 3), { lost: { o: 3, bytes: 3 }, text: '6789', at: 6 });
  r.append(b('ab'));
  t.deepEqual(text(r, 0), { lost: { o: 0, bytes: 8 }, text: '89ab', at: 8 });
});
