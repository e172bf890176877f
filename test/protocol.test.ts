import { connect, type NatsConnection } from '@nats-io/transport-node';
import type { TSchema } from '@sinclair/typebox';
import { TypeCompiler } from '@sinclair/typebox/compiler';
import { decode, encode, NodeVerbs, type Reply, SandboxVerbs, Schema, subjects, validateSpec } from '../protocol/index.ts';
import { connectionOf } from '../sdk/client.ts';
import { CancelledError, InvalidSpecError, NotFoundError, type Sandbox } from '../sdk/index.ts';
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
  const nc = connectionOf(pdk);
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

  // The probe of creates in flight: every replica answers a bad one; a good one about ids no
  // replica holds gets silence (each answers only for what it holds).
  t.is(codeOf(await raw(nc, subjects.placePending, new Uint8Array([0xc1, 0xff]))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.placePending, encode({ ids: [] }))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.placePending, encode({ ids: 'sb-x' }))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.placePending, encode({ ids: ['bad.id'] }))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.placePending, encode({ ids: Array.from({ length: 1001 }, (_, i) => `sb-${i}`) }))), 'INVALID_REQUEST');
  await t.throwsAsync(nc.request(subjects.placePending, encode({ ids: ['sb-nobody-holds-this'] }), { timeout: 1000 }), { message: /timeout/i });

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

test.serial('a payload that is not a MessagePack map is INVALID_REQUEST on every subject, and does nothing', async (t) => {
  const { pdk, cluster } = t.context;
  const nc = await connect({ servers: cluster.url });
  t.teardown(() => nc.close());
  const sb = await pdk.sandboxes.create({ group: 'c1-job' });
  t.teardown(() => sb.kill());
  const node = cluster.nodes[0]?.id as string;
  const subjectsToTry = [
    subjects.placeCreate,
    subjects.sandboxesList,
    subjects.sandboxesGet,
    ...(['start', 'attach', 'get', 'steps', 'export', 'delete'] as const).map((v) => subjects.rollouts(v)),
    subjects.group('c1-job', 'kill'),
    subjects.snapshotsList,
    subjects.snapshotsDelete,
    subjects.nodeList,
    subjects.fnInvoke,
    ...NodeVerbs.map((v) => subjects.node(node, v)),
    ...SandboxVerbs.map((v) => subjects.sandbox(sb.id, v)),
  ];
  for (const subject of subjectsToTry) {
    for (const payload of [new Uint8Array([0xc1]), encode([1]), encode(42), encode('spec')]) {
      t.is(codeOf(await raw(nc, subject, payload)), 'INVALID_REQUEST', `${subject} ${payload[0]?.toString(16)}`);
    }
  }
  // Nothing was created, killed, paused or drained by any of it.
  t.is((await sb.refresh()).state, 'running');
  t.is((await pdk.sandboxes.list({ group: 'c1-job' })).length, 1);
  t.is((await pdk.nodes.info(node)).state, 'serving');
});

test.serial('the node verbs answer what the schema says they answer', async (t) => {
  const { cluster } = t.context;
  const nc = await connect({ servers: cluster.url });
  t.teardown(() => nc.close());
  const node = cluster.nodes[0]?.id as string;
  const conforms = (schema: TSchema, r: Reply<unknown>, what: string) => {
    t.true(r.ok, what);
    if (!r.ok) return;
    const c = TypeCompiler.Compile(schema);
    t.true(c.Check(r.result), `${what}: ${[...c.Errors(r.result)].map((e) => `${e.path} ${e.message}`).join('; ')}`);
  };
  conforms(Schema.NodesListReply, await raw(nc, subjects.nodeList, encode({})), 'nodes.list');
  conforms(Schema.NodesListReply, await raw(nc, subjects.nodeList, encode({ state: 'serving', backend: 'container' })), 'nodes.list filtered');
  conforms(Schema.NodeInfoReply, await raw(nc, subjects.node(node, 'info'), encode({})), 'node.info');
  t.is(codeOf(await raw(nc, subjects.nodeList, encode({ state: 'asleep' }))), 'INVALID_REQUEST');
  t.is(codeOf(await raw(nc, subjects.nodeList, encode({ backend: 'mainframe' }))), 'INVALID_REQUEST');
  const drained = await raw(nc, subjects.node(node, 'drain'), encode({}));
  const undrained = await raw(nc, subjects.node(node, 'undrain'), encode({}));
  conforms(Schema.NodeRecord, drained, 'node.drain');
  conforms(Schema.NodeRecord, undrained, 'node.undrain');
  t.is((drained as { result?: { state?: string } }).result?.state, 'draining');
  t.is((undrained as { result?: { state?: string } }).result?.state, 'serving');
});

