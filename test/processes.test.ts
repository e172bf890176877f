/** Background processes and terminals, against a real node, real NATS and real containers. */
import { BusyError, connect, InvalidRequestError, InvalidStateError, LimitError, NotFoundError } from '../sdk/index.ts';
import type { ProcessOutputEvent } from '../sdk/index.ts';
import { clusterTest } from './helpers/cluster.ts';
import { eventually } from './helpers/wait.ts';

const test = clusterTest();

async function collect(it: AsyncIterable<ProcessOutputEvent>) {
  const events: ProcessOutputEvent[] = [];
  for await (const ev of it) events.push(ev);
  return events;
}

const stdoutOf = (events: ProcessOutputEvent[]) =>
  events
    .filter((e) => e.type === 'stdout')
    .map((e) => (e as { text: string }).text)
    .join('');

test('a background process: listed while it runs, its output read from 0 after it ended, wait gives the exec result', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const p = await sb.processes.start(['sh', '-c', 'for i in 1 2 3; do echo $i; sleep 0.2; done; echo bye >&2'], { tag: 'counter' });
  t.regex(p.id, /^p\d+$/);
  t.true(typeof p.pid === 'number' && p.pid > 1, `pid ${p.pid}`);
  const listed = (await sb.processes.list()).find((x) => x.id === p.id);
  t.is(listed?.tag, 'counter');
  t.deepEqual(listed?.cmd, ['sh', '-c', 'for i in 1 2 3; do echo $i; sleep 0.2; done; echo bye >&2']);
  const r = await p.wait();
  t.is(r.exitCode, 0);
  t.is(r.verdict, 'OK');
  t.false(r.timedOut);
  // Read after the end, from a fresh client that only knows the ids.
  const other = await connect({ servers: t.context.cluster.url });
  t.teardown(() => other.close());
  const again = await (await other.sandboxes.get(sb.id)).processes.get(p.id);
  const events = await collect(again.output({ from: 0 }));
  t.is(stdoutOf(events), '1\n2\n3\n');
  t.is(events.filter((e) => e.type === 'stderr').map((e) => (e as { text: string }).text).join(''), 'bye\n');
  t.like(events.at(-1), { type: 'exit', exitCode: 0, verdict: 'OK' });
  // From an offset: only what follows it.
  t.is(stdoutOf(await collect(again.output({ from: { stdout: 2 } }))), '2\n3\n');
  const info = (await sb.processes.list()).find((x) => x.id === p.id);
  t.like(info, { state: 'exited', exitCode: 0, bytesOut: 6, bytesErr: 4, droppedOut: 0, droppedErr: 0 });
});

test('output streams while the process runs, and stdin stays open for input', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const p = await sb.processes.start(['sh', '-c', 'while read line; do echo "got $line"; done; echo done']);
  const seen: string[] = [];
  const reading = (async () => {
    for await (const ev of p.output()) {
      if (ev.type === 'stdout') seen.push(ev.text);
      if (ev.type === 'exit') return ev;
    }
    return undefined;
  })();
  await p.write('one\n');
  t.truthy(await eventually(async () => seen.join('').includes('got one\n')));
  await p.write('two\n');
  await p.closeStdin();
  const exit = await reading;
  t.like(exit, { type: 'exit', exitCode: 0 });
  t.is(seen.join(''), 'got one\ngot two\ndone\n');
});

test('kill ends a process with verdict KILLED and its signal; SIGTERM reaches it', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const p = await sb.processes.start(['sleep', '1000']);
  await p.kill();
  const r = await p.wait();
  t.is(r.verdict, 'KILLED');
  t.is(r.signal, 'SIGKILL');
  t.is(r.exitCode, 137);
  const trapped = await sb.processes.start(['sh', '-c', "trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.1; done"]);
  t.truthy(await eventually(async () => (await trapped.text()).stdout === 'ready\n'));
  await trapped.kill('SIGTERM');
  const tr = await trapped.wait();
  t.is(tr.exitCode, 7);
  t.is((await trapped.text()).stdout, 'ready\nterm\n');
  // Nothing of them is left in the sandbox.
  const ps = await eventually(async () => {
    const out = (await sb.exec(['ps'])).stdout;
    return /sleep 1000/.test(out) ? undefined : out;
  });
  t.truthy(ps);
});

