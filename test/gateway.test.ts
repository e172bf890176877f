import { request } from 'node:http';
import { authenticate, loadKeys } from '../ops/gateway/auth.ts';
import { httpError } from '../ops/gateway/errors.ts';
import { openApiDocument } from '../ops/gateway/openapi.ts';
import { NoCapacityError } from '../sdk/index.ts';
import { clusterTest } from './helpers/cluster.ts';
import { type SseEvent, sseEvents, startTestGateway, type TestGateway } from './helpers/gateway.ts';
import { eventually } from './helpers/wait.ts';

const test = clusterTest();
let gw: TestGateway;
let keyed: TestGateway;

// ava runs before hooks at once: this one would not see the cluster's connection yet.
let ready: Promise<void> | undefined;
test.beforeEach(async (t) => {
  ready ??= (async () => {
    gw = await startTestGateway(t.context.pdk);
    keyed = await startTestGateway(t.context.pdk, { keys: loadKeys({ PADDOCK_API_KEYS: 'k-one, k-two' }) });
  })();
  await ready;
});
test.after.always(async () => {
  await gw?.close();
  await keyed?.close();
});

const json = (body: unknown) => ({ method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
// biome-ignore lint/suspicious/noExplicitAny: a test reads whatever JSON the route sent
async function call(path: string, init?: RequestInit): Promise<{ status: number; body: any; res: Response }> {
  const res = await fetch(`${gw.url}${path}`, init);
  const text = await res.text();
  return { status: res.status, body: text && res.headers.get('content-type')?.startsWith('application/json') ? JSON.parse(text) : text, res };
}
async function create(spec: Record<string, unknown> = {}): Promise<string> {
  const r = await call('/v1/sandboxes', json({ ttlSec: 600, ...spec }));
  if (r.status !== 201) throw new Error(`create: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body.id as string;
}

test('sandboxes through HTTP: create, get, list by label, group and state, exec, kill', async (t) => {
  const id = await create({ labels: { job: 'gw', run: 'a' }, group: 'gwgroup' });
  const other = await create({ labels: { job: 'gw', run: 'b' } });
  t.teardown(() => fetch(`${gw.url}/v1/sandboxes/${other}`, { method: 'DELETE' }));
  const got = await call(`/v1/sandboxes/${id}`);
  t.is(got.status, 200);
  t.is(got.body.state, 'running');
  const byLabel = await call('/v1/sandboxes?label=job=gw&label=run=a');
  t.deepEqual(byLabel.body.sandboxes.map((s: { id: string }) => s.id), [id]);
  t.deepEqual((await call('/v1/sandboxes?group=gwgroup')).body.sandboxes.map((s: { id: string }) => s.id), [id]);
  const both = (await call('/v1/sandboxes?label=job=gw&state=running')).body.sandboxes.map((s: { id: string }) => s.id);
  t.deepEqual(both.sort(), [id, other].sort());
  t.deepEqual((await call('/v1/sandboxes?label=job=gw&state=paused')).body.sandboxes, []);

  const r = await call(`/v1/sandboxes/${id}/exec`, json({ cmd: 'echo hi; echo oops >&2; cat; exit 3', stdin: 'in\n' }));
  t.is(r.status, 200);
  t.like(r.body, { exitCode: 3, stdout: 'hi\nin\n', stderr: 'oops\n', verdict: 'OK', timedOut: false });
  t.is((await call(`/v1/sandboxes/${id}/exec`, json({ cmd: ['sh', '-c', 'echo $X'], env: { X: 'argv' } }))).body.stdout, 'argv\n');

  const killed = await call(`/v1/sandboxes/${id}`, { method: 'DELETE' });
  t.is(killed.status, 200);
  t.is(killed.body.state, 'stopped');
  const gone = await call(`/v1/sandboxes/${id}/exec`, json({ cmd: 'true' }));
  t.is(gone.status, 404);
  t.is(gone.body.code, 'NOT_FOUND');
  t.false(gone.body.retryable);
});

test('exec as Server-Sent Events: output as it comes, then exit; closing the connection kills the command', async (t) => {
  const id = await create();
  t.teardown(() => fetch(`${gw.url}/v1/sandboxes/${id}`, { method: 'DELETE' }));
  const res = await fetch(`${gw.url}/v1/sandboxes/${id}/exec`, { ...json({ cmd: 'echo one; sleep 0.2; echo two >&2; printf "é"; exit 4' }), headers: { 'content-type': 'application/json', accept: 'text/event-stream' } });
  t.is(res.status, 200);
  t.regex(res.headers.get('content-type') ?? '', /^text\/event-stream/);
  const events: SseEvent[] = [];
  for await (const e of sseEvents(res)) events.push(e);
  const text = (kind: string) => events.filter((e) => e.event === kind).map((e) => (e.data as { text: string }).text).join('');
  t.is(text('stdout'), 'one\né');
  t.is(text('stderr'), 'two\n');
  const exit = events.at(-1);
  t.is(exit?.event, 'exit');
  t.like(exit?.data, { exitCode: 4, verdict: 'OK' });

  // A long command, cut off by the client: the process must be gone from the sandbox.
  const ac = new AbortController();
  const long = await fetch(`${gw.url}/v1/sandboxes/${id}/exec`, { ...json({ cmd: 'echo started; exec sleep 300' }), headers: { 'content-type': 'application/json', accept: 'text/event-stream' }, signal: ac.signal });
  const it = sseEvents(long);
  t.is(((await it.next()).value as SseEvent).event, 'stdout');
  ac.abort();
  await it.return(undefined).catch(() => {});
  // Waited for, not timed: the cancel crosses the gateway, NATS and the node, on a machine whose
  // load varies. A command that is never killed still fails here (after a minute).
  const eventually = async (what: () => Promise<boolean>) => {
    for (let i = 0; i < 600; i++) {
      if (await what()) return true;
      await new Promise((r) => setTimeout(r, 100));
    }
    return false;
  };
  let ps = '';
  const gone = await eventually(async () => {
    ps = (await call(`/v1/sandboxes/${id}/exec`, json({ cmd: ['ps'] }))).body.stdout;
    return !ps.includes('sleep 300');
  });
  t.true(gone, ps);
  // Every stream slot is free again.
  let metrics = '';
  const freed = await eventually(async () => {
    metrics = (await call('/metrics')).body;
    return /paddock_gateway_streams\{kind="exec"\} 0/.test(metrics);
  });
  t.true(freed, metrics);
});

test('processes through HTTP: start, input, output as Server-Sent Events from an offset, wait, kill, list; a terminal resizes', async (t) => {
  const id = await create();
  t.teardown(() => fetch(`${gw.url}/v1/sandboxes/${id}`, { method: 'DELETE' }));
  const started = await call(`/v1/sandboxes/${id}/processes`, json({ cmd: 'while read l; do echo "got $l"; done; echo bye >&2; exit 2', tag: 'http' }));
  t.is(started.status, 201, JSON.stringify(started.body));
  const pid = started.body.id as string;
  t.is((await call(`/v1/sandboxes/${id}/processes/${pid}/input`, json({ text: 'one\n', eof: true }))).status, 200);
  let waited = await call(`/v1/sandboxes/${id}/processes/${pid}/wait`, { method: 'POST' });
  while (waited.body.state === 'running') waited = await call(`/v1/sandboxes/${id}/processes/${pid}/wait`, { method: 'POST' });
  t.like(waited.body, { state: 'exited', exitCode: 2, verdict: 'OK' });
  const res = await fetch(`${gw.url}/v1/sandboxes/${id}/processes/${pid}/output?stdout=4`);
  const events: SseEvent[] = [];
  for await (const e of sseEvents(res)) events.push(e);
  t.deepEqual(
    events.filter((e) => e.event === 'stdout').map((e) => e.data),
    [{ text: 'one\n', offset: 4 }],
  );
  t.like(events.find((e) => e.event === 'stderr')?.data, { text: 'bye\n', offset: 0 });
  t.like(events.at(-1), { event: 'exit', data: { exitCode: 2 } });
  const listed = await call(`/v1/sandboxes/${id}/processes`);
  t.true(listed.body.processes.some((p: { id: string; tag?: string }) => p.id === pid && p.tag === 'http'));

  // A holding reader (hold=1): every byte of 1.3 MB, more than the process's 1 MiB buffer, and no gap.
  const seq = (await call(`/v1/sandboxes/${id}/processes`, json({ cmd: 'echo ready; while [ ! -e /tmp/go ]; do sleep 0.05; done; seq 1 200000' }))).body.id as string;
  let held = '';
  const heldEvents: string[] = [];
  for await (const e of sseEvents(await fetch(`${gw.url}/v1/sandboxes/${id}/processes/${seq}/output?hold=1`))) {
    heldEvents.push(e.event);
    if (e.event !== 'stdout') continue;
    held += (e.data as { text: string }).text;
    if (held === 'ready\n') t.is((await call(`/v1/sandboxes/${id}/files?path=/tmp/go`, { method: 'PUT', headers: { 'content-type': 'application/octet-stream' }, body: 'go' })).status, 200);
  }
  t.false(heldEvents.includes('gap'));
  t.is(heldEvents.at(-1), 'exit');
  t.is(held, `ready\n${Array.from({ length: 200_000 }, (_, i) => i + 1).join('\n')}\n`);
  t.is((await call(`/v1/sandboxes/${id}/processes/${seq}/output?hold=2`)).status, 400);

  const sleeper = (await call(`/v1/sandboxes/${id}/processes`, json({ cmd: ['sleep', '1000'] }))).body.id as string;
  t.is((await call(`/v1/sandboxes/${id}/processes/${sleeper}/kill?signal=SIGKILL`, { method: 'POST' })).status, 200);
  let killed = await call(`/v1/sandboxes/${id}/processes/${sleeper}/wait`, { method: 'POST' });
  while (killed.body.state === 'running') killed = await call(`/v1/sandboxes/${id}/processes/${sleeper}/wait`, { method: 'POST' });
  t.like(killed.body, { verdict: 'KILLED', signal: 'SIGKILL' });

  const term = await call(`/v1/sandboxes/${id}/processes`, json({ pty: { cols: 50, rows: 10 }, cmd: ['sh', '-c', 'read x; stty size'] }));
  t.is(term.status, 201, JSON.stringify(term.body));
  t.is((await call(`/v1/sandboxes/${id}/processes/${term.body.id}/resize`, json({ cols: 90, rows: 20 }))).status, 200);
  await call(`/v1/sandboxes/${id}/processes/${term.body.id}/input`, json({ text: '\r' }));
  const out: SseEvent[] = [];
  for await (const e of sseEvents(await fetch(`${gw.url}/v1/sandboxes/${id}/processes/${term.body.id}/output`))) out.push(e);
  t.regex(out.filter((e) => e.event === 'stdout').map((e) => (e.data as { text: string }).text).join(''), /20 90/);
  t.is((await call(`/v1/sandboxes/${id}/processes/p999`)).status, 404);
});

test('files: PUT of any size, GET with ranges, list, DELETE', async (t) => {
  const id = await create({ diskMiB: 64 });
  t.teardown(() => fetch(`${gw.url}/v1/sandboxes/${id}`, { method: 'DELETE' }));
  // Larger than a chunk, so the body is written in several calls.
  const big = Buffer.alloc(9 * 1024 * 1024 + 123);
  for (let i = 0; i < big.length; i++) big[i] = (i * 7) & 0xff;
  const put = await call(`/v1/sandboxes/${id}/files?path=/work/big.bin`, { method: 'PUT', headers: { 'content-type': 'application/octet-stream' }, body: big });
  t.is(put.status, 200);
  t.deepEqual(put.body, { path: '/work/big.bin', size: big.length });
  const whole = await fetch(`${gw.url}/v1/sandboxes/${id}/files?path=/work/big.bin`);
  t.is(whole.status, 200);
  t.is(whole.headers.get('content-length'), String(big.length));
  t.true(Buffer.from(await whole.arrayBuffer()).equals(big));
  const part = await fetch(`${gw.url}/v1/sandboxes/${id}/files?path=/work/big.bin`, { headers: { range: 'bytes=5000000-5000009' } });
  t.is(part.status, 206);
  t.is(part.headers.get('content-range'), `bytes 5000000-5000009/${big.length}`);
  t.true(Buffer.from(await part.arrayBuffer()).equals(big.subarray(5000000, 5000010)));
  const tail = await fetch(`${gw.url}/v1/sandboxes/${id}/files?path=/work/big.bin`, { headers: { range: 'bytes=-3' } });
  t.true(Buffer.from(await tail.arrayBuffer()).equals(big.subarray(big.length - 3)));
  const outside = await call(`/v1/sandboxes/${id}/files?path=/work/big.bin`, { headers: { range: `bytes=${big.length + 1}-` } });
  t.is(outside.status, 416);
  t.is(outside.res.headers.get('content-range'), `bytes */${big.length}`);

  // A body with no content type at all (as `curl -T` sends it), one of text, and an empty one.
  const bare = await new Promise<string>((resolve, reject) => {
    const req = request(`${gw.url}/v1/sandboxes/${id}/files?path=/work/bare`, { method: 'PUT', headers: { 'content-length': '4' } }, (res) => {
      let b = '';
      res.on('data', (d) => (b += d));
      res.on('end', () => resolve(b));
    });
    req.on('error', reject);
    req.end('bare');
  });
  t.is(JSON.parse(bare).size, 4);
  t.is((await call(`/v1/sandboxes/${id}/files?path=/work/t.txt`, { method: 'PUT', body: 'hello' })).body.size, 5);
  t.is((await call(`/v1/sandboxes/${id}/files?path=/work/t.txt`)).body, 'hello');
  t.is((await call(`/v1/sandboxes/${id}/files?path=/work/empty`, { method: 'PUT', headers: { 'content-type': 'application/octet-stream' }, body: '' })).body.size, 0);
  const ls = await call(`/v1/sandboxes/${id}/files/list?path=/work`);
  t.deepEqual(ls.body.entries.map((e: { name: string }) => e.name).sort(), ['bare', 'big.bin', 'empty', 't.txt']);
  t.is((await call(`/v1/sandboxes/${id}/files?path=/work/t.txt`, { method: 'DELETE' })).status, 204);
  const missing = await call(`/v1/sandboxes/${id}/files?path=/work/t.txt`);
  t.is(missing.status, 404);
  t.is(missing.body.code, 'NOT_FOUND');
  t.is((await call(`/v1/sandboxes/${id}/files`)).status, 400);
});

test('pause, resume, hibernate, restore; a verb in the wrong state is 409', async (t) => {
  const id = await create({ autoResume: false });
  t.teardown(() => fetch(`${gw.url}/v1/sandboxes/${id}`, { method: 'DELETE' }));
  t.is((await call(`/v1/sandboxes/${id}/pause`, { method: 'POST' })).body.state, 'paused');
  const asleep = await call(`/v1/sandboxes/${id}/exec`, json({ cmd: 'true' }));
  t.is(asleep.status, 409);
  t.is(asleep.body.code, 'INVALID_STATE');
  t.is((await call(`/v1/sandboxes/${id}/resume`, { method: 'POST' })).body.state, 'running');
  t.is((await call(`/v1/sandboxes/${id}/hibernate`, { method: 'POST' })).body.state, 'hibernated');
  t.is((await call(`/v1/sandboxes/${id}/restore`, { method: 'POST' })).body.state, 'running');
  t.is((await call(`/v1/sandboxes/${id}/exec`, json({ cmd: 'echo back' }))).body.stdout, 'back\n');
});

test('groups, nodes, rollouts and lifecycle events', async (t) => {
  const events = await fetch(`${gw.url}/v1/events?group=evgroup`, { headers: { accept: 'text/event-stream' } });
  const seen = sseEvents(events);
  const id = await create({ group: 'evgroup' });
  let first: SseEvent | undefined;
  for await (const e of seen) {
    if ((e.data as { id: string }).id === id && (e.data as { state: string }).state === 'running') {
      first = e;
      break;
    }
  }
  t.is(first?.event, 'sandbox');
  await seen.return(undefined);
  const paused = await call('/v1/groups/evgroup/pause', { method: 'POST' });
  t.is(paused.status, 200);
  t.is((await call(`/v1/sandboxes/${id}`)).body.state, 'paused');
  t.is((await call('/v1/groups/evgroup/dance', { method: 'POST' })).body.code, 'UNKNOWN_VERB');
  t.is((await call('/v1/groups/evgroup/kill', { method: 'POST' })).status, 200);

  const nodes = await call('/v1/nodes');
  t.true(nodes.body.nodes.length >= 1);
  const node = nodes.body.nodes[0].node as string;
  t.is((await call(`/v1/nodes/${node}`)).body.node, node);

  const ro = await call('/v1/rollouts', json({ sandbox: { ttlSec: 600 } }));
  t.is(ro.status, 201);
  const { rollout, sandbox } = ro.body;
  t.teardown(() => fetch(`${gw.url}/v1/rollouts/${rollout.rolloutId}?kill=1`, { method: 'DELETE' }));
  const step = await call(`/v1/sandboxes/${sandbox.id}/exec`, json({ cmd: 'echo step0', rolloutId: rollout.rolloutId, step: 0 }));
  t.is(step.body.stdout, 'step0\n');
  const again = await call(`/v1/sandboxes/${sandbox.id}/exec`, json({ cmd: 'echo step0', rolloutId: rollout.rolloutId, step: 0 }));
  t.true(again.body.replayed);
  t.is((await call(`/v1/rollouts/${rollout.rolloutId}/attach`, { method: 'POST' })).body.lastStep, 0);
  const lines = (await call(`/v1/rollouts/${rollout.rolloutId}/export`)).body.trim().split('\n');
  t.is(lines.length, 1);
  t.is(JSON.parse(lines[0]).step, 0);
  t.is((await call('/v1/rollouts/no-such-rollout')).status, 404);
});

test('snapshot routes: a container snapshot of files, listed, a sandbox created from it, deleted; a verb the backend lacks is refused with the capability error', async (t) => {
  const id = await create();
  t.teardown(() => fetch(`${gw.url}/v1/sandboxes/${id}`, { method: 'DELETE' }));
  t.is((await call(`/v1/sandboxes/${id}/exec`, json({ cmd: 'echo kept > /marker' }))).status, 200);
  const snap = await call(`/v1/sandboxes/${id}/snapshot`, { method: 'POST' });
  t.is(snap.status, 201);
  t.like(snap.body, { backend: 'container', from: id });
  t.deepEqual((await call(`/v1/snapshots?from=${id}`)).body.snapshots.map((s: { id: string }) => s.id), [snap.body.id]);
  const made = await call('/v1/sandboxes', json({ fromSnapshot: snap.body.id }));
  t.is(made.status, 201);
  t.teardown(() => fetch(`${gw.url}/v1/sandboxes/${made.body.id}`, { method: 'DELETE' }));
  t.is((await call(`/v1/sandboxes/${made.body.id}/exec`, json({ cmd: 'cat /marker' }))).body.stdout, 'kept\n');
  const shot = await call(`/v1/sandboxes/${id}/display/screenshot`);
  t.is(shot.status, 400);
  t.regex(shot.body.message, /lacks the display capability/);
  t.deepEqual((await call(`/v1/snapshots/${snap.body.id}`, { method: 'DELETE' })).body, { deleted: true });
  const del = await call('/v1/snapshots/sn-none', { method: 'DELETE' });
  t.is(del.status, 200);
  t.deepEqual(del.body, { deleted: false });
  t.is((await call('/v1/sandboxes', json({ fromSnapshot: 'sn-none' }))).status, 404);
});

test('ports: HTTP to a server inside a sandbox without network, through the gateway; nothing listening is NOT_FOUND', async (t) => {
  const id = await create();
  t.teardown(() => fetch(`${gw.url}/v1/sandboxes/${id}`, { method: 'DELETE' }));
  const start = await call(`/v1/sandboxes/${id}/exec`, json({ cmd: 'mkdir -p /www/sub && echo deep > /www/sub/page.txt && httpd -p 127.0.0.1:8080 -h /www && echo up' }));
  t.is(start.body.stdout, 'up\n');
  const page = await eventually(async () => {
    const r = await call(`/v1/sandboxes/${id}/ports/8080/sub/page.txt?x=1`);
    return r.status === 200 ? r : undefined;
  });
  t.is(page?.body, 'deep\n');
  t.is((await call(`/v1/sandboxes/${id}/ports/8080/missing.txt`)).status, 404, "the server's own 404 comes back");
  const none = await call(`/v1/sandboxes/${id}/ports/9999/`);
  t.is(none.status, 404);
  t.is(none.body.code, 'NOT_FOUND');
  t.is((await call(`/v1/sandboxes/${id}/ports/0/`)).body.code, 'INVALID_REQUEST');
});

test('errors are JSON with a stable code; bad input is 400, unknown routes 404, oversize bodies 413', async (t) => {
  const bad = await call('/v1/sandboxes', json({ memoryMiB: 'lots' }));
  t.is(bad.status, 400);
  t.is(bad.body.code, 'INVALID_SPEC');
  t.is((await call('/v1/sandboxes', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{nope' })).body.code, 'INVALID_REQUEST');
  t.is((await call('/v1/sandboxes/a.b')).body.code, 'INVALID_REQUEST');
  t.is((await call('/v1/sandboxes?state=sleepy')).status, 400);
  t.like((await call('/v1/nowhere')).body, { code: 'NOT_FOUND', retryable: false });
  const huge = await call('/v1/sandboxes/sb-x/exec', json({ cmd: 'true', stdin: 'x'.repeat(7 * 1024 * 1024) }));
  t.is(huge.status, 413);
  t.is(huge.body.code, 'PAYLOAD_TOO_LARGE');
  const bigHead = await fetch(`${gw.url}/healthz`, { headers: { 'x-pad': 'y'.repeat(20_000) } });
  t.is(bigHead.status, 431);
  // Where a retry may help, Retry-After says when.
  const full = httpError(new NoCapacityError('NO_CAPACITY', 'full'));
  t.is(full.status, 503);
  t.true(full.body.retryable);
  t.is(full.retryAfterSec, 1);
});

test('a stream bound per key: the next one is 429 with Retry-After until one closes', async (t) => {
  // A gateway of its own: the file's other tests hold streams of theirs on the shared one.
  const small = await startTestGateway(t.context.pdk, { maxStreamsPerKey: 2 });
  t.teardown(() => small.close());
  const open: AbortController[] = [];
  // Held until the end: fetch cancels the body of a response nobody references once it is
  // collected, which would close the stream and free its slot.
  const held: Response[] = [];
  t.teardown(() => {
    for (const ac of open) ac.abort();
  });
  // The slot is taken before the headers are sent: a stream is open once fetch has resolved (an
  // event may never come, no sandbox need change).
  const openOne = async () => {
    const ac = new AbortController();
    open.push(ac);
    const r = await fetch(`${small.url}/v1/events`, { signal: ac.signal });
    t.is(r.status, 200);
    held.push(r);
    return ac;
  };
  await openOne();
  const second = await openOne();
  const refused = await fetch(`${small.url}/v1/events`);
  t.is(refused.status, 429);
  t.is(((await refused.json()) as { code: string }).code, 'BUSY');
  t.is(refused.headers.get('retry-after'), '1');
  // Closing one frees its slot (the server sees the close a moment later).
  second.abort();
  for (;;) {
    const r = await fetch(`${small.url}/v1/events`, { signal: AbortSignal.timeout(60_000) });
    if (r.status === 200) {
      await r.body?.cancel();
      break;
    }
    t.is(r.status, 429);
    await r.body?.cancel();
    await new Promise((res) => setTimeout(res, 50));
  }
});

test('API keys: none configured serves loopback only; with keys a Bearer key is required', async (t) => {
  t.throws(() => authenticate(loadKeys({}), undefined, '10.1.2.3'), { message: /only loopback/ });
  t.is(authenticate(loadKeys({}), undefined, '::ffff:127.0.0.1'), 'loopback');
  const none = await fetch(`${keyed.url}/v1/nodes`);
  t.is(none.status, 401);
  t.is(none.headers.get('www-authenticate'), 'Bearer realm="paddock"');
  t.is((await fetch(`${keyed.url}/v1/nodes`, { headers: { authorization: 'Bearer wrong' } })).status, 403);
  t.is((await fetch(`${keyed.url}/v1/nodes`, { headers: { authorization: 'Bearer k-two' } })).status, 200);
  // The page itself carries no data: it loads without a key and asks for one.
  t.is((await fetch(`${keyed.url}/`)).status, 200);
});

test('the OpenAPI document has every route the gateway serves, with bodies from the protocol schema', async (t) => {
  const doc = (await call('/v1/openapi.json')).body;
  t.is(doc.openapi, '3.1.0');
  t.deepEqual(doc, JSON.parse(JSON.stringify(openApiDocument())));
  const missing: string[] = [];
  for (const r of gw.registered) {
    if (r.url === '/' || r.url.startsWith('/ui/')) continue;
    // fastify's wildcard is the document's `{rest}` (the rest of the path).
    const p = r.url.replace(/:(\w+)/g, '{$1}').replace(/\*$/, '{rest}');
    if (!doc.paths[p]?.[r.method.toLowerCase()]) missing.push(`${r.method} ${p}`);
  }
  t.deepEqual(missing, []);
  t.true(gw.registered.length > 25);
  // Every $ref resolves.
  const refs = JSON.stringify(doc).match(/"#\/components\/schemas\/[^"]+"/g) ?? [];
  for (const ref of new Set(refs)) t.truthy(doc.components.schemas[ref.slice(22, -1)], ref);
  t.truthy(doc.components.schemas.SandboxSpec.properties.memoryMiB);
});
