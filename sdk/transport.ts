/** Request/reply over NATS with the protocol's envelope, timeouts, cancellation and trace headers. */
import { type Msg, type NatsConnection, TimeoutError as NatsTimeout, RequestError } from '@nats-io/transport-node';
import { type Attributes, type Span, SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import { ConnectionLost, type ConnectionWatch, connectionWatch, request } from '../protocol/connection.ts';
import { decode, encode, mayResend, natsFailure, type Reply, subjectTemplate } from '../protocol/index.ts';
import { Attr, traceHeaders } from '../protocol/trace.ts';
import { CancelledError, errorFromWire, InvalidRequestError, PaddockError, TimeoutError, UnavailableError } from './errors.ts';

/** Options every remote call takes. */
export interface CallOptions {
  /** How long to wait for the answer (default: the client's `timeoutMs`). */
  timeoutMs?: number;
  signal?: AbortSignal;
}

export class Transport {
  private readonly watch: ConnectionWatch;

  constructor(
    readonly nc: NatsConnection,
    readonly defaultTimeoutMs: number,
  ) {
    this.watch = connectionWatch(nc);
  }

  /** Whether the connection is up (not reconnecting). */
  get isConnected(): boolean {
    return this.watch.up;
  }

  /** Calls `fn` after each reconnect until the returned function is called (a stream asks for what it missed). */
  onReconnect(fn: () => void): () => void {
    return this.watch.onUp(fn);
  }

  /**
   * Waits (up to `timeoutMs`) for a connection that is reconnecting: the client drops what is
   * published while it is down, so a request sent then would wait its whole timeout for nothing.
   */
  async connected(timeoutMs: number, what: string): Promise<void> {
    if (await this.watch.whenUp(timeoutMs)) return;
    throw new UnavailableError('UNAVAILABLE', `${what}: NATS is unreachable (reconnecting) for longer than ${timeoutMs} ms`, { detail: { what, reason: 'disconnected' } });
  }

  /** PAYLOAD_TOO_LARGE for a message the server would refuse (NATS closes nothing, but the publish fails late and vaguely). */
  checkSize(subject: string, data: Uint8Array): void {
    const max = this.nc.info?.max_payload;
    if (max !== undefined && data.length > max) {
      throw new InvalidRequestError('PAYLOAD_TOO_LARGE', `the request on ${subject} is ${data.length} bytes, over the server's ${max} (env, stdin and file chunks count)`, { detail: { bytes: data.length, max } });
    }
  }

  /**
   * Sends a request and returns its result; wire errors become PaddockError subclasses. With a
   * tracer provider registered by the application, each call is a client span (`<verb> <subject
   * template>`) whose context travels in the request's headers.
   */
  request<T>(subject: string, body: unknown, opts: CallOptions = {}, onNoResponders?: () => Promise<T>, attributes?: Attributes): Promise<T> {
    const { template, op } = subjectTemplate(subject);
    return sdkTracer.startActiveSpan(`${op} ${template}`, { kind: SpanKind.CLIENT, attributes: { ...clientAttrs(subject, op), ...attributes } }, async (span) => {
      try {
        const result = await this.send<T>(subject, body, opts, onNoResponders);
        const r = result as { verdict?: unknown; exitCode?: unknown; node?: unknown; backend?: unknown; sandbox?: { id?: unknown; node?: unknown; backend?: unknown } } | null;
        const info = r && typeof r === 'object' ? (r.sandbox ?? r) : undefined;
        if (info && typeof info.node === 'string') span.setAttribute(Attr.nodeId, info.node);
        if (info && typeof info.backend === 'string') span.setAttribute(Attr.backend, info.backend);
        if (r?.sandbox && typeof r.sandbox.id === 'string') span.setAttribute(Attr.sandboxId, r.sandbox.id);
        if (r && typeof r.verdict === 'string') {
          span.setAttribute(Attr.execVerdict, r.verdict);
          if (r.verdict !== 'OK') span.setStatus({ code: SpanStatusCode.ERROR, message: r.verdict });
        }
        if (r && typeof r.exitCode === 'number') span.setAttribute(Attr.execExitCode, r.exitCode);
        return result;
      } catch (err) {
        spanFailed(span, err);
        throw err;
      } finally {
        span.end();
      }
    });
  }

  private async send<T>(subject: string, body: unknown, opts: CallOptions, onNoResponders?: () => Promise<T>): Promise<T> {
    const timeout = opts.timeoutMs ?? this.defaultTimeoutMs;
    checkTimeout(timeout, 'timeoutMs');
    if (opts.signal?.aborted) throw new CancelledError('CANCELLED', 'the call was cancelled before it was sent');
    const data = encode(body);
    this.checkSize(subject, data);
    // A call the connection's loss left in doubt is sent again only when repeating it is harmless
    // (protocol/api.ts, mayResend); any other fails at once rather than at its timeout.
    const call = request(this.nc, subject, data, { timeout, headers: traceHeaders(), resend: mayResend(subjectTemplate(subject).op) });
    let msg: Msg;
    try {
      msg = await (opts.signal ? abortable(call, opts.signal) : call);
    } catch (err) {
      if (err instanceof PaddockError) throw err;
      if (err instanceof ConnectionLost) {
        throw new UnavailableError('UNAVAILABLE', `${err.message}${err.inDoubt ? ' (not sent again: repeating it is not safe)' : ''}`, { cause: err, detail: { what: subject, reason: 'disconnected', inDoubt: err.inDoubt } });
      }
      if (err instanceof RequestError && err.isNoResponders()) {
        if (onNoResponders) return onNoResponders();
        throw new UnavailableError('UNAVAILABLE', `nothing answers ${subject}: is a Paddock node running?`, { cause: err });
      }
      if (err instanceof NatsTimeout || (err as Error).cause instanceof NatsTimeout) {
        throw new TimeoutError('TIMEOUT', `no answer on ${subject} within ${timeout} ms`, { cause: err });
      }
      const failure = natsFailure(err, `the request on ${subject}`);
      if (failure) throw new UnavailableError('UNAVAILABLE', failure.message, { cause: err, ...(failure.detail ? { detail: failure.detail } : {}) });
      throw new UnavailableError('UNAVAILABLE', `request on ${subject} failed: ${(err as Error).message}`, { cause: err });
    }
    const reply = decode(msg.data) as Reply<T>;
    if (reply.ok) return reply.result;
    throw errorFromWire(reply.error);
  }

  /** Bounds work that is not one request (a scan of a bucket) by the call's timeout and signal. */
  async within<T>(work: Promise<T>, opts: CallOptions, what: string): Promise<T> {
    const timeout = opts.timeoutMs ?? this.defaultTimeoutMs;
    if (opts.signal?.aborted) throw new CancelledError('CANCELLED', `${what} was cancelled before it began`);
    let timer: NodeJS.Timeout | undefined;
    const expiry = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new TimeoutError('TIMEOUT', `${what} did not finish within ${timeout} ms`)), timeout);
    });
    try {
      return await Promise.race([opts.signal ? abortable(work, opts.signal) : work, expiry]);
    } finally {
      clearTimeout(timer);
    }
  }
}

