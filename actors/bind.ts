/**
 * The glue between actors and NATS: decode a request, run its handler inside a span continued from
 * the caller's `traceparent`, and reply with `{ok, result}` or `{ok: false, error}`. Every failure
 * becomes an error reply with a stable code; nothing a client sends can crash the process.
 */
import type { Msg, NatsConnection, Subscription } from '@nats-io/transport-node';
import { SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import type { Logger } from 'pino';
import { decodeRequest, encode, Limits, ProtocolError, toWireError } from '../protocol/index.ts';
import { traceContext } from '../protocol/trace.ts';

export const tracer = trace.getTracer('paddock');

/** Returned by a handler that answered on its own (a stream): no reply is sent for it. */
export const STREAMED = Symbol('streamed');

export interface Request {
  subject: string;
  body: unknown;
  msg: Msg;
}

export type Handler = (req: Request) => Promise<unknown>;

export interface ServeOptions {
  queue?: string;
  /** Largest payload accepted before decoding. */
  maxBytes?: number;
  log: Logger;
  /** Span name; defaults to the subject. */
  name?: string;
}

export function encodeOk(result: unknown): Uint8Array {
  return encode({ ok: true, result });
}

export function encodeError(err: unknown): Uint8Array {
  return encode({ ok: false, error: toWireError(err) });
}

/** Runs one request through its handler and replies. Never throws. */
export async function handle(msg: Msg, handler: Handler, opts: ServeOptions): Promise<void> {
  const parent = traceContext(msg.headers);
  await tracer.startActiveSpan(opts.name ?? msg.subject, { kind: SpanKind.SERVER, attributes: { 'messaging.destination': msg.subject } }, parent, async (span) => {
    try {
      const max = opts.maxBytes ?? Limits.requestBytesMax;
      if (msg.data.length > max) throw new ProtocolError('PAYLOAD_TOO_LARGE', `request of ${msg.data.length} bytes exceeds ${max}`);
      const result = await handler({ subject: msg.subject, body: decodeRequest(msg.data), msg });
      if (result !== STREAMED && msg.reply) msg.respond(encodeOk(result ?? null));
    } catch (err) {
      const wire = toWireError(err);
      span.setStatus({ code: SpanStatusCode.ERROR, message: wire.message });
      span.setAttribute('paddock.error.code', wire.code);
      if (wire.code === 'INTERNAL') {
        span.recordException(err instanceof Error ? err : new Error(String(err)));
        opts.log.error({ err, subject: msg.subject }, 'internal error');
      } else opts.log.info({ subject: msg.subject, code: wire.code, error: wire.message }, `request refused: ${wire.code}`);
      if (msg.reply) {
        try {
          msg.respond(encode({ ok: false, error: wire }));
        } catch (e) {
          opts.log.warn({ err: e, subject: msg.subject }, 'could not send error reply');
        }
      }
    } finally {
      span.end();
    }
  });
}

/** Subscribes `handler` to `subject`. Requests run concurrently; each is answered exactly once. */
export function serve(nc: NatsConnection, subject: string, opts: ServeOptions, handler: Handler): Subscription {
  return nc.subscribe(subject, {
    queue: opts.queue,
    callback: (err, msg) => {
      if (err) {
        opts.log.warn({ err, subject }, 'subscription error');
        return;
      }
      void handle(msg, handler, opts);
    },
  });
}
