/** The gateway's Server-Sent Events, as pure logic: what an output chunk becomes wherever a stream is cut, and what a slow reader's backlog keeps. */
import test from 'ava';
import { Backlog, type JsonLiteral, JsonText } from '../ops/gateway/sse.ts';

const read = (l: JsonLiteral | undefined) => (l ? (JSON.parse(Buffer.from(l.json, l.encoding).toString('utf8')) as string) : '');

test('text cut anywhere, into three chunks, reads back whole: characters split between chunks are held back, JSON escapes kept', (t) => {
  const s = 'héllo wörld ✓ 𝄞 "q" \\ \t\n\r\u0001\u007f end';
  const b = Buffer.from(s);
  let cuts = 0;
  for (let i = 0; i <= b.length; i++) {
    for (let j = i; j <= b.length; j++) {
      const jt = new JsonText();
      const out = [b.subarray(0, i), b.subarray(i, j), b.subarray(j)].map((part) => read(jt.next(part))).join('') + read(jt.end());
      if (out !== s) return t.fail(`cut at ${i} and ${j}: ${JSON.stringify(out)}`);
      cuts++;
    }
  }
  t.is(cuts, ((b.length + 1) * (b.length + 2)) / 2);
});

test('valid UTF-8 goes out as latin1 of the same bytes; invalid bytes read as TextDecoder reads them, and a cut-off last character ends as U+FFFD', (t) => {
  const jt = new JsonText();
  const ok = jt.next(Buffer.from('a "b"\n✓'));
  t.is(ok.encoding, 'latin1');
  t.deepEqual(Buffer.from(ok.json, 'latin1'), Buffer.from(JSON.stringify('a "b"\n✓')));
  const bad = Buffer.from([0x61, 0xff, 0xc3, 0x62]);
  const l = jt.next(bad);
  t.is(l.encoding, 'utf8');
  t.is(read(l), new TextDecoder().decode(bad));
  t.is(read(jt.next(Buffer.from([0x63, 0xe2, 0x82]))), 'c', 'the start of ✓ is held');
  t.is(read(jt.end()), '\ufffd');
  t.is(jt.end(), undefined, 'nothing is held twice');
  t.is(read(jt.next(new Uint8Array(0))), '');
});

test('a backlog keeps at most its bound for a reader that does not take: the rest is one count per run, in its place', async (t) => {
  const b = new Backlog<number>(3);
  for (let i = 1; i <= 10; i++) b.push(i);
  const taken = [await b.take(), await b.take()];
  t.deepEqual(taken, [{ item: 1 }, { item: 2 }]);
  // Room for two again: 11 and 12 are kept, after the count of what was dropped before them.
  b.push(11);
  b.push(12);
  b.push(13);
  const rest = [];
  for (let i = 0; i < 5; i++) rest.push(await b.take());
  t.deepEqual(rest, [{ item: 3 }, { dropped: 7 }, { item: 11 }, { item: 12 }, { dropped: 1 }]);
  // A reader waiting is woken by the next push, and by close.
  const waiting = b.take();
  b.push(14);
  t.deepEqual(await waiting, { item: 14 });
  const ended = b.take();
  b.close();
  t.is(await ended, undefined);
  b.push(15);
  t.is(await b.take(), undefined, 'nothing is kept once closed');
});