/** The SDK's tracer: a no-op until the application registers a tracer provider. */
export const sdkTracer = trace.getTracer('paddock-sdk');

/** A client span's attributes for a call on `subject` (messaging conventions, plus the sandbox). */
export function clientAttrs(subject: string, op: string): Attributes {
  const { template, sandbox } = subjectTemplate(subject);
  const a: Attributes = {
    [Attr.messagingSystem]: 'nats',
    [Attr.operationType]: 'send',
    [Attr.operationName]: op,
    [Attr.destinationName]: subject,
    [Attr.destinationTemplate]: template,
  };
  if (sandbox) a[Attr.sandboxId] = sandbox;
  return a;
}

/** Timers take at most 2^31-1 ms: a longer one fires at once (a 1e15 ms exec "timed out" after 2 ms). */
const TIMER_MAX_MS = 2 ** 31 - 1;

/** A timeout the SDK can wait for, or INVALID_REQUEST before anything is sent. */
export function checkTimeout(ms: unknown, field: string, max = TIMER_MAX_MS): void {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0 || ms > max) {
    throw new InvalidRequestError('INVALID_REQUEST', `${field}: must be a number of ms from 0 to ${max}, got ${String(ms)}`, { detail: { field } });
  }
}

export function abortable<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(new CancelledError('CANCELLED', 'the call was cancelled'));
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(e);
      },
    );
  });
}

/** Marks a client span failed, with the Paddock error code when there is one. */
export function spanFailed(span: Span, err: unknown): void {
  if (err instanceof PaddockError) span.setAttribute(Attr.errorCode, err.code);
  span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
}
