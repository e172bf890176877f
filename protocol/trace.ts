/**
 * Trace context on the wire: W3C `traceparent` (and `tracestate`) travel in NATS message headers.
 * With no OpenTelemetry SDK registered these are no-ops, so a trainer pays nothing for them.
 */

import { type MsgHdrs, headers as natsHeaders } from '@nats-io/transport-node';
import { type Context, context, propagation, type TextMapGetter, type TextMapSetter } from '@opentelemetry/api';

const setter: TextMapSetter<MsgHdrs> = {
  set: (carrier, key, value) => carrier.set(key, value),
};

const getter: TextMapGetter<MsgHdrs | undefined> = {
  keys: (carrier) => (carrier ? carrier.keys() : []),
  get: (carrier, key) => carrier?.get(key) || undefined,
};

/** Headers carrying the active trace context, or undefined when there is none to carry. */
export function traceHeaders(ctx: Context = context.active()): MsgHdrs | undefined {
  const carrier: Record<string, string> = {};
  propagation.inject(ctx, carrier);
  const keys = Object.keys(carrier);
  if (keys.length === 0) return undefined;
  const h = natsHeaders();
  for (const k of keys) setter.set(h, k, carrier[k] as string);
  return h;
}

/** The trace context a message carries (the active context when it carries none). */
export function traceContext(h: MsgHdrs | undefined): Context {
  return propagation.extract(context.active(), h, getter);
}

/**
 * Span attribute names: OpenTelemetry's messaging conventions (still "incubating" upstream, so
 * written here rather than imported from a package that may rename them) and Paddock's own.
 */
export const Attr = {
  messagingSystem: 'messaging.system',
  operationType: 'messaging.operation.type',
  operationName: 'messaging.operation.name',
  destinationName: 'messaging.destination.name',
  destinationTemplate: 'messaging.destination.template',
  sandboxId: 'paddock.sandbox.id',
  nodeId: 'paddock.node.id',
  backend: 'paddock.backend',
  execVerdict: 'paddock.exec.verdict',
  execExitCode: 'paddock.exec.exit_code',
  execId: 'paddock.exec.id',
  errorCode: 'paddock.error.code',
} as const;
