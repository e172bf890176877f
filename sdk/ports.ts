/**
 * Ports inside a sandbox, reached without giving it any network: `sb.ports.connect(port)` is a
 * Node.js Duplex over NATS (usable wherever a socket is, `http.request({ createConnection })`
 * included), `sb.ports.url(port)` a TCP listener on the node's loopback.
 */
import { Duplex } from 'node:stream';
import { createInbox, type Msg } from '@nats-io/transport-node';
import { Credits, decode, encode, Limits, type PortEvent, type PortsUrlReply, type Reply, subjects } from '../protocol/index.ts';
import { errorFromWire, TimeoutError } from './errors.ts';
import type { CallOptions } from './transport.ts';

/** What a connection needs of its sandbox (sdk/sandbox.ts implements it). */
export interface PortsHost {
  readonly id: string;
  call<T>(verb: 'ports.send' | 'ports.close' | 'ports.url', body: unknown, opts?: CallOptions): Promise<T>;
  /** The NATS connection the events come on. */
  readonly nc: { subscribe(subject: string, opts: { callback: (err: unknown, m: Msg) => void }): { unsubscribe(): void }; publish(subject: string, data: Uint8Array, opts?: { reply?: string }): void };
  /** Publishes a verb's request with no reply wanted (ports.credit). */
  tell(verb: 'ports.credit', body: unknown): void;
}

const OPEN_TIMEOUT_MS = 10_000;
/**
 * Bytes the node may send past what this connection's reader has taken (ports.connect's window).
 * Without it a reader slower than the server (an HTTP client behind the gateway) had every byte
 * the server wrote held in its stream's buffer, however large the download.
 */
export const PORT_WINDOW_BYTES = 1024 * 1024;

export class SandboxPorts {
  constructor(private readonly sb: PortsHost) {}

  /**
   * A connection to `port` on the sandbox's loopback. Rejects NOT_FOUND when nothing listens
   * there. Writes resolve once the node has written them (flow control towards the server); the
   * server's bytes are read from the stream; `end()` half-closes, `destroy()` closes.
   */
  async connect(port: number, opts: CallOptions = {}): Promise<Duplex> {
    const inbox = createInbox();
    let conn: PortConnection | undefined;
    let settle: { resolve: (c: PortConnection) => void; reject: (e: Error) => void } | undefined;
    const opened = new Promise<PortConnection>((resolve, reject) => {
      settle = { resolve, reject };
    });
    const sub = this.sb.nc.subscribe(inbox, {
      callback: (_err, m) => {
        if (m.headers?.code === 503) return fail(errorFromWire({ code: 'NOT_FOUND', message: `sandbox ${this.sb.id} does not answer (ended, or its node is gone)`, retryable: false }));
        const ev = decode(m.data) as PortEvent | Reply<unknown>;
        if ('ok' in ev) {
          if (!ev.ok) fail(errorFromWire(ev.error));
          return;
        }
        switch (ev.t) {
          case 'open':
            conn = new PortConnection(this.sb, ev.connId, () => sub.unsubscribe());
            settle?.resolve(conn);
            return;
          case 'd':
            conn?.received(Buffer.from(ev.d));
            return;
          case 'end':
            conn?.push(null);
            return;
          case 'error':
            fail(errorFromWire(ev.error));
            return;
        }
      },
    });
    const fail = (e: Error) => {
      if (conn) conn.destroy(e);
      else {
        sub.unsubscribe();
        settle?.reject(e);
      }
    };
    this.sb.nc.publish(subjects.sandbox(this.sb.id, 'ports.connect'), encode({ port, window: PORT_WINDOW_BYTES }), { reply: inbox });
    const ms = opts.timeoutMs ?? OPEN_TIMEOUT_MS;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new TimeoutError('TIMEOUT', `port ${port} of sandbox ${this.sb.id} did not open within ${ms} ms`)), ms);
    });
    try {
      return await Promise.race([opened, timeout]);
    } catch (e) {
      sub.unsubscribe();
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  /** `http://127.0.0.1:<p>/` on the sandbox's node (reachable from that host): each connection to it is one to `port` inside. */
  async url(port: number, opts?: CallOptions): Promise<string> {
    return (await this.sb.call<PortsUrlReply>('ports.url', { port }, opts)).url;
  }
}

class PortConnection extends Duplex {
  private closedRemote = false;
  /** Bytes received from the node, credited back as the reader takes them. */
  private readonly credits: Credits;

  constructor(
    private readonly sb: PortsHost,
    readonly connId: string,
    private readonly unsubscribe: () => void,
  ) {
    // A window's worth may wait here for the reader: a smaller mark would credit in small steps.
    // Not half-open: once the node says `end` the connection is gone there, writes and all.
    super({ readableHighWaterMark: PORT_WINDOW_BYTES, allowHalfOpen: false });
    this.credits = new Credits(PORT_WINDOW_BYTES, (received) => sb.tell('ports.credit', { connId, received }));
    this.once('end', () => {
      this.closedRemote = true;
    });
  }

  /** Bytes from the server: into the stream, credited at once while the reader keeps up. */
  received(d: Buffer): void {
    this.credits.add(d.length);
    if (this.push(d)) this.credits.offer();
  }

  override _read(): void {
    // The reader wants more: what it has taken is credited, and the node sends on.
    this.credits.offer();
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    const max = Limits.files.chunkMax;
    const parts: Buffer[] = [];
    for (let i = 0; i < chunk.length; i += max) parts.push(chunk.subarray(i, i + max));
    parts
      .reduce<Promise<unknown>>((p, d) => p.then(() => this.sb.call('ports.send', { connId: this.connId, d })), Promise.resolve())
      .then(
        () => cb(),
        (e: Error) => cb(e),
      );
  }

  override _final(cb: (err?: Error | null) => void): void {
    // The server closed first: the node's side is gone with it, nothing to half-close.
    if (this.closedRemote) {
      cb();
      return;
    }
    this.sb.call('ports.send', { connId: this.connId, end: true }).then(
      () => cb(),
      (e: Error) => cb(e),
    );
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    this.unsubscribe();
    if (!this.closedRemote) void this.sb.call('ports.close', { connId: this.connId }).catch(() => {});
    cb(err);
  }
}
