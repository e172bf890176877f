/**
 * The glue between actors and NATS: decode a request, run its handler inside a span continued from
 * the caller's `traceparent`, and reply with `{ok, result}` or `{ok: false, error}`. Every failure
 * becomes an error reply with a stable code; nothing a client sends can crash the process.
 */
import type { Msg, NatsConnection, Subscription } from '@nats-io/transport-node';
import { type Attributes, SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import type { Logger } from 'pino';
import { type ConnectionWatch, connectionWatch } from '../protocol/connection.ts';
import { decodeRequest, encode, Limits, natsFailure, ProtocolError, subjectTemplate, toWireError } from '../protocol/index.ts';
import { Attr, traceContext } from '../protocol/trace.ts';

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
  /** The operation in span names and logs; defaults to the subject's verb. */
  name?: string;
  /** The node serving (`paddock.node.id` on its spans). */
  nodeId?: string;
}

export function encodeOk(result: unknown): Uint8Array {
  return encode({ ok: true, result });
}

export function encodeError(err: unknown): Uint8Array {
  return encode({ ok: false, error: toWireError(err) });
}

/** When each NATS failure (by what and reason) was last logged: an outage is one warning a minute, not one per request. */
const logged = new Map<string, number>();
const LOG_EVERY_MS = 60_000;

function logOnce(log: Logger, failure: ProtocolError): void {
  const key = `${failure.detail?.what}:${failure.detail?.reason}`;
  const now = Date.now();
  if (now - (logged.get(key) ?? 0) < LOG_EVERY_MS) return;
  logged.set(key, now);
  log.warn({ err: failure.cause, code: failure.code, ...failure.detail }, failure.message);
}

/**
 * How long an answer waits for its connection to come back: nats.js drops what is published
 * while it reconnects, and the caller, whose request got here, may still be waiting for it.
 */
const REPLY_HOLD_MS = 30_000;

/** Sends `data` to the request's reply subject, once the connection is up. */
async function respond(watch: ConnectionWatch, msg: Msg, data: Uint8Array): Promise<void> {
  if (!watch.up && !(await watch.whenUp(REPLY_HOLD_MS))) return;
  msg.respond(data);
}

/** Runs one request through its handler and replies. Never throws. */
export async function handle(msg: Msg, handler: Handler, opts: ServeOptions, watch: ConnectionWatch): Promise<void> {
  const parent = traceContext(msg.headers);
  const { template, op, sandbox } = subjectTemplate(msg.subject);
  // `<operation> <subject template>`, per the messaging conventions: one name per verb, whatever the sandbox.
  const operation = sandbox || template.includes('{group}') ? op : (opts.name ?? op);
  const attributes: Attributes = {
    [Attr.messagingSystem]: 'nats',
    [Attr.operationType]: 'process',
    [Attr.operationName]: operation,
    [Attr.destinationName]: msg.subject,
    [Attr.destinationTemplate]: template,
  };
  if (sandbox) attributes[Attr.sandboxId] = sandbox;
  if (opts.nodeId) attributes[Attr.nodeId] = opts.nodeId;
  await tracer.startActiveSpan(`${operation} ${template}`, { kind: SpanKind.SERVER, attributes }, parent, async (span) => {
    try {
      const max = opts.maxBytes ?? Limits.requestBytesMax;
      if (msg.data.length > max) throw new ProtocolError('PAYLOAD_TOO_LARGE', `request of ${msg.data.length} bytes exceeds ${max}`);
      const result = await handler({ subject: msg.subject, body: decodeRequest(msg.data), msg });
      if (result !== STREAMED && msg.reply) await respond(watch, msg, encodeOk(result ?? null));
    } catch (thrown) {
      const failure = natsFailure(thrown, opts.name ?? msg.subject);
      const err = failure ?? thrown;
      if (failure) logOnce(opts.log, failure);
      // One already made a Paddock error where it happened (the command log's), with why.
      else if (thrown instanceof ProtocolError && thrown.code === 'UNAVAILABLE' && typeof thrown.detail?.reason === 'string') logOnce(opts.log, thrown);
      const wire = toWireError(err);
      span.setStatus({ code: SpanStatusCode.ERROR, message: wire.message });
      span.setAttribute(Attr.errorCode, wire.code);
      if (wire.code === 'INTERNAL') {
        span.recordException(err instanceof Error ? err : new Error(String(err)));
        opts.log.error({ err, subject: msg.subject }, 'internal error');
      } else opts.log.info({ subject: msg.subject, code: wire.code, error: wire.message }, `request refused: ${wire.code}`);
      if (msg.reply) {
        try {
          await respond(watch, msg, encode({ ok: false, error: wire }));
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
  const watch = connectionWatch(nc);
  return nc.subscribe(subject, {
    queue: opts.queue,
    callback: (err, msg) => {
      if (err) {
        opts.log.warn({ err, subject }, 'subscription error');
        return;
      }
      void handle(msg, handler, opts, watch);
    },
  });
}