test('the buffer keeps the newest bytes: a reader who comes late is told how many were dropped', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  // 200,000 bytes into a 4 KiB buffer.
  const p = await sb.processes.start(['sh', '-c', 'yes 0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ | head -c 200000'], { bufferBytes: 4096 });
  await p.wait();
  const events = await collect(p.output({ from: 0 }));
  const gap = events.find((e) => e.type === 'gap');
  t.like(gap, { type: 'gap', stream: 'stdout', offset: 0, bytes: 200_000 - 4096 });
  t.is(stdoutOf(events).length, 4096);
  t.like(events.find((e) => e.type === 'stdout'), { offset: 200_000 - 4096 });
  t.like(await p.refresh(), { bytesOut: 200_000, droppedOut: 200_000 - 4096 });
  const r = await p.wait();
  t.is(r.verdict, 'OK');
});

test('a follower that stops reading holds a bounded queue: what the node dropped meanwhile comes as a gap, and the offsets add up', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  // Faster than anyone reads: the node's output budget (16 MiB/s after a burst) is all that holds it.
  const p = await sb.processes.start(['yes', '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ']);
  t.teardown(() => p.kill().catch(() => {}));
  let next = 0;
  let stalled = false;
  let gap: ProcessOutputEvent | undefined;
  let after = 0;
  for await (const ev of p.output({ from: 0 })) {
    if (ev.type === 'exit') return t.fail('yes ended');
    if (ev.type === 'gap') {
      t.is(ev.offset, next, 'a gap starts where the output taken ends');
      next = ev.offset + ev.bytes;
      // (A gap before the stall is output made before the reader first asked.)
      if (stalled) gap ??= ev;
      continue;
    }
    if (ev.type !== 'stdout') continue;
    t.is(ev.offset, next, 'each chunk starts where the last ended');
    next = ev.offset + ev.data.length;
    if (!stalled) {
      // Not read for 3 s: ~64 MiB arrive, against a queue bound of 8 MiB and a node buffer of 1 MiB.
      stalled = true;
      await new Promise((r) => setTimeout(r, 3000));
    }
    if (gap) after += ev.data.length;
    if (after > 256 * 1024) break;
    // Without a bound the whole backlog is queued here, and no gap ever comes.
    if (next > 48 * 1024 * 1024) break;
  }
  t.truthy(gap, 'the reader fell behind and was told what it missed, instead of holding it all');
  t.true((gap as { bytes: number }).bytes > 8 * 1024 * 1024, `the gap: ${JSON.stringify(gap)}`);
});

const seqText = (n: number) => `${Array.from({ length: n }, (_, i) => i + 1).join('\n')}\n`;
/** Prints `ready`, then waits for /tmp/go (written once the reader is known to follow), then `seq 1 n`. */
const gated = (n: number) => ['sh', '-c', `echo ready; while [ ! -e /tmp/go ]; do sleep 0.05; done; seq 1 ${n}`];

test('a holding reader gets every byte at its own pace: the process waits on its pipe while the reader is a window behind', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const p = await sb.processes.start(gated(400_000));
  t.is(p.info.bufferBytes, 1024 * 1024);
  let text = '';
  let whileStalled: number | undefined;
  for await (const ev of p.output({ hold: true })) {
    if (ev.type === 'gap') return t.fail(`a gap: ${JSON.stringify(ev)}`);
    if (ev.type === 'exit') {
      t.is(ev.exitCode, 0);
      break;
    }
    if (ev.type !== 'stdout') continue;
    text += ev.text;
    if (text === 'ready\n') await sb.files.write('/tmp/go', '');
    else if (whileStalled === undefined && text.length > 100_000) {
      // Not read for 1.5 s: unheld, seq writes all of its 2.7 MB in far less.
      await new Promise((r) => setTimeout(r, 1500));
      whileStalled = (await p.refresh()).bytesOut;
    }
  }
  t.is(text, `ready\n${seqText(400_000)}`, 'every byte, in order, none twice');
  t.true(whileStalled !== undefined && whileStalled < 1.5 * 1024 * 1024, `the process wrote ${whileStalled} bytes while its reader stalled`);
});

