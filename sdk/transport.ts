/** Request/reply over NATS with the protocol's envelope, timeouts, cancellation and trace headers. */
import { type NatsConnection, RequestError, TimeoutError as NatsTimeout } from '@nats-io/transport-node';
import { decode, encode, type Reply } from '../protocol/index.ts';
import { traceHeaders } from '../protocol/trace.ts';
import { CancelledError, errorFromWire, InvalidRequestError, PaddockError, TimeoutError, UnavailableError } from './errors.ts';

/** Options every remote call takes. */
export interface CallOptions {
  /** How long to wait for the answer (default: the client's `timeoutMs`). */
  timeoutMs?: number;
  signal?: AbortSignal;
}

export class Transport {
  constructor(
    readonly nc: NatsConnection,
    readonly defaultTimeoutMs: number,
  ) {}

  /** PAYLOAD_TOO_LARGE for a message the server would refuse (NATS closes nothing, but the publish fails late and vaguely). */
  checkSize(subject: string, data: Uint8Array): void {
    const max = this.nc.info?.max_payload;
    if (max !== undefined && data.length > max) {
      throw new InvalidRequestError('PAYLOAD_TOO_LARGE', `the request on ${subject} is ${data.length} bytes, over the server's ${max} (env, stdin and file chunks count)`, { detail: { bytes: data.length, max } });
    }
  }

  /** Sends a request and returns its result; wire errors become PaddockError subclasses. */
  async request<T>(subject: string, body: unknown, opts: CallOptions = {}, onNoResponders?: () => Promise<T>): Promise<T> {
    const timeout = opts.timeoutMs ?? this.defaultTimeoutMs;
    checkTimeout(timeout, 'timeoutMs');
    if (opts.signal?.aborted) throw new CancelledError('CANCELLED', 'the call was cancelled before it was sent');
    const data = encode(body);
    this.checkSize(subject, data);
    const call = this.nc.request(subject, data, { timeout, headers: traceHeaders() });
    let msg: Awaited<typeof call>;
    try {
      msg = await (opts.signal ? abortable(call, opts.signal) : call);
    } catch (err) {
      if (err instanceof PaddockError) throw err;
      if (err instanceof RequestError && err.isNoResponders()) {
        if (onNoResponders) return onNoResponders();
        throw new UnavailableError('UNAVAILABLE', `nothing answers ${subject}: is a Paddock node running?`, { cause: err });
      }
      if (err instanceof NatsTimeout || (err as Error).cause instanceof NatsTimeout) {
        throw new TimeoutError('TIMEOUT', `no answer on ${subject} within ${timeout} ms`, { cause: err });
      }
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
