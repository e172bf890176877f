import { isSpanContextValid, trace } from '@opentelemetry/api';
import pino, { type Logger } from 'pino';

/**
 * JSON logs on stdout; one child logger per sandbox carries its id. A line written while a span is
 * active (a request being handled, continued from the caller's `traceparent`) carries its
 * `trace_id` and `span_id`, so a caller's trace can be found in the logs without an exporter.
 */
export function createLogger(name: string, level = process.env.PADDOCK_LOG_LEVEL || 'info'): Logger {
  return pino({
    name,
    level,
    base: { pid: process.pid },
    mixin() {
      const c = trace.getActiveSpan()?.spanContext();
      return c && isSpanContextValid(c) ? { trace_id: c.traceId, span_id: c.spanId } : {};
    },
  });
}