test('a holding reader that takes nothing for stallMs is let go with CANCELLED, and the process goes on', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const p = await sb.processes.start(gated(400_000));
  const it = p.output({ hold: true, stallMs: 1000 })[Symbol.asyncIterator]();
  const first = await it.next();
  t.is((first.value as { text?: string }).text, 'ready\n');
  await sb.files.write('/tmp/go', '');
  // Not read for 3 s: the node lets this reader go after one.
  await new Promise((r) => setTimeout(r, 3000));
  const err = await t.throwsAsync(async () => {
    for (;;) if ((await it.next()).done) break;
  });
  t.is((err as { code?: string }).code, 'CANCELLED', String(err));
  t.regex(String(err), /credited nothing/);
  const r = await p.wait();
  t.is(r.exitCode, 0);
  t.is((await p.refresh()).bytesOut, 6 + seqText(400_000).length, 'the process wrote all of its output once the reader was let go');
  // A new holding reader of a new process holds it again (the stall of one reader did not turn holding off).
  const q = await sb.processes.start(gated(400_000));
  let got = '';
  for await (const ev of q.output({ hold: true })) {
    if (ev.type === 'gap') return t.fail('a gap');
    if (ev.type === 'stdout') {
      got += ev.text;
      if (got === 'ready\n') await sb.files.write('/tmp/go', '');
    }
  }
  t.is(got, `ready\n${seqText(400_000)}`);
});

test('bad holding reads are refused with INVALID_REQUEST', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const p = await sb.processes.start(['sleep', '30'], { bufferBytes: 256 * 1024 });
  t.teardown(() => p.kill().catch(() => {}));
  const ask = (body: object) => t.throwsAsync(sb.call('process.output', { id: p.id, out: 0, err: 0, ...body }), { instanceOf: InvalidRequestError });
  t.regex((await ask({ follow: true, readerId: 'r1', window: 256 * 1024 }))?.message ?? '', /half the process's bufferBytes \(131072\)/);
  t.regex((await ask({ follow: false, readerId: 'r1', window: 64 * 1024 }))?.message ?? '', /follows the process and has a readerId/);
  t.regex((await ask({ follow: true, window: 64 * 1024 }))?.message ?? '', /readerId/);
  t.regex((await ask({ follow: true, readerId: 'r1', window: 1000 }))?.message ?? '', /window/);
  t.regex((await ask({ follow: true, readerId: 'r1', window: 64 * 1024, stallMs: 5 }))?.message ?? '', /stallMs/);
  // A credit for no such reader, or one that reaches past what was written, changes nothing.
  await sb.call('process.output.credit', { id: p.id, readerId: 'nobody', out: 1e9, err: 0 });
  t.is((await p.refresh()).state, 'running');
});

test('a sandbox runs at most 64 processes at once: the next is PIDS_LIMIT', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ memoryMiB: 512 });
  t.teardown(() => sb.kill());
  const started = [];
  for (let i = 0; i < 64; i++) started.push(await sb.processes.start(['sleep', '1000']));
  const err = await t.throwsAsync(sb.processes.start(['true']), { instanceOf: LimitError });
  t.is(err?.code, 'PIDS_LIMIT');
  // One ended makes room for another.
  await started[0]?.kill();
  await started[0]?.wait();
  const next = await sb.processes.start(['true']);
  t.is((await next.wait()).exitCode, 0);
});

test('processes survive a pause and a hibernation, and end with their sandbox, verdict KILLED', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  const p = await sb.processes.start(['sh', '-c', 'i=0; while :; do i=$((i+1)); echo $i; sleep 0.05; done']);
  t.truthy(await eventually(async () => (await p.refresh()).bytesOut > 0));
  for (const [sleep, wake] of [
    [() => sb.pause(), () => sb.resume()],
    [() => sb.hibernate(), () => sb.restore()],
  ] as const) {
    await sleep();
    // Listing and reading do not wake it.
    t.is((await p.refresh()).state, 'running');
    t.true((await p.text()).stdout.startsWith('1\n'));
    t.not(sb.info.state, 'running');
    t.not((await sb.refresh()).state, 'running');
    await wake();
    const before = (await p.refresh()).bytesOut;
    t.truthy(await eventually(async () => (await p.refresh()).bytesOut > before));
  }
  const events: ProcessOutputEvent[] = [];
  const reading = (async () => {
    for await (const ev of p.output({ from: 0 })) events.push(ev);
  })();
  t.truthy(await eventually(async () => events.length > 0));
  await sb.kill();
  await reading;
  t.like(events.at(-1), { type: 'exit', verdict: 'KILLED' });
  await t.throwsAsync(sb.processes.list(), { instanceOf: NotFoundError });
});

