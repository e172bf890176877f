import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { context, SpanStatusCode, trace } from '@opentelemetry/api';
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';
import { clusterTest } from './helpers/cluster.ts';

const test = clusterTest({ env: { PADDOCK_TRACES: 'console' } });

test('traceparent travels from the SDK to the node; transitions are span events; spans and log lines stay apart', async (t) => {
  const exporter = new InMemorySpanExporter();
  const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  provider.register();
  t.teardown(() => provider.shutdown());
  const tracer = trace.getTracer('trainer');
  const root = tracer.startSpan('rollout');
  const traceId = root.spanContext().traceId;
  let first = '';
  await context.with(trace.setSpan(context.active(), root), async () => {
    const sb = await t.context.pdk.sandboxes.create({});
    first = sb.id;
    await sb.exec(['true']);
    for await (const _ of sb.execStream(['sh', '-c', 'echo a; sleep 0.3; echo b'])) {
      // Drained: the stream's span must last until its exit.
    }
    const late = await sb.exec(['sleep', '5'], { timeoutMs: 300 });
    t.is(late.verdict, 'TIMEOUT');
    await sb.files.write('/tmp/traced', 'x');
    await sb.pause();
    await sb.resume();
    await sb.kill();
  });
  root.end();
  // A sandbox whose ttl ends it: that transition comes from a timer, with no request (and no span) behind it.
  const brief = await t.context.pdk.sandboxes.create({ ttlSec: 1 });
  for (let i = 0; i < 300 && (await brief.refresh()).state !== 'stopped'; i++) await new Promise((r) => setTimeout(r, 100));
  t.is(brief.info.state, 'stopped');
  await t.throwsAsync(t.context.pdk.sandboxes.create({ memoryMiB: 1 }), { message: /memoryMiB/ });
  const node = t.context.cluster.nodes[0]!;
  const tracesFile = join(t.context.home, 'logs', `traces-node-${node.id}.jsonl`);
  // Each span is written when it ends: wait for the last one (30 s at most, a bound no test meets but a stuck one).
  let spans: { traceId: string; name: string; durationUs: number; status?: { code: number }; attributes: Record<string, unknown>; resource: Record<string, unknown>; events: { name: string; attributes?: Record<string, unknown> }[] }[] = [];
  const ttlSpan = (s: (typeof spans)[number]) => s.name === 'sandbox.transition' && s.attributes['paddock.sandbox.id'] === brief.id && s.attributes['paddock.actor.state'] === 'stopping';
  for (let i = 0; i < 600 && !(spans.some((s) => s.name === 'kill pdk.v1.sb.{id}.kill') && spans.some(ttlSpan)); i++) {
    await new Promise((r) => setTimeout(r, 50));
    const text = await readFile(tracesFile, 'utf8').catch(() => '');
    spans = text
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as (typeof spans)[number]);
  }
  const names = new Set(spans.filter((s) => s.traceId === traceId).map((s) => s.name));
  // `<operation> <subject template>`: one name per verb, whatever the sandbox or node.
  t.true(names.has('place.create pdk.v1.place.create'), `node spans carry the trainer trace id: ${[...names].join(', ')}`);
  t.true(names.has('node.create pdk.v1.node.{node}.create'));
  t.true(names.has('exec pdk.v1.sb.{id}.exec'));
  t.true(names.has('exec.stream pdk.v1.sb.{id}.exec'));
  t.true(spans.some((s) => s.events.some((e) => e.name === 'sandbox.transition')));
  t.true(
    spans.some((s) => s.events.some((e) => e.name === 'sandbox.transition' && e.attributes?.['paddock.actor.state'] === 'creating')),
    'the creating transition is a span event',
  );
  t.true(names.has('files.write pdk.v1.sb.{id}.files.write'), [...names].join(', '));
  t.true(names.has('pause pdk.v1.sb.{id}.pause'));
  t.true(names.has('resume pdk.v1.sb.{id}.resume'));
  // A timer's transition is a span of its own, with the event on it.
  const ttl = spans.find(ttlSpan);
  t.truthy(ttl, 'the ttl transition is traced');
  t.regex(String(ttl?.attributes['paddock.actor.event']), /^xstate\.after\./);
  t.true(ttl?.events.some((e) => e.name === 'sandbox.transition' && e.attributes?.['paddock.actor.state'] === 'stopping'));
  // An exec's verdict is an attribute, and a verdict other than OK is the span's error status.
  const timedOut = spans.find((s) => s.name === 'exec pdk.v1.sb.{id}.exec' && s.attributes['paddock.exec.verdict'] === 'TIMEOUT');
  t.truthy(timedOut, 'the timed-out exec has its verdict');
  t.is(timedOut?.status?.code, SpanStatusCode.ERROR);
  const exec = spans.find((s) => s.name === 'exec pdk.v1.sb.{id}.exec' && s.attributes['paddock.exec.verdict'] === 'OK');
  t.like(exec?.attributes, { 'messaging.system': 'nats', 'messaging.operation.type': 'process', 'paddock.backend': 'container', 'paddock.exec.verdict': 'OK', 'paddock.exec.exit_code': 0 });
  t.regex(String(exec?.attributes['messaging.destination.name']), /^pdk\.v1\.sb\.sb-[a-z2-7]+\.exec$/);
  t.is(exec?.attributes['paddock.sandbox.id'], String(exec?.attributes['messaging.destination.name']).split('.')[3]);
  t.is(exec?.attributes['paddock.node.id'], node.id);
  const stream = spans.find((s) => s.name === 'exec.stream pdk.v1.sb.{id}.exec');
  // The stream slept 0.3 s between its lines: its span covers that, not just the request.
  t.true((stream?.durationUs ?? 0) >= 300_000, `stream span lasted ${stream?.durationUs} µs`);
  t.like(stream?.attributes, { 'paddock.exec.verdict': 'OK', 'paddock.exec.exit_code': 0 });
  t.like(exec?.resource, { 'service.name': 'paddock-node', 'service.instance.id': node.id });
  t.truthy(exec?.resource['service.version']);
  t.truthy(exec?.resource['host.name']);
  // The SDK's own client spans, with the application's provider.
  const client = exporter.getFinishedSpans().map((s) => s.name);
  t.true(client.includes('place.create pdk.v1.place.create'), client.join(', '));
  t.true(client.includes('exec.stream pdk.v1.sb.{id}.exec'), client.join(', '));
  t.true(client.includes('files.write pdk.v1.sb.{id}.files.write'), client.join(', '));
  // Their attributes follow the messaging conventions and say where the sandbox runs, though an exec's reply does not.
  const clientExec = exporter.getFinishedSpans().find((s) => s.name === 'exec pdk.v1.sb.{id}.exec' && s.attributes['paddock.exec.verdict'] === 'TIMEOUT');
  t.like(clientExec?.attributes, { 'messaging.system': 'nats', 'messaging.operation.type': 'send', 'messaging.destination.template': 'pdk.v1.sb.{id}.exec', 'paddock.node.id': node.id, 'paddock.backend': 'container', 'paddock.exec.verdict': 'TIMEOUT' });
  t.regex(String(clientExec?.attributes['paddock.sandbox.id']), /^sb-/);
  t.is(clientExec?.status.code, SpanStatusCode.ERROR);

  // The log: JSON lines only, the request's lines with the trainer's trace id, no span dumps.
  const log = (await readFile(node.logFile!, 'utf8')).split('\n').filter(Boolean);
  for (const l of log) t.notThrows(() => JSON.parse(l), `a log line that is not JSON: ${l.slice(0, 200)}`);
  const records = log.map((l) => JSON.parse(l) as { msg: string; sandbox?: string; trace_id?: string; span_id?: string; state?: string });
  const lifecycle = records.filter((r) => r.sandbox === first && (r.msg === 'sandbox running' || r.msg === 'sandbox stopped'));
  t.true(lifecycle.length >= 2, 'one info line per lifecycle change');
  t.true(
    lifecycle.every((r) => r.trace_id === traceId && typeof r.span_id === 'string'),
    'lines written while handling a request carry its trace_id and span_id',
  );
  const refused = await (async () => {
    for (let i = 0; i < 40; i++) {
      const r = (await readFile(node.logFile!, 'utf8')).split('\n').find((l) => l.includes('"msg":"request refused: INVALID_SPEC"'));
      if (r) return JSON.parse(r) as { level: number; code: string; subject: string };
      await new Promise((res) => setTimeout(res, 50));
    }
    return undefined;
  })();
  t.like(refused, { level: 30, code: 'INVALID_SPEC', subject: 'pdk.v1.place.create' }, 'a refused request is one info line with its code');
});
