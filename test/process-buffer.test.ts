/**
 * The node's buffer of a background process's output: the newest bytes, by offset, with what was
 * dropped; and what its followers are sent: the output of one turn as one event.
 */
import test from 'ava';
import { STREAM_CHUNK_BYTES } from '../actors/exec-stream.ts';
import { Ring, TrackedProcess } from '../actors/processes.ts';
import type { ProcessEvent } from '../protocol/index.ts';

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

const turn = () => new Promise((r) => setImmediate(r));

test('followers get the output read in one turn as one event, at the offset of its first byte', async (t) => {
  const p = new TrackedProcess('p1', ['x'], 1 << 20, {});
  const got: ProcessEvent[] = [];
  p.read({ out: 0, err: 0, follow: true, readerId: 'a' }, (ev) => void got.push(ev));
  p.output('out', b('ab'));
  p.output('out', b('cd'));
  p.output('out', b('ef'));
  t.is(got.length, 0, 'held until the turn ends');
  await turn();
  t.deepEqual(got, [{ t: 'out', d: b('abcdef'), o: 0 }]);
  // A change of stream ends the batch: the order of stdout and stderr is kept.
  p.output('out', b('g'));
  p.output('err', b('E'));
  p.output('out', b('h'));
  await turn();
  t.deepEqual(got.slice(1), [
    { t: 'out', d: b('g'), o: 6 },
    { t: 'err', d: b('E'), o: 0 },
    { t: 'out', d: b('h'), o: 7 },
  ]);
  // A full chunk goes at once.
  got.length = 0;
  p.output('out', Buffer.alloc(STREAM_CHUNK_BYTES, 1));
  t.is(got.length, 1);
  t.is((got[0] as { o: number }).o, 8);
});

test('a reader that joins mid-turn gets each byte once; the exit comes after the last output', async (t) => {
  const p = new TrackedProcess('p1', ['x'], 1 << 20, {});
  const first: ProcessEvent[] = [];
  const second: ProcessEvent[] = [];
  p.read({ out: 0, err: 0, follow: true, readerId: 'a' }, (ev) => void first.push(ev));
  p.output('out', b('abc'));
  p.read({ out: 0, err: 0, follow: true, readerId: 'b' }, (ev) => void second.push(ev));
  p.output('out', b('de'));
  p.ended({ exitCode: 0, durationMs: 1, truncated: false, timedOut: false, stdout: '', stderr: '' } as never);
  const bytes = (evs: ProcessEvent[]) => Buffer.concat(evs.flatMap((e) => (e.t === 'out' ? [e.d as Buffer] : []))).toString();
  t.is(bytes(first), 'abcde');
  t.is(bytes(second), 'abcde');
  t.is(first.at(-1)?.t, 'exit');
  t.is(second.at(-1)?.t, 'exit');
  await turn();
  t.is(first.filter((e) => e.t === 'out').length, 2);
});
