/** The node's side of a streamed exec, as pure logic: what it sends, in what order, and what resume sends again. */
import { setImmediate as turn } from 'node:timers/promises';
import test from 'ava';
import { ExecStream, STREAM_BUFFER_BYTES, STREAM_CHUNK_BYTES } from '../actors/exec-stream.ts';
import { decode, type ExecEvent } from '../protocol/index.ts';

const b = (s: string) => Buffer.from(s);
const text = (ev: ExecEvent) => ('d' in ev ? Buffer.from(ev.d).toString() : `<${ev.t}>`);

test('output read in one turn goes out as one event; another stream, the exit and resume send what waits first', async (t) => {
  const sent: ExecEvent[] = [];
  const s = new ExecStream((ev) => sent.push(ev));
  s.output('out', b('a'));
  s.output('out', b('b'));
  t.is(sent.length, 0, 'nothing before the turn ends');
  await turn();
  t.deepEqual(sent.map(text), ['ab']);
  s.output('out', b('c'));
  s.output('err', b('E'));
  s.output('out', b('d'));
  s.emit({ t: 'exit', exitCode: 0, durationMs: 1, truncated: false, timedOut: false, verdict: 'OK' });
  t.deepEqual(sent.map(text), ['ab', 'c', 'E', 'd', '<exit>']);
  t.deepEqual(
    sent.map((e) => e.s),
    [0, 1, 2, 3, 4],
  );
  t.true(s.done);
  await turn();
  t.is(sent.length, 5, 'the queued turn finds nothing left to send');
  sent.length = 0;
  t.like(s.resume(3), { resent: 2, next: 5, done: true });
  t.deepEqual(sent.map(text), ['d', '<exit>']);
  sent.length = 0;
  s.output('out', b(''));
  await turn();
  t.is(sent.length, 0, 'empty output sends nothing');
});

test('a full chunk goes at once; what resume asks for includes output not yet sent', async (t) => {
  const sent: ExecEvent[] = [];
  const s = new ExecStream((ev) => sent.push(ev));
  s.output('out', Buffer.alloc(STREAM_CHUNK_BYTES - 1, 120));
  t.is(sent.length, 0);
  s.output('out', b('y'));
  t.is(sent.length, 1, 'sent when it reached a chunk');
  t.is((sent[0] as { d: Uint8Array }).d.length, STREAM_CHUNK_BYTES);
  s.output('out', b('z'));
  sent.length = 0;
  t.like(s.resume(1), { resent: 1, next: 2, done: false });
  t.deepEqual(sent.map(text), ['z']);
});

test('what the buffer no longer holds comes back as one gap, counted in events and bytes', async (t) => {
  const sent: ExecEvent[] = [];
  const s = new ExecStream((ev) => sent.push(ev), 8);
  for (const c of ['1234', '5678', 'abcd']) {
    s.output('out', b(c));
    await turn();
  }
  sent.length = 0;
  s.resume(0, 0);
  t.deepEqual(sent[0], { t: 'gap', s: 0, n: 1, bytes: 4 });
  t.deepEqual(sent.slice(1).map(text), ['5678', 'abcd']);
});

test('with a window, output past the last credit holds the command; a credit, a resume or the end opens it; without one nothing is held', async (t) => {
  const s = new ExecStream(() => {}, STREAM_BUFFER_BYTES, 100);
  s.output('out', Buffer.alloc(60));
  await turn();
  t.false(s.held());
  s.output('out', Buffer.alloc(60));
  t.true(s.held(), 'output not sent yet counts');
  let opened = 0;
  s.whenOpen(() => opened++);
  s.credit(10);
  t.true(s.held());
  t.is(opened, 0);
  s.credit(60);
  t.false(s.held());
  t.is(opened, 1, 'opened once');
  await turn();
  s.output('out', Buffer.alloc(100));
  t.true(s.held());
  s.credit(1_000_000);
  t.true(s.held(), 'a credit counts no more than was sent: 120 sent, 100 waiting to go');
  await turn();
  s.whenOpen(() => opened++);
  s.resume(0, 220);
  t.is(opened, 2, "a resume's offset is a credit");
  s.output('err', Buffer.alloc(500));
  s.whenOpen(() => opened++);
  s.emit({ t: 'exit', exitCode: 0, durationMs: 1, truncated: false, timedOut: false, verdict: 'OK' });
  t.is(opened, 3, 'the exit opens it');
  t.false(s.held());
  const free = new ExecStream(() => {});
  free.output('out', Buffer.alloc(10_000_000));
  t.false(free.held());
  let now = false;
  free.whenOpen(() => {
    now = true;
  });
  t.true(now);
});

test('output goes out as MessagePack any decoder reads, written once: the event sent is a view of it; resume sends the same bytes', async (t) => {
  const sent: Array<{ ev: ExecEvent; wire?: Uint8Array }> = [];
  const s = new ExecStream((ev, wire) => sent.push({ ev, ...(wire ? { wire } : {}) }));
  s.output('err', b('ab'));
  s.output('err', b('cd'));
  await turn();
  s.output('out', Buffer.alloc(STREAM_CHUNK_BYTES, 121));
  s.emit({ t: 'exit', exitCode: 0, durationMs: 1, truncated: false, timedOut: false, verdict: 'OK' });
  t.is(sent.length, 3);
  const [first, chunk, exit] = sent as [{ ev: ExecEvent; wire: Uint8Array }, { ev: ExecEvent; wire: Uint8Array }, { ev: ExecEvent; wire?: Uint8Array }];
  t.deepEqual(decode(first.wire), { t: 'err', s: 0, d: Buffer.from('abcd') });
  t.is((first.ev as { d: Uint8Array }).d.buffer, first.wire.buffer, 'the output is not copied again');
  const d = (decode(chunk.wire) as { d: Uint8Array }).d;
  t.like(decode(chunk.wire), { t: 'out', s: 1 });
  t.true(d.length === STREAM_CHUNK_BYTES && d.every((c) => c === 121));
  t.is(exit.wire, undefined, 'other events are encoded by the sender');
  sent.length = 0;
  s.resume(0);
  t.deepEqual(
    sent.map((x) => x.wire),
    [first.wire, chunk.wire, undefined],
  );
});
