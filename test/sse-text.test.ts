/** The gateway's output text for Server-Sent Events, as pure logic: what a chunk becomes, wherever a stream is cut. */
import test from 'ava';
import { type JsonLiteral, JsonText } from '../ops/gateway/sse.ts';

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