test('bad input gets stable codes', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  t.is((await t.throwsAsync(sb.processes.start([]), { instanceOf: InvalidRequestError }))?.code, 'INVALID_REQUEST');
  t.is((await t.throwsAsync(sb.processes.start(['']), { instanceOf: InvalidRequestError }))?.detail?.field, 'cmd');
  t.is((await t.throwsAsync(sb.processes.start(['true'], { bufferBytes: 1 }), { instanceOf: InvalidRequestError }))?.detail?.field, 'bufferBytes');
  t.is((await t.throwsAsync(sb.processes.get('p999'), { instanceOf: NotFoundError }))?.code, 'NOT_FOUND');
  t.is((await t.throwsAsync(sb.processes.get('no.such'), { instanceOf: InvalidRequestError }))?.code, 'INVALID_REQUEST');
  const p = await sb.processes.start(['cat']);
  // One input message is at most 1 MiB: the SDK splits, the wire refuses.
  const huge = await t.throwsAsync(sb.call('process.input', { id: p.id, data: new Uint8Array(1024 * 1024 + 1) }), { instanceOf: InvalidRequestError });
  t.is(huge?.code, 'PAYLOAD_TOO_LARGE');
  t.is((await t.throwsAsync(p.kill('SIGNOPE'), { instanceOf: InvalidRequestError }))?.code, 'INVALID_REQUEST');
  t.is((await t.throwsAsync(sb.call('process.resize', { id: p.id, cols: 10, rows: 10 }), { instanceOf: InvalidRequestError }))?.code, 'INVALID_REQUEST');
  await p.closeStdin();
  t.is((await p.wait()).exitCode, 0);
  t.is((await t.throwsAsync(p.write('late'), { instanceOf: InvalidStateError }))?.code, 'INVALID_STATE');
});

test('input a process does not read is held up to about 1 MiB on the node, then refused with BUSY', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const p = await sb.processes.start(['sleep', '1000']);
  const mib = new Uint8Array(1024 * 1024);
  let busy: unknown;
  for (let i = 0; i < 4 && busy === undefined; i++) busy = await p.write(mib).then(() => undefined, (e: unknown) => e);
  t.true(busy instanceof BusyError, String(busy));
  t.is((busy as BusyError).code, 'BUSY');
  t.true((busy as BusyError).retryable);
});

test('a terminal takes a large paste while it prints a lot (neither direction waits on the other)', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const pty = await sb.pty.create({ cmd: ['sh', '-c', 'stty -echo; yes | head -c 300000; head -c 200000 >/dev/null; echo pasted-ok'] });
  let tail = '';
  const reading = (async () => {
    for await (const chunk of pty) tail = (tail + Buffer.from(chunk).toString()).slice(-64);
  })();
  await pty.write(`${'x'.repeat(999)}\n`.repeat(200));
  t.is((await pty.wait()).exitCode, 0);
  await reading;
  t.regex(tail, /pasted-ok/);
});

/** Until what a terminal printed matches `re`. */
function until(seen: { text: string }, re: RegExp): Promise<RegExpMatchArray | null> {
  return eventually(async () => re.exec(seen.text), 30_000);
}

test('a terminal: tty is a /dev/pts path, stty size says rows and cols, resize changes it, typed input echoes', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const pty = await sb.pty.create({ cols: 100, rows: 30 });
  const seen = { text: '' };
  const reading = (async () => {
    for await (const chunk of pty) seen.text += Buffer.from(chunk).toString();
  })();
  await pty.write('tty\r');
  t.truthy(await until(seen, /\/dev\/pts\/\d+/));
  await pty.write('stty size\r');
  t.truthy(await until(seen, /^30 100\r?$/m));
  await pty.resize(120, 40);
  await pty.write('stty size\r');
  t.truthy(await until(seen, /^40 120\r?$/m));
  await pty.write('echo hi\r');
  t.truthy(await until(seen, /echo hi\r\n(.*\r\n)*hi\r\n/));
  t.true((await sb.processes.list()).some((p) => p.id === pty.id && p.pty?.cols === 120));
  await pty.write('exit 3\r');
  const r = await pty.wait();
  t.is(r.exitCode, 3);
  await reading;
});
