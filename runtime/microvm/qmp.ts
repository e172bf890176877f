/** A QMP client: QEMU's JSON control protocol on the unix socket the node gave the VMM. */
import { connect, type Socket } from 'node:net';
import { ProtocolError } from '../../protocol/index.ts';

export class Qmp {
  private buf = '';
  private seq = 0;
  private readonly waiting = new Map<string, { resolve(v: unknown): void; reject(e: Error): void }>();
  private greeted!: Promise<void>;
  closed = false;

  private constructor(
    private readonly sock: Socket,
    private readonly why: () => string,
  ) {}

  /**
   * Connects (retrying while QEMU creates its socket) and leaves capabilities negotiation done.
   * `why`: what the VMM said before it went (its stderr's last lines), for the error then.
   */
  static async open(path: string, timeoutMs = 10_000, why: () => string = () => ''): Promise<Qmp> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        const sock = await connectUnix(path);
        const q = new Qmp(sock, why);
        q.start();
        await q.greeted;
        await q.cmd('qmp_capabilities');
        return q;
      } catch (e) {
        if (Date.now() > deadline) throw new ProtocolError('BACKEND_FAILED', `microvm: QMP at ${path}: ${(e as Error).message}`);
        await new Promise((r) => setTimeout(r, 5));
      }
    }
  }

  private start(): void {
    let greet!: () => void;
    let fail!: (e: Error) => void;
    this.greeted = new Promise<void>((resolve, reject) => {
      greet = resolve;
      fail = reject;
    });
    this.sock.setEncoding('utf8');
    this.sock.on('data', (d: string) => {
      this.buf += d;
      for (let i = this.buf.indexOf('\n'); i >= 0; i = this.buf.indexOf('\n')) {
        const line = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 1);
        if (!line.trim()) continue;
        let m: { QMP?: unknown; id?: string; return?: unknown; error?: { desc: string } };
        try {
          m = JSON.parse(line);
        } catch {
          continue;
        }
        if (m.QMP) greet();
        else if (m.id !== undefined) {
          const w = this.waiting.get(m.id);
          this.waiting.delete(m.id);
          if (m.error) w?.reject(new ProtocolError('BACKEND_FAILED', `microvm: QMP: ${m.error.desc}`));
          else w?.resolve(m.return);
        }
      }
    });
    const gone = () => {
      this.closed = true;
      fail(new Error('QMP socket closed'));
      for (const w of this.waiting.values()) w.reject(this.wentAway());
      this.waiting.clear();
    };
    this.sock.on('close', gone);
    this.sock.on('error', gone);
  }

  cmd<T = unknown>(execute: string, args?: Record<string, unknown>): Promise<T> {
    if (this.closed) return Promise.reject(this.wentAway());
    const id = String(++this.seq);
    return new Promise<T>((resolve, reject) => {
      this.waiting.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.sock.write(`${JSON.stringify({ execute, ...(args ? { arguments: args } : {}), id })}\n`);
    });
  }

  /** Waits for an outgoing or incoming migration to end; throws if it failed. */
  async migrated(incoming = false): Promise<void> {
    for (;;) {
      if (incoming) {
        const s = await this.cmd<{ status: string }>('query-status');
        if (s.status !== 'inmigrate') return;
      } else {
        const m = await this.cmd<{ status?: string; 'error-desc'?: string }>('query-migrate');
        if (m.status === 'completed') return;
        if (m.status === 'failed' || m.status === 'cancelled') throw new ProtocolError('BACKEND_FAILED', `microvm: migration ${m.status}: ${m['error-desc'] ?? ''}`);
      }
      await new Promise((r) => setTimeout(r, 2));
    }
  }

  private wentAway(): ProtocolError {
    const said = this.why();
    return new ProtocolError('BACKEND_FAILED', `microvm: the VMM went away${said ? `: ${said}` : ''}`);
  }

  close(): void {
    this.closed = true;
    this.sock.destroy();
  }
}

/** One connection attempt to a unix socket (QEMU may not have made it yet: callers retry). */
export function connectUnix(path: string): Promise<Socket> {
  return new Promise<Socket>((resolve, reject) => {
    const s = connect(path);
    s.once('connect', () => resolve(s));
    s.once('error', reject);
  });
}
