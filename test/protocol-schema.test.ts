/** The schema is the one source: the README table and protocol/schema.json are what it generates, and the validators follow it. */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import test from 'ava';
import { Operations, protocolJsonSchema, TABLE_BEGIN, TABLE_END, withProtocolTable } from '../protocol/api.ts';
import { decodeRequest, encode, ErrorCodes, Limits, mayResend, ProtocolError, SandboxVerbs, Schema, subjectTemplate, validateExec, validateSpec } from '../protocol/index.ts';

const root = join(import.meta.dirname, '..');

test('the README protocol table is the generated one (npm run gen:protocol)', (t) => {
  const readme = readFileSync(join(root, 'README.md'), 'utf8');
  t.true(readme.includes(TABLE_BEGIN) && readme.includes(TABLE_END));
  t.is(readme, withProtocolTable(readme));
});

test("the README's subject table names every sandbox verb of the verb table", (t) => {
  const readme = readFileSync(join(root, 'README.md'), 'utf8');
  const row = readme.split('\n').find((l) => l.startsWith('| `pdk.v1.sb.<id>.<verb>`'));
  const listed = /verbs \(`protocol\/verbs\.ts`\): `([^`]*)`/.exec(row ?? '')?.[1]?.split(' ');
  t.deepEqual(listed, [...SandboxVerbs]);
});

test('protocol/schema.json is the generated one (npm run gen:protocol)', (t) => {
  const onDisk = JSON.parse(readFileSync(join(root, 'protocol/schema.json'), 'utf8'));
  t.deepEqual(onDisk, JSON.parse(JSON.stringify(protocolJsonSchema())));
});

test('the JSON Schema marks bytes, carries limits and defaults, and names every operation’s messages', (t) => {
  const doc = protocolJsonSchema();
  const exec = doc.$defs.ExecRequest;
  t.deepEqual(exec.properties.stdin, { description: 'standard input', 'x-error-code': 'PAYLOAD_TOO_LARGE', type: 'string', contentEncoding: 'base64', 'x-bytes': true, 'x-max-bytes': Limits.exec.stdinMax });
  t.deepEqual(exec.required, ['cmd']);
  t.is(exec.properties.timeoutMs.default, Limits.exec.timeoutMs.default);
  t.is(doc.$defs.SandboxSpec.properties.memoryMiB.maximum, Limits.memoryMiB.max);
  t.is(doc.$defs.SandboxSpec.required, undefined, 'every spec field has a default or is optional');
  t.is(doc.$defs.CreateReply.properties.sandbox.$ref, '#/$defs/SandboxInfo');
  t.true(doc.$defs.FilesWriteRequest.properties.data['x-bytes']);
  for (const op of Operations) {
    t.truthy(doc.$defs[op.request], `${op.subject} request ${op.request}`);
    t.truthy(doc.$defs[op.reply], `${op.subject} reply ${op.reply}`);
    for (const e of op.errors) t.true(Object.hasOwn(ErrorCodes, e), `${op.subject}: ${e}`);
  }
  t.deepEqual(Object.keys(doc['x-error-codes']), Object.keys(ErrorCodes));
});

test('only a MessagePack map is a request: 0xC1, arrays, scalars and nil are INVALID_REQUEST', (t) => {
  for (const bad of [new Uint8Array([0xc1]), encode([1, 2]), encode(7), encode('x'), encode(null), encode(true), encode(new Uint8Array(3))]) {
    const err = t.throws(() => decodeRequest(bad), { instanceOf: ProtocolError });
    t.is(err?.code, 'INVALID_REQUEST');
  }
  t.deepEqual(decodeRequest(new Uint8Array(0)), {});
  t.deepEqual(decodeRequest(encode({ a: 1 })), { a: 1 });
});

test('validators follow the schema: defaults filled, nil is absent, the first bad field named with a stable code', (t) => {
  t.deepEqual(validateExec({ cmd: ['ls'], cwd: null }, { maxOutputBytes: 99 }), { cmd: ['ls'], timeoutMs: Limits.exec.timeoutMs.default, maxOutputBytes: 99 });
  const spec = t.throws(() => validateSpec({ memoryMiB: 1e9 }), { instanceOf: ProtocolError });
  t.is(spec?.code, 'INVALID_SPEC');
  t.is(spec?.message, `memoryMiB: must be between ${Limits.memoryMiB.min} and ${Limits.memoryMiB.max}, got 1000000000`);
  t.deepEqual(spec?.detail, { field: 'memoryMiB' });
  t.is(t.throws(() => validateExec({ cmd: ['cat'], stdin: 'text' }, { maxOutputBytes: 1 }))?.message, 'stdin: must be bytes');
  t.is((t.throws(() => validateExec({ cmd: ['cat'], stdin: new Uint8Array(Limits.exec.stdinMax + 1) }, { maxOutputBytes: 1 })) as ProtocolError).code, 'PAYLOAD_TOO_LARGE');
  // The spec's own input does not change: a copy is checked and filled.
  const input = { cpu: 2 };
  validateSpec(input);
  t.deepEqual(input, { cpu: 2 });
  t.is(Schema.SandboxSpec.properties.cpu.default, Limits.cpu.default);
});

test('the calls a client sends again after a dropped connection are the ones the table says are safe to repeat', (t) => {
  const concrete = (s: string) => (s.split(' ')[0] as string).replace('<id>', 'sb-x').replace('<group>', 'g').replace('<verb>', 'pause').replace('<node>', 'n1');
  for (const o of Operations) {
    const op = subjectTemplate(concrete(o.subject)).op;
    if (o.retry.startsWith('safe to retry') || o.subject === 'pdk.v1.place.create') t.true(mayResend(op), `${o.subject} (${op}) is safe to repeat`);
    const unsafe = ['pdk.v1.sb.<id>.pause | hibernate', 'pdk.v1.sb.<id>.resume | restore', 'pdk.v1.sb.<id>.files.write', 'pdk.v1.rollouts.start'];
    if (o.retry.startsWith('not idempotent') || unsafe.includes(o.subject)) t.false(mayResend(op), `${o.subject} (${op}) is not`);
  }
});
