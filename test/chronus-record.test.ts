/** The command log's record format and request digests, alone (no NATS). */
import test from 'ava';
import { parseStepSubject } from '../chronus/log.ts';
import { decodeRecord, describeExec, encodeRecord, RECORD_VERSION, requestDigest, type ResultRecord, sameRequest, type StartedRecord, type StepRecord } from '../chronus/record.ts';
import { encode, ProtocolError, subjects, validateExec, validateStep } from '../protocol/index.ts';

const enc = (s: string) => new TextEncoder().encode(s);

test('request digests are pinned: a change to them breaks every recorded rollout', (t) => {
  // If this fails, do not update the constants: add a new digest algorithm (d2) instead.
  t.is(requestDigest('exec', { cmd: ['/bin/sh', '-c', 'echo hi'], cwd: '/tmp', env: { B: '2', A: '1' }, stdin: enc('x') }), 'd1:9c60c48cb173cc2543bce0ac8c95576e24acc6fa7c9cadcbca588aad3c803117');
  t.is(requestDigest('write', { path: '/a', data: enc('hello'), mode: 420 }), 'd1:b53875a011e08dbd339426e73590683e210c6cb9dbe0f695d6ed68d1dc254a1b');
});

test('request equality: what a step does, not how it is limited; absent is empty', (t) => {
  const d = (r: Parameters<typeof requestDigest>[1]) => requestDigest('exec', r);
  const base = d({ cmd: ['ls'] });
  t.is(d({ cmd: ['ls'], env: {} }), base);
  t.is(d({ cmd: ['ls'], stdin: new Uint8Array(0) }), base);
  t.is(d({ cmd: ['ls'], timeoutMs: 5, maxOutputBytes: 9 } as Parameters<typeof requestDigest>[1]), base);
  t.is(d({ cmd: ['ls'], env: { A: '1', B: '2' } }), d({ cmd: ['ls'], env: { B: '2', A: '1' } }));
  for (const other of [{ cmd: ['ls', '-l'] }, { cmd: ['ls'], cwd: '/' }, { cmd: ['ls'], env: { A: '' } }, { cmd: ['ls'], stdin: enc('\n') }, { cmd: ['l', 's'] }]) t.not(d(other), base, JSON.stringify(other));
  const w = requestDigest('write', { path: '/a', data: enc('x') });
  t.not(requestDigest('write', { path: '/a', data: enc('x'), offset: 0 }), w);
  t.not(requestDigest('write', { path: '/a', data: enc('x'), mode: 0o644 }), w);
  t.not(requestDigest('write', { path: '/b', data: enc('x') }), w);
  t.not(requestDigest('exec', { cmd: ['/a'] }), requestDigest('write', { path: '/a' }));
  t.throws(() => requestDigest('exec', { cmd: ['ls'] }, 'd9:abc'), { instanceOf: ProtocolError, message: /digest 'd9'.*upgrade/ });
});

const started: StartedRecord = {
  v: 1,
  kind: 'started',
  op: 'exec',
  rolloutId: 'r1',
  step: 3,
  digest: requestDigest('exec', { cmd: ['true'] }),
  what: describeExec(['true']),
  sandbox: 'sb-x',
  node: 'n1',
  boot: 'b',
  claim: 'b-1',
  startedAt: 1,
  deadline: 2,
  request: { cmd: ['true'], timeoutMs: 1000, maxOutputBytes: 10 },
};

test('records round-trip; the decoder refuses what it does not understand', (t) => {
  t.deepEqual(decodeRecord(encodeRecord(started)), started);
  t.true(sameRequest(started, 'exec', { cmd: ['true'] }));
  t.false(sameRequest(started, 'write', { path: 'true' }));
  t.false(sameRequest(started, 'exec', { cmd: ['false'] }));
  t.throws(() => decodeRecord(encode({ ...started, v: RECORD_VERSION + 1 })), { instanceOf: ProtocolError, message: /version 2 is newer than this Paddock understands/ });
  t.throws(() => decodeRecord(encode({ ...started, v: 0 })), { message: /unknown version/ });
  t.throws(() => decodeRecord(encode({ ...started, kind: 'finished' })), { message: /unknown kind/ });
  t.throws(() => decodeRecord(encode({ ...started, request: undefined })), { message: /without its request/ });
  t.throws(() => decodeRecord(encode([1, 2])), { message: /not a map/ });
  t.throws(() => decodeRecord(new Uint8Array([0xc1])), { instanceOf: ProtocolError });
});

test('a result recorded before exec verdicts existed decodes with the verdict its flags imply', (t) => {
  const result = (flags: { truncated: boolean; timedOut: boolean }) =>
    ({ ...started, kind: 'result', endedAt: 2, outcome: { ok: true, result: { exitCode: 0, stdout: enc(''), stderr: enc(''), durationMs: 1, ...flags } } }) as unknown as ResultRecord;
  const verdict = (r: StepRecord) => (r.kind === 'result' && r.outcome.ok ? (r.outcome.result as { verdict?: string }).verdict : undefined);
  t.is(verdict(decodeRecord(encodeRecord(result({ truncated: false, timedOut: false })))), 'OK');
  t.is(verdict(decodeRecord(encodeRecord(result({ truncated: true, timedOut: false })))), 'OUTPUT_LIMIT');
  t.is(verdict(decodeRecord(encodeRecord(result({ truncated: false, timedOut: true })))), 'TIMEOUT');
});

test('step fields: both or neither, a token and an integer from 0; a step may be streamed', (t) => {
  t.is(validateStep({}), undefined);
  t.deepEqual(validateStep({ rolloutId: 'ro-1', step: 0 }), { rolloutId: 'ro-1', step: 0 });
  for (const bad of [{ rolloutId: 'r' }, { step: 1 }, { rolloutId: 'r.1', step: 1 }, { rolloutId: 'r', step: -1 }, { rolloutId: 'r', step: 2 ** 60 }, { rolloutId: 'r', step: null }]) {
    t.throws(() => validateStep(bad), { instanceOf: ProtocolError }, JSON.stringify(bad));
  }
  t.like(validateExec({ cmd: ['true'], rolloutId: 'r', step: 2 }, { maxOutputBytes: 1 }), { rolloutId: 'r', step: 2 });
  t.like(validateExec({ cmd: ['true'], rolloutId: 'r', step: 2, stream: true }, { maxOutputBytes: 1 }), { rolloutId: 'r', step: 2, stream: true });
});

test('step subjects parse back; commands describe themselves', (t) => {
  t.deepEqual(parseStepSubject(subjects.chronusStep('ro-a_b', 12)), { rolloutId: 'ro-a_b', step: 12 });
  t.is(parseStepSubject('pdk.v1.chronus.r.x'), null);
  t.is(parseStepSubject('pdk.v1.sb.r.1'), null);
  t.is(describeExec(['sh', '-c', "echo 'hi' > /tmp/x"]), `exec sh -c 'echo '\\''hi'\\'' > /tmp/x'`);
  t.is(describeExec(['x'.repeat(500)]).length, 200);
});
