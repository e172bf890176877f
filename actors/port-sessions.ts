/**
 * Connections to TCP ports inside one sandbox, made by its backend from the node's side
 * (runtime/backend.ts PortForwarding): over NATS (`ports.connect` events on the caller's inbox,
 * `ports.send` for the other direction, `ports.close`) and as a plain TCP listener on the node's
 * loopback (`ports.url`), each accepted connection one connection inside. All of them end with
 * the sandbox.
 */
import { createServer, type Server, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { NatsConnection } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { encode, type PortEvent, ProtocolError, SendWindow, toWireError } from '../protocol/index.ts';

/** Connections one sandbox may hold open over NATS at once. */
export const PORT_CONNECTIONS_MAX = 64;
/** A NATS connection nothing went through for this long is closed (its caller may be gone). */
export const PORT_IDLE_MS = 10 * 60_000;

interface Conn {
  stream: Duplex;
  reply: string;
  lastAt: number;
  /** Bytes sent, against ports.connect's window and the caller's credits. */
  out: SendWindow;
}

export interface PortSessionsDeps {
  sandbox: string;
  nc: NatsConnection;
  log: Logger;
  connect: (port: number) => Promise<Duplex>;
  /** Largest NATS message: output is cut into chunks that fit. */
  maxPayload: number;
  idleMs?: number;
}

export class PortSessions {
  private readonly conns = new Map<string, Conn>();
  private readonly listeners = new Map<number, Promise<{ server: Server; url: string }>>();
  private readonly sockets = new Set<Socket>();
  private seq = 0;
  private closed = false;
  private sweeper?: NodeJS.Timeout;

  constructor(private readonly d: PortSessionsDeps) {}

  /**
   * Opens a connection whose events go to `reply`: `open` first, then the server's bytes, then
   * `end`. With a `window`, the server is not read while that many bytes wait for the caller's
   * credit: a caller that reads slowly (an HTTP client behind the gateway) holds the server back,
   * as a slow TCP peer would, instead of having every byte pile up on its way to it.
   */
  async connect(port: number, reply: string | undefined, window?: number): Promise<void> {
    if (!reply) throw new ProtocolError('INVALID_REQUEST', 'ports.connect needs a reply subject (the inbox its events go to)');
    this.open();
    if (this.conns.size >= PORT_CONNECTIONS_MAX) throw new ProtocolError('NO_CAPACITY', `sandbox ${this.d.sandbox} has ${PORT_CONNECTIONS_MAX} port connections open: close one first`, { detail: { reason: 'port_connections', max: PORT_CONNECTIONS_MAX } });
    const stream = await this.d.connect(port);
    if (this.closed) {
      stream.destroy();
      throw new ProtocolError('INVALID_STATE', `sandbox ${this.d.sandbox} is ending`);
    }
    const connId = `p${++this.seq}${Math.random().toString(36).slice(2, 8)}`;
    const conn: Conn = { stream, reply, lastAt: Date.now(), out: new SendWindow(window) };
    this.conns.set(connId, conn);
    const send = (ev: PortEvent) => {
      try {
        this.d.nc.publish(reply, encode(ev));
      } catch (err) {
        this.d.log.debug({ err, connId }, 'port event not sent');
      }
    };
    send({ t: 'open', connId });
    // Chunks well under a NATS message, whatever the server writes at once.
    const max = Math.max(1024, this.d.maxPayload - 1024);
    stream.on('data', (b: Buffer) => {
      conn.lastAt = Date.now();
      for (let i = 0; i < b.length; i += max) send({ t: 'd', d: b.subarray(i, i + max) });
      conn.out.sent += b.length;
      if (conn.out.full()) stream.pause();
    });
    let ended = false;
    const finish = (ev: PortEvent) => {
      if (ended) return;
      ended = true;
      this.conns.delete(connId);
      send(ev);
    };
    stream.once('end', () => finish({ t: 'end' }));
    stream.once('close', () => finish({ t: 'end' }));
    stream.once('error', (err) => finish({ t: 'error', error: toWireError(new ProtocolError('BACKEND_FAILED', `port ${port}: ${err.message}`)) }));
  }

  /** Bytes for the server; answered once they are written (the caller's flow control). */
  async send(connId: string, d: Uint8Array | undefined, end: boolean): Promise<Record<string, never>> {
    const c = this.conn(connId);
    c.lastAt = Date.now();
    if (d && d.length > 0) {
      await new Promise<void>((resolve, reject) => {
        c.stream.write(d, (err) => (err ? reject(new ProtocolError('BACKEND_FAILED', `connection ${connId}: ${err.message}`)) : resolve()));
      });
    }
    if (end) c.stream.end();
    return {};
  }

  /** The caller has taken `received` bytes: the server is read again once less than a window waits. */
  credit(connId: string, received: number): Record<string, never> {
    const c = this.conns.get(connId);
    if (!c || c.out.window === undefined) return {};
    c.lastAt = Date.now();
    c.out.credit(received);
    if (c.stream.isPaused() && !c.out.full()) c.stream.resume();
    return {};
  }

  close(connId: string): { closed: boolean } {
    const c = this.conns.get(connId);
    if (!c) return { closed: false };
    c.stream.destroy();
    return { closed: true };
  }

  /** `http://127.0.0.1:<p>/` on the node: a TCP listener whose every connection is one to `port` inside. */
  async url(port: number): Promise<{ url: string; port: number }> {
    this.open();
    let l = this.listeners.get(port);
    if (!l) {
      l = this.listen(port);
      this.listeners.set(port, l);
      l.catch(() => this.listeners.delete(port));
    }
    return { url: (await l).url, port };
  }

  private async listen(port: number): Promise<{ server: Server; url: string }> {
    // Refuse now, not at the first connection, when nothing listens inside.
    (await this.d.connect(port)).destroy();
    const server = createServer((sock) => {
      this.sockets.add(sock);
      sock.once('close', () => this.sockets.delete(sock));
      sock.on('error', () => {});
      sock.pause();
      this.d.connect(port).then(
        (inner) => {
          if (sock.destroyed) return inner.destroy();
          inner.on('error', () => sock.destroy());
          sock.pipe(inner).pipe(sock);
          sock.once('close', () => inner.destroy());
          sock.resume();
        },
        () => sock.destroy(),
      );
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => resolve());
    });
    const a = server.address();
    if (!a || typeof a === 'string') throw new ProtocolError('INTERNAL', 'the port listener has no address');
    return { server, url: `http://127.0.0.1:${a.port}/` };
  }

  private conn(connId: string): Conn {
    const c = this.conns.get(connId);
    if (!c) throw new ProtocolError('NOT_FOUND', `no connection ${connId} in sandbox ${this.d.sandbox} (it ended, or never was)`, { detail: { connId } });
    return c;
  }

  private open(): void {
    if (this.closed) throw new ProtocolError('INVALID_STATE', `sandbox ${this.d.sandbox} is ending`);
    if (!this.sweeper) {
      const idle = this.d.idleMs ?? PORT_IDLE_MS;
      this.sweeper = setInterval(() => {
        const now = Date.now();
        for (const c of this.conns.values()) if (now - c.lastAt > idle) c.stream.destroy();
      }, Math.min(idle, 60_000));
      this.sweeper.unref();
    }
  }

  /** Every connection and listener ends (the sandbox does). */
  closeAll(): void {
    this.closed = true;
    clearInterval(this.sweeper);
    for (const c of this.conns.values()) c.stream.destroy();
    for (const s of this.sockets) s.destroy();
    for (const l of this.listeners.values()) void l.then(({ server }) => server.close(), () => {});
    this.listeners.clear();
  }
}
