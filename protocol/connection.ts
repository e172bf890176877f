/**
 * What a NATS connection's reconnects mean for a request. nats.js drops what is published while
 * the connection is down (each reconnect attempt resets its outbound buffer), so a request in
 * flight when the connection drops never gets its answer, and a reply sent then never arrives:
 * both would wait out their whole timeout. One watch per connection tells everything that uses it
 * whether it is up, and wakes what waits for it.
 */
import { type Msg, type NatsConnection, RequestError, type RequestOptions } from '@nats-io/transport-node';

export interface ConnectionWatch {
  /** Whether the connection is up now (not reconnecting). */
  readonly up: boolean;
  /** Resolves true once the connection is up (at once if it is), false after `timeoutMs` or when it closes. */
  whenUp(timeoutMs: number): Promise<boolean>;
  /** Calls `fn` at each loss of the connection until the returned function is called. */
  onDown(fn: () => void): () => void;
  /** Calls `fn` at each reconnect until the returned function is called. */
  onUp(fn: () => void): () => void;
  /** When the connection last came back (0: never lost). */
  readonly reconnectedAt: number;
}

/**
 * How long after a reconnect "no responders" may only mean that the services' interest has not
 * reached this server yet (they reconnect too, and a restarted server learns routes anew).
 */
const SETTLE_MS = 10_000;

const watches = new WeakMap<NatsConnection, ConnectionWatch>();

export function connectionWatch(nc: NatsConnection): ConnectionWatch {
  const had = watches.get(nc);
  if (had) return had;
  let down: { back: Promise<boolean>; wake: (up: boolean) => void } | undefined;
  let closed = false;
  const downs = new Set<() => void>();
  const ups = new Set<() => void>();
  let reconnectedAt = 0;
  const w: ConnectionWatch = {
    get reconnectedAt() {
      return reconnectedAt;
    },
    get up() {
      return down === undefined && !closed;
    },
    whenUp: async (timeoutMs) => {
      if (closed) return false;
      if (!down) return true;
      let timer: NodeJS.Timeout | undefined;
      const r = await Promise.race([down.back, new Promise<boolean>((res) => (timer = setTimeout(() => res(false), timeoutMs)))]);
      clearTimeout(timer);
      return r;
    },
    onDown: (fn) => {
      downs.add(fn);
      return () => downs.delete(fn);
    },
    onUp: (fn) => {
      ups.add(fn);
      return () => ups.delete(fn);
    },
  };
  watches.set(nc, w);
  void (async () => {
    for await (const s of nc.status()) {
      if (s.type === 'disconnect' && !down) {
        let wake: (up: boolean) => void = () => {};
        const back = new Promise<boolean>((r) => (wake = r));
        down = { back, wake };
        for (const f of [...downs]) f();
      } else if (s.type === 'reconnect') {
        reconnectedAt = Date.now();
        down?.wake(true);
        down = undefined;
        for (const f of [...ups]) f();
      }
    }
    closed = true;
    down?.wake(false);
    down = undefined;
  })();
  return w;
}

/** The connection dropped while a request was in flight: it may or may not have been done. */
export class ConnectionLost extends Error {
  override readonly name = 'ConnectionLost';
  constructor(
    message: string,
    /** It was sent (and may have been done), not only waiting for the connection. */
    readonly inDoubt: boolean,
  ) {
    super(message);
  }
}

/**
 * A request that survives a reconnect of its own connection. With `resend` (a request whose second
 * delivery does what the first did: a read, a create that carries its id), one in flight when the
 * connection drops is sent again once it is back, within the same timeout; without, it fails at
 * once with ConnectionLost instead of waiting out its timeout. Sent only while the connection is
 * up (a request published while it is down is dropped): it waits for it, within the timeout.
 */
export async function request(nc: NatsConnection, subject: string, data: Uint8Array, opts: RequestOptions & { resend: boolean }): Promise<Msg> {
  const w = connectionWatch(nc);
  const deadline = Date.now() + opts.timeout;
  const { resend, ...rest } = opts;
  for (;;) {
    if (!(await w.whenUp(Math.max(0, deadline - Date.now())))) {
      throw new ConnectionLost(`NATS is unreachable (reconnecting) for longer than ${opts.timeout} ms`, false);
    }
    let lost: () => void = () => {};
    const dropped = new Promise<'lost'>((r) => (lost = () => r('lost')));
    const off = w.onDown(lost);
    const call = nc.request(subject, data, { ...rest, timeout: Math.max(1, deadline - Date.now()) });
    try {
      const r = await Promise.race([call, dropped]);
      if (r !== 'lost') return r;
    } catch (err) {
      // Shortly after a reconnect, no responders may mean the services are still coming back
      // (a create's placement replicas reconnect too): a request safe to repeat tries again.
      const settling = resend && w.reconnectedAt > 0 && Date.now() - w.reconnectedAt < SETTLE_MS && Date.now() < deadline - 250;
      if (!(settling && err instanceof RequestError && err.isNoResponders())) throw err;
      await new Promise((r) => setTimeout(r, 250));
      continue;
    } finally {
      off();
    }
    // Its answer, if one still comes, goes nowhere: only its end must not go unhandled.
    call.catch(() => {});
    if (!resend) throw new ConnectionLost(`the connection to NATS dropped while the request on ${subject} was in flight: it may or may not have been done`, true);
  }
}
