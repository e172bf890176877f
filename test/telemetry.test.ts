import { readFile } from 'node:fs/promises';
import { context, trace } from '@opentelemetry/api';
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';
import { clusterTest } from './helpers/cluster.ts';

const test = clusterTest({ env: { PADDOCK_TRACES: 'console' } });

test('traceparent travels from the SDK to the node; transitions are span events', async (t) => {
  const exporter = new InMemorySpanExporter();
  const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  provider.register();
  t.teardown(() => provider.shutdown());
  const tracer = trace.getTracer('trainer');
  const root = tracer.startSpan('rollout');
  const traceId = root.spanContext().traceId;
  await context.with(trace.setSpan(context.active(), root), async () => {
    const sb = await t.context.pdk.sandboxes.create({});
    await sb.exec(['true']);
    await sb.kill();
  });
  root.end();
  const logFile = t.context.cluster.nodes[0]!.logFile!;
  // The console exporter writes each span when it ends; give the last one a moment.
  let log = '';
  for (let i = 0; i < 40 && !log.includes("name: 'sandbox'"); i++) {
    await new Promise((r) => setTimeout(r, 50));
    log = await readFile(logFile, 'utf8');
  }
  t.true(log.includes(traceId), 'node spans carry the trainer trace id');
  t.regex(log, /name: 'place\.create'/);
  t.regex(log, /name: 'node\.create'/);
  t.regex(log, /name: 'sandbox'/);
  t.regex(log, /sandbox\.transition/);
});
