/**
 * OpenTelemetry set-up. Off unless PADDOCK_TRACES asks: `console` prints spans, `otlp` sends them
 * to OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318). The W3C propagator is always
 * registered so `traceparent` headers from callers are honoured. Also: on-demand CPU profiles.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { join } from 'node:path';
import { propagation } from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, type SpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';

let provider: NodeTracerProvider | undefined;

export function setupTelemetry(serviceName: string, mode = process.env.PADDOCK_TRACES): void {
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  if (!mode || provider) return;
  const processors: SpanProcessor[] = [];
  if (mode === 'console') processors.push(new SimpleSpanProcessor(new ConsoleSpanExporter()));
  else if (mode === 'otlp') processors.push(new BatchSpanProcessor(new OTLPTraceExporter()));
  else throw new Error(`PADDOCK_TRACES=${mode}: expected console or otlp`);
  provider = new NodeTracerProvider({ resource: resourceFromAttributes({ 'service.name': serviceName }), spanProcessors: processors });
  provider.register();
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