test.serial('an unknown sandbox: its subjects have no responders, sandboxes.get says NOT_FOUND, the SDK throws NotFoundError', async (t) => {
  const { pdk, cluster } = t.context;
  const nc = await connect({ servers: cluster.url });
  t.teardown(() => nc.close());
  const id = 'sb-doesnotexist0000';
  const err = await t.throwsAsync(nc.request(subjects.sandbox(id, 'exec'), encode({ cmd: ['true'] }), { timeout: 5000 }));
  t.regex(String(err?.message), /no responders|503/i);
  const r = await raw(nc, subjects.sandboxesGet, encode({ id }));
  t.is(codeOf(r), 'NOT_FOUND');
  await t.throwsAsync(pdk.sandboxes.get(id), { instanceOf: NotFoundError });
  // An ended sandbox: the directory still tells how it ended.
  const sb = await pdk.sandboxes.create({});
  await sb.kill();
  const ended = (await raw(nc, subjects.sandboxesGet, encode({ id: sb.id }))) as Reply<{ state: string }>;
  t.true(ended.ok);
  if (ended.ok) t.is(ended.result.state, 'stopped');
});

test.serial('sandboxes.list over raw NATS: filters by label, group, state and node, in pages', async (t) => {
  const { pdk, cluster } = t.context;
  const nc = await connect({ servers: cluster.url });
  t.teardown(() => nc.close());
  const job = `list-${Date.now().toString(36)}`;
  const made: Sandbox[] = [];
  for (let i = 0; i < 3; i++) made.push(await pdk.sandboxes.create({ labels: { job }, group: job }));
  t.teardown(() => Promise.all(made.map((s) => s.kill())));
  const page1 = (await raw(nc, subjects.sandboxesList, encode({ labels: { job }, limit: 2 }))) as Reply<{ sandboxes: Array<{ id: string }>; next?: string }>;
  if (!page1.ok) return t.fail(page1.error.message);
  t.is(page1.result.sandboxes.length, 2);
  t.truthy(page1.result.next);
  const page2 = (await raw(nc, subjects.sandboxesList, encode({ labels: { job }, limit: 2, cursor: page1.result.next }))) as Reply<{ sandboxes: Array<{ id: string }>; next?: string }>;
  if (!page2.ok) return t.fail(page2.error.message);
  t.deepEqual([...page1.result.sandboxes, ...page2.result.sandboxes].map((s) => s.id), made.map((s) => s.id));
  t.is(page2.result.next, undefined);
  t.is((await pdk.sandboxes.list({ group: job, node: made[0]?.info.node })).filter((s) => s.node === made[0]?.info.node).length, made.filter((s) => s.info.node === made[0]?.info.node).length);
  t.deepEqual(await pdk.sandboxes.list({ group: job, state: ['paused'] }), []);
  t.is(codeOf(await raw(nc, subjects.sandboxesList, encode({ state: ['sleeping'] }))), 'INVALID_REQUEST');
  await t.throwsAsync(pdk.sandboxes.list({ group: job, signal: AbortSignal.abort() }), { instanceOf: CancelledError });
});

test.serial('a rollout over raw NATS: start, a step, attach with its recorded steps, export', async (t) => {
  const { cluster } = t.context;
  const nc = await connect({ servers: cluster.url });
  t.teardown(() => nc.close());
  const started = (await raw(nc, subjects.rollouts('start'), encode({ sandbox: { image: 'busybox' } }))) as Reply<{ rollout: { rolloutId: string; sandbox: string }; lastStep: number }>;
  if (!started.ok) return t.fail(started.error.message);
  const { rolloutId, sandbox } = started.result.rollout;
  t.teardown(() => raw(nc, subjects.rollouts('delete'), encode({ rolloutId, kill: true })));
  t.is(started.result.lastStep, -1);
  t.is(codeOf(await raw(nc, subjects.rollouts('start'), encode({ rolloutId }))), 'ALREADY_EXISTS');
  const step = (await raw(nc, subjects.sandbox(sandbox, 'exec'), encode({ cmd: ['echo', 'one'], rolloutId, step: 0 }))) as Reply<{ stdout: Uint8Array }>;
  t.true(step.ok);
  const attached = (await raw(nc, subjects.rollouts('attach'), encode({ rolloutId, prefetch: true }))) as Reply<{ lastStep: number; steps: Array<{ step: number; kind: string }>; sandbox: { id: string } }>;
  if (!attached.ok) return t.fail(attached.error.message);
  t.is(attached.result.lastStep, 0);
  t.is(attached.result.sandbox.id, sandbox);
  t.deepEqual(attached.result.steps.map((s) => [s.step, s.kind]), [[0, 'result']]);
  const exported = (await raw(nc, subjects.rollouts('export'), encode({ rolloutId }))) as Reply<{ lines: string[] }>;
  if (!exported.ok) return t.fail(exported.error.message);
  t.is(JSON.parse(exported.result.lines[0] as string).stdout, 'one\n');
  t.is(codeOf(await raw(nc, subjects.rollouts('attach'), encode({ rolloutId: 'no-such-rollout' }))), 'NOT_FOUND');
});
