/**
 * OpenTelemetry set-up. Off unless PADDOCK_TRACES asks: `console` prints spans, `otlp` sends them
 * to OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318). The W3C propagator is always
 * registered so `traceparent` headers from callers are honoured.
 */
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
