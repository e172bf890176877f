/**
 * OpenTelemetry set-up. Exporting is off unless PADDOCK_TRACES asks: `file` (or `console`) writes
 * each span as one JSON line to its own file (`traces-<name>.jsonl` beside the logs: never into
 * a log), `otlp` sends them to OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318). The
 * W3C propagator and an AsyncLocalStorage context manager are always registered, so `traceparent`
 * headers from callers are honoured and every log line written while handling a request carries
 * the caller's trace id, with or without an exporter. Also: on-demand CPU profiles.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { hostname } from 'node:os';
import { join } from 'node:path';
import type { Writable } from 'node:stream';
import { context, propagation, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { type ExportResult, ExportResultCode, hrTimeToMicroseconds, W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { detectResources, hostDetector, processDetector, resourceFromAttributes } from '@opentelemetry/resources';
import { BatchSpanProcessor, type ReadableSpan, SimpleSpanProcessor, type SpanExporter, type SpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';
import type { Logger } from 'pino';
import { type Inspector, transitionInspector } from '../actors/inspect.ts';
import { ROOT } from '../runtime/source.ts';
import { rotatingLog } from './logfile.ts';

let provider: NodeTracerProvider | undefined;
/** Whether setupTelemetry gave spans an exporter (PADDOCK_TRACES). */
let exporting = false;

/** The package's version (service.version), from package.json at the root. */
const VERSION = (() => {
  try {
    return (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version?: string }).version ?? 'unknown';
  } catch {
    return 'unknown';
  }
})();
let contextManager: AsyncLocalStorageContextManager | undefined;

/** Spans as JSON lines, one per span, in a file of their own. */
class JsonLinesSpanExporter implements SpanExporter {
  private readonly out: Writable;
  constructor(file: string) {
    this.out = rotatingLog(file);
  }
  export(spans: ReadableSpan[], done: (r: ExportResult) => void): void {
    for (const s of spans) {
      const c = s.spanContext();
      const line = {
        traceId: c.traceId,
        spanId: c.spanId,
        parentSpanId: s.parentSpanContext?.spanId,
        name: s.name,
        kind: s.kind,
        startUs: hrTimeToMicroseconds(s.startTime),
        durationUs: hrTimeToMicroseconds(s.duration),
        status: s.status,
        attributes: s.attributes,
        events: s.events.map((e) => ({ name: e.name, timeUs: hrTimeToMicroseconds(e.time), attributes: e.attributes })),
        service: s.resource.attributes['service.name'],
        resource: s.resource.attributes,
      };
      this.out.write(`${JSON.stringify(line)}\n`);
    }
    done({ code: ExportResultCode.SUCCESS });
  }
  shutdown(): Promise<void> {
    return new Promise((r) => this.out.end(r));
  }
}

/**
 * `tracesFile`: where PADDOCK_TRACES=file (or console) writes spans. `processors` see every span
 * with or without an exporter (the node's metrics are made from its request spans).
 */
export function setupTelemetry(serviceName: string, o: { mode?: string; tracesFile?: string; processors?: SpanProcessor[]; instanceId?: string } = {}): void {
  const mode = o.mode ?? process.env.PADDOCK_TRACES;
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  if (!contextManager) {
    contextManager = new AsyncLocalStorageContextManager().enable();
    context.setGlobalContextManager(contextManager);
  }
  if ((!mode && !o.processors?.length) || provider) return;
  const processors: SpanProcessor[] = [...(o.processors ?? [])];
  if (mode === 'file' || mode === 'console') processors.push(new SimpleSpanProcessor(new JsonLinesSpanExporter(o.tracesFile ?? `traces-${serviceName}.jsonl`)));
  else if (mode === 'otlp') processors.push(new BatchSpanProcessor(new OTLPTraceExporter()));
  else if (mode) throw new Error(`PADDOCK_TRACES=${mode}: expected file, console (the same) or otlp`);
  exporting = Boolean(mode);
  // service.* by the resource conventions; host.* and process.* from the SDK's own detectors.
  const resource = resourceFromAttributes({
    'service.name': serviceName,
    'service.version': VERSION,
    'service.instance.id': o.instanceId ?? `${hostname()}-${process.pid}`,
    'host.name': hostname(),
  }).merge(detectResources({ detectors: [hostDetector, processDetector] }));
  provider = new NodeTracerProvider({ resource, spanProcessors: processors });
  provider.register({ contextManager });
}

/**
 * Spans leave this process: PADDOCK_TRACES gave them an exporter, or the embedding program
 * registered a tracer provider of its own. The node's own provider, there for its metrics, does
 * not count: metrics are made from request spans, not from their transition events.
 */
export function tracesExported(): boolean {
  if (exporting) return true;
  const global = trace.getTracerProvider() as { getDelegate?(): unknown };
  const delegate = global.getDelegate?.() ?? global;
  return delegate !== provider && (delegate as object).constructor?.name !== 'NoopTracerProvider';
}

/**
 * The transition inspector, only where something reads what it makes: exported spans, or a log
 * at debug. XState calls an inspector for every snapshot of every actor; on a simulated fleet
 * that was ~12% of the CPU of a create (a sandbox's life is a dozen snapshots), spent making span
 * events that no one exported and debug lines below the log's level.
 */
export function inspectorFor(log: Logger): Inspector | undefined {
  return tracesExported() || log.isLevelEnabled('debug') ? transitionInspector(log) : undefined;
}

export async function shutdownTelemetry(): Promise<void> {
  await provider?.shutdown();
}

/**
 * On-demand V8 CPU profiles of a long-lived process, for one phase of its life (say, a benchmark's
 * creates): `--cpu-prof` is refused in NODE_OPTIONS and profiles the whole run. With `dir` set
 * (PADDOCK_CPU_PROFILE), SIGUSR2 starts the profiler and the next SIGUSR2 writes
 * `<dir>/<name>-<pid>-<n>.cpuprofile` (Chrome DevTools, speedscope). The samples are wall-clock:
 * on a busy host a function's share includes the time its thread waited for a CPU.
 */
export function profileOnSignal(name: string, log: { info(o: object, msg: string): void; warn(o: object, msg: string): void }, dir = process.env.PADDOCK_CPU_PROFILE): void {
  if (!dir) return;
  let session: Session | undefined;
  let n = 0;
  process.on('SIGUSR2', () => {
    if (!session) {
      const s = new Session();
      session = s;
      s.connect();
      s.post('Profiler.enable', () => s.post('Profiler.setSamplingInterval', { interval: 250 }, () => s.post('Profiler.start')));
      return;
    }
    const s = session;
    session = undefined;
    s.post('Profiler.stop', (err, res) => {
      s.disconnect();
      const file = join(dir, `${name}-${process.pid}-${n++}.cpuprofile`);
      try {
        if (err) throw err;
        mkdirSync(dir, { recursive: true });
        writeFileSync(file, JSON.stringify(res.profile));
        log.info({ file }, 'CPU profile written');
      } catch (e) {
        log.warn({ err: e, file }, 'CPU profile not written');
      }
    });
  });
}
