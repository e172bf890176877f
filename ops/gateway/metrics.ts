/** The gateway's Prometheus metrics (prom-client): requests by route and status, latency, open streams. */
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';

/** Seconds: from a keep-alive exec (~1 ms) to a cold create waiting for an image (~2 min). */
export const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120];

export interface GatewayMetrics {
  registry: Registry;
  requests: Counter<'method' | 'route' | 'status'>;
  duration: Histogram<'method' | 'route'>;
  errors: Counter<'code'>;
  streams: Gauge<'kind'>;
  execs: Counter<'mode'>;
  files: Counter<'op'>;
}

export function gatewayMetrics(): GatewayMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'paddock_gateway_' });
  const registers = [registry];
  return {
    registry,
    // Routes are URL templates (`/v1/sandboxes/:id`): no sandbox id becomes a label value.
    requests: new Counter({ name: 'paddock_gateway_http_requests_total', help: 'HTTP requests answered, by method, route template and status', labelNames: ['method', 'route', 'status'], registers }),
    duration: new Histogram({ name: 'paddock_gateway_http_request_duration_seconds', help: 'Time to answer an HTTP request (to the end of the body for non-streams)', labelNames: ['method', 'route'], buckets: LATENCY_BUCKETS, registers }),
    errors: new Counter({ name: 'paddock_gateway_errors_total', help: 'Error answers, by stable error code', labelNames: ['code'], registers }),
    streams: new Gauge({ name: 'paddock_gateway_streams', help: 'Server-Sent Event streams open now', labelNames: ['kind'], registers }),
    execs: new Counter({ name: 'paddock_gateway_execs_total', help: 'Execs asked for, JSON or streamed', labelNames: ['mode'], registers }),
    files: new Counter({ name: 'paddock_gateway_file_calls_total', help: 'File reads, writes and removals asked for', labelNames: ['op'], registers }),
  };
}
