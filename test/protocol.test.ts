import { connect, type NatsConnection } from '@nats-io/transport-node';
import { decode, encode, type Reply, subjects, validateSpec } from '../protocol/index.ts';
import { InvalidSpecError, Paddock } from '../sdk/index.ts';
import { clusterTest } from './helpers/cluster.ts';

const test = clusterTest();

async function raw(nc: NatsConnection, subject: string, data: Uint8Array): Promise<Reply<unknown>> {
  const m = await nc.request(subject, data, { timeout: 10_000 });
  return decode(m.data) as Reply<unknown>;
}

function codeOf(r: Reply<unknown>): string | undefined {
  return r.ok ? undefined : r.error.code;
}

/** Nothing half-created: no live sandbox in the directory, and the node's own count is zero. */
async function assertNoSandboxes(t: import('ava').ExecutionContext<unknown>, nc: NatsConnection, node: string) {
  const info = (await raw(nc, subjects.node(node, 'info'), encode({}))) as Reply<{ sandboxes: number; ids: string[] }>;
  t.true(info.ok);
  if (info.ok) t.deepEqual(info.result.ids, []);
}

test.serial('bad specs are refused with INVALID_SPEC and nothing is created', async (t) => {
  const { pdk, cluster } = t.context;
  const cases: Array<[string, Record<string, unknown>]> = [
    ['negative memory', { memoryMiB: -1 }],
    ['memory not an integer', { memoryMiB: 12.5 }],
    ['absurd memory', { memoryMiB: 1e12 }],
    ['absurd cpu', { cpu: 10_000 }],
    ['cpu NaN-ish', { cpu: 'lots' }],
    ['zero pids', { pidsLimit: 0 }],
    ['ttl too long', { ttlSec: 1e9 }],
    ['unknown backend', { backend: 'mainframe' }],
    ['unknown image', { image: 'no-such-image' }],
    ['malformed image', { image: '../../etc' }],
    ['unknown field', { gpus: 8 }],
    ['label not a string', { labels: { a: 1 } }],
    ['bad env key', { env: { 'A=B': 'x' } }],
    ['relative cwd', { cwd: 'work' }],
    ['group with a dot', { group: 'a.b' }],
  ];
  for (const [name, spec] of cases) {
    const err = await t.throwsAsync(pdk.sandboxes.create(spec as never), { instanceOf: InvalidSpecError }, name);
    t.is(err?.code, 'INVALID_SPEC', name);
    t.false(err?.retryable, name);
  }
  // A backend Paddock knows but no node runs yet is refused by placement, not by a crash.
  await t.throwsAsync(pdk.sandboxes.create({ backend: 'microvm' }), { instanceOf: InvalidSpecError });
  const nc = Paddock.connectionOf(pdk);
  await assertNoSandboxes(t, nc, cluster.nodes[0]!.id);
});

test.serial('malformed, oversize and unknown-verb messages get error replies; the node keeps serving', async (t) => {
  const { pdk, cluster } = t.context;
  const nc = await connect({ servers: cluster.url });
  t.teardown(() => nc.close());
  // Not MessagePack at all.
  t.is(codeOf(await raw(nc, subjects.placeCreate, new Uint8Array([0xc1, 0xff, 0x00]))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.placeCreate, new TextEncoder().encode('{"spec":{}}'))), 'INVALID_REQUEST');
  // Well-formed but the wrong shape.
  t.is(codeOf(await raw(nc, subjects.placeCreate, encode([1, 2, 3]))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.placeCreate, encode({ spec: 'busybox' }))), 'INVALID_SPEC');
  t.is(codeOf(await raw(nc, subjects.placeCreate, encode({ spec: {}, id: 'bad.id' }))), 'INVALID_REQUEST');
  // Oversize: above the create limit, under NATS's max payload.
  t.is(codeOf(await raw(nc, subjects.placeCreate, encode({ spec: { env: { BIG: 'x'.repeat(1024 * 1024) } } }))), 'PAYLOAD_TOO_LARGE');
  t.is(codeOf(await raw(nc, subjects.placeCreate, encode({ spec: { env: { BIG: 'x'.repeat(200 * 1024) } } }))), 'INVALID_SPEC');

  const sb = await pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  t.is(codeOf(await raw(nc, `pdk.v1.sb.${sb.id}.launch-missiles`, encode({}))), 'UNKNOWN_VERB');
  t.is(codeOf(await raw(nc, subjects.sandbox(sb.id, 'exec'), encode({ cmd: [] }))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.sandbox(sb.id, 'exec'), encode({ cmd: 'ls' }))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.sandbox(sb.id, 'exec'), encode({ cmd: ['ls', 7] }))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.sandbox(sb.id, 'exec'), encode({ cmd: ['ls'], timeoutMs: -5 }))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.sandbox(sb.id, 'exec'), encode({ cmd: ['ls'], maxOutputBytes: 64 * 1024 * 1024 }))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.sandbox(sb.id, 'exec'), encode({ cmd: ['cat'], stdin: new Uint8Array(5 * 1024 * 1024) }))), 'PAYLOAD_TOO_LARGE');
  t.is(codeOf(await raw(nc, subjects.sandbox(sb.id, 'files.read'), encode({ path: 'relative' }))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.sandbox(sb.id, 'files.read'), encode({ path: '/etc/passwd', offset: -1 }))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.sandbox(sb.id, 'files.write'), encode({ path: '/x', data: 'not bytes' }))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.sandbox(sb.id, 'files.write'), encode({ path: '/x', data: new Uint8Array(5 * 1024 * 1024) }))), 'PAYLOAD_TOO_LARGE');
  t.is(codeOf(await raw(nc, subjects.sandbox(sb.id, 'exec'), new Uint8Array([0xc1]))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.sandbox(sb.id, 'exec'), encode({ cmd: ['cat'], stdin: new Uint8Array(7 * 1024 * 1024) }))), 'PAYLOAD_TOO_LARGE');
  // After all that, the sandbox and the node still serve.
  t.is((await sb.exec(['echo', 'still here'])).stdout, 'still here\n');
  const other = await pdk.sandboxes.create({});
  await other.kill();
});

test('validateSpec fills defaults', (t) => {
  const s = validateSpec({});
  t.deepEqual(s, { backend: 'container', image: 'busybox', cpu: 1, memoryMiB: 256, pidsLimit: 1024, ttlSec: 3600, labels: {}, env: {}, idleAction: 'pause', qos: 'ls', autoResume: true });
});
