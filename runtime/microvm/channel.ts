/**
 * The host side of the guest agent's protocol (agent.c) over the virtio-serial port's unix socket.
 * Frames: u32 payload length, u16 type, u16 zero, u32 id (little-endian), then the payload. The
 * guest is not trusted: a frame longer than MAX_FRAME, of an unknown type, or for an id nobody
 * waits for cuts the channel (`onBroken`), and the sandbox is failed, not the node.
 */
import type { Socket } from 'node:net';
import { ProtocolError } from '../../protocol/index.ts';
import { connectUnix } from './qmp.ts';

export const T = { EXEC: 1, STDIN: 2, KILL: 3, FREAD: 4, FWRITE: 5, FLIST: 6, FREMOVE: 7, SYNC: 8, PING: 9, NET: 10, OUT: 101, ERR: 102, EXIT: 103, REPLY: 104 } as const;
const MAX_FRAME = 2 * 1024 * 1024 + 64;

export interface ExecSink {
  out(chunk: Buffer): void;
  err(chunk: Buffer): void;
  /** `limits`: the guest's bits for the sandbox's limits biting while it ran (agent.c EXIT_OOM, EXIT_PIDS). */
  exit(status: number, limits?: number): void;
}

export class AgentChannel {
  private buf: Buffer = Buffer.alloc(0);
  private seq = 0;
  private readonly replies = new Map<number, { resolve(v: { err: number; data: Buffer }): void; reject(e: Error): void }>();
  private readonly execs = new Map<number, ExecSink>();
  broken?: string;
  onBroken?: (why: string) => void;

  private constructor(private readonly sock: Socket) {
    sock.on('data', (d: Buffer) => this.data(d));
    sock.on('close', () => this.fail('the agent channel closed'));
    sock.on('error', (e) => this.fail(`agent channel: ${e.message}`));
  }

  static async open(path: string, timeoutMs = 10_000): Promise<AgentChannel> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        const sock = await connectUnix(path);
        sock.setNoDelay(true);
        return new AgentChannel(sock);
      } catch (e) {
        if (Date.now() > deadline) throw new ProtocolError('BACKEND_FAILED', `microvm: agent socket ${path}: ${(e as Error).message}`);
        await new Promise((r) => setTimeout(r, 5));
      }
    }
  }

  private fail(why: string): void {
    if (this.broken) return;
    this.broken = why;
    this.sock.destroy();
    const e = new ProtocolError('BACKEND_FAILED', `microvm: ${why}`);
    for (const w of this.replies.values()) w.reject(e);
    this.replies.clear();
    for (const x of this.execs.values()) x.exit(-1);
    this.execs.clear();
    this.onBroken?.(why);
  }

  private data(d: Buffer): void {
    this.buf = this.buf.length === 0 ? d : Buffer.concat([this.buf, d]);
    let off = 0;
    while (this.buf.length - off >= 12) {
      const len = this.buf.readUInt32LE(off);
      const type = this.buf.readUInt16LE(off + 4);
      const id = this.buf.readUInt32LE(off + 8);
      if (len > MAX_FRAME) { this.fail(`the guest sent a frame of ${len} bytes`); return; }
      if (this.buf.length - off < 12 + len) break;
      const pl = this.buf.subarray(off + 12, off + 12 + len);
      off += 12 + len;
      if (type === T.REPLY) {
        const w = this.replies.get(id);
        if (!w || len < 4) { this.fail(`the guest sent a reply nobody asked for (${id})`); return; }
        this.replies.delete(id);
        w.resolve({ err: pl.readInt32LE(0), data: Buffer.from(pl.subarray(4)) });
      } else if (type === T.OUT || type === T.ERR || type === T.EXIT) {
        const x = this.execs.get(id);
        // Output of an exec the host already gave up on (killed, timed out) is dropped.
        if (!x) continue;
        if (type === T.OUT) x.out(Buffer.from(pl));
        else if (type === T.ERR) x.err(Buffer.from(pl));
        else {
          this.execs.delete(id);
          x.exit(len >= 4 ? pl.readInt32LE(0) : -1, len >= 8 ? pl.readUInt32LE(4) : 0);
        }
      } else { this.fail(`the guest sent a frame of unknown type ${type}`); return; }
    }
    this.buf = off === this.buf.length ? Buffer.alloc(0) : this.buf.subarray(off);
  }

  private send(type: number, id: number, ...parts: Buffer[]): void {
    const len = parts.reduce((n, p) => n + p.length, 0);
    const h = Buffer.alloc(12);
    h.writeUInt32LE(len, 0);
    h.writeUInt16LE(type, 4);
    h.writeUInt32LE(id, 8);
    this.sock.write(Buffer.concat([h, ...parts]));
  }

  /** A request with one reply; `err` is the guest's errno (0: done). */
  request(type: number, ...parts: Buffer[]): Promise<{ err: number; data: Buffer }> {
    if (this.broken) return Promise.reject(new ProtocolError('BACKEND_FAILED', `microvm: ${this.broken}`));
    const id = ++this.seq;
    return new Promise((resolve, reject) => {
      this.replies.set(id, { resolve, reject });
      this.send(type, id, ...parts);
    });
  }

  /** Starts a process; returns its id for stdin and kill. */
  exec(cmd: string[], env: string[], cwd: string, sink: ExecSink): number {
    if (this.broken) throw new ProtocolError('BACKEND_FAILED', `microvm: ${this.broken}`);
    const id = ++this.seq;
    const head = Buffer.alloc(8);
    head.writeUInt32LE(cmd.length, 0);
    head.writeUInt32LE(env.length, 4);
    const z = (s: string) => Buffer.from(`${s}\0`);
    this.execs.set(id, sink);
    this.send(T.EXEC, id, head, z(cwd), ...cmd.map(z), ...env.map(z));
    return id;
  }

  stdin(id: number, data: Buffer): void {
    if (!this.broken) this.send(T.STDIN, id, data);
  }

  kill(id: number): void {
    if (!this.broken) this.send(T.KILL, id);
  }

  /** Stops listening to an exec (its process is killed separately). */
  forget(id: number): void {
    this.execs.delete(id);
  }

  close(): void {
    this.broken ??= 'closed';
    this.sock.destroy();
  }
}
