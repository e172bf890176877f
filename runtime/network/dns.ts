/**
 * The DNS filter: the only resolver a networked sandbox has. It answers names its policy allows by
 * asking the node's upstream resolver, refuses every other name (REFUSED, no upstream query), and
 * tells the caller which addresses it handed out so that they can be opened for the record's TTL.
 * A refused name never leaves the node, so DNS cannot carry data out of the sandbox.
 */
import { createSocket, type Socket } from 'node:dgram';
import { readFileSync } from 'node:fs';

const RCODE_SERVFAIL = 2;
const RCODE_REFUSED = 5;
const TYPE_A = 1;
const UPSTREAM_TIMEOUT_MS = 3000;
/** Addresses stay open at least this long, whatever the TTL (clients cache longer than they should). */
export const MIN_OPEN_SEC = 60;
export const MAX_OPEN_SEC = 3600;

export interface Question {
  id: number;
  name: string;
  type: number;
  /** Offset just past the question section. */
  end: number;
}

/** Reads a possibly compressed name at `off`; returns it and the offset after it in place. */
function readName(buf: Buffer, off: number): { name: string; next: number } {
  const labels: string[] = [];
  let next = -1;
  for (let hops = 0; hops < 64; hops++) {
    if (off >= buf.length) throw new Error('name past the end');
    const len = buf[off] as number;
    if (len === 0) {
      if (next < 0) next = off + 1;
      return { name: labels.join('.'), next };
    }
    if ((len & 0xc0) === 0xc0) {
      if (next < 0) next = off + 2;
      off = ((len & 0x3f) << 8) | (buf[off + 1] as number);
      continue;
    }
    if (len > 63 || off + 1 + len > buf.length) throw new Error('bad label');
    labels.push(buf.toString('latin1', off + 1, off + 1 + len));
    off += 1 + len;
  }
  throw new Error('name loop');
}

/** The first question of a query, or null if the packet is not one we can read. */
export function parseQuery(buf: Buffer): Question | null {
  try {
    if (buf.length < 12) return null;
    if ((buf[2] as number) & 0x80) return null; // a response, not a query
    if (buf.readUInt16BE(4) !== 1) return null;
    const { name, next } = readName(buf, 12);
    if (next + 4 > buf.length) return null;
    return { id: buf.readUInt16BE(0), name: name.toLowerCase(), type: buf.readUInt16BE(next), end: next + 4 };
  } catch {
    return null;
  }
}

/** A reply with no answers and `rcode`, echoing the question. */
export function errorReply(query: Buffer, q: Question, rcode: number): Buffer {
  const out = Buffer.from(query.subarray(0, q.end));
  out[2] = 0x80 | ((query[2] as number) & 0x01); // QR, keep RD
  out[3] = 0x80 | rcode; // RA
  out.writeUInt16BE(1, 4);
  out.writeUInt16BE(0, 6);
  out.writeUInt16BE(0, 8);
  out.writeUInt16BE(0, 10);
  return out;
}

/** A records of a response: address and TTL. */
export function answersOf(buf: Buffer): Array<{ addr: string; ttl: number }> {
  const out: Array<{ addr: string; ttl: number }> = [];
  try {
    const qd = buf.readUInt16BE(4);
    const an = buf.readUInt16BE(6);
    let off = 12;
    for (let i = 0; i < qd; i++) off = readName(buf, off).next + 4;
    for (let i = 0; i < an; i++) {
      off = readName(buf, off).next;
      const type = buf.readUInt16BE(off);
      const ttl = buf.readUInt32BE(off + 4);
      const len = buf.readUInt16BE(off + 8);
      off += 10;
      if (type === TYPE_A && len === 4) out.push({ addr: [...buf.subarray(off, off + 4)].join('.'), ttl });
      off += len;
    }
  } catch {
    // a truncated answer: what was read so far
  }
  return out;
}

/** The resolver the node itself uses: $PADDOCK_DNS_UPSTREAM (host:port), else resolv.conf's first. */
export function upstreamOf(env: NodeJS.ProcessEnv = process.env): { host: string; port: number } {
  const u = env.PADDOCK_DNS_UPSTREAM;
  if (u) {
    const i = u.lastIndexOf(':');
    return i > 0 ? { host: u.slice(0, i), port: Number(u.slice(i + 1)) } : { host: u, port: 53 };
  }
  try {
    const m = /^nameserver\s+(\d+\.\d+\.\d+\.\d+)/m.exec(readFileSync('/etc/resolv.conf', 'utf8'));
    if (m?.[1]) return { host: m[1], port: 53 };
  } catch {
    // none
  }
  return { host: '127.0.0.1', port: 53 };
}

export interface FilterOptions {
  /** Address to listen on (the sandbox's gateway); port 53. */
  address: string;
  port?: number;
  allowed: (name: string) => boolean;
  /** Called with the A records of an allowed answer, before the answer is sent: open them. */
  onAnswer: (addrs: Array<{ addr: string; ttl: number }>) => Promise<void>;
  upstream?: { host: string; port: number };
}

/** One sandbox's resolver. */
export class DnsFilter {
  private sock?: Socket;
  constructor(private readonly o: FilterOptions) {}

  async start(): Promise<void> {
    const sock = createSocket({ type: 'udp4', reuseAddr: false });
    sock.on('message', (msg, rinfo) => void this.answer(msg).then((r) => r && sock.send(r, rinfo.port, rinfo.address)));
    sock.on('error', () => {});
    await new Promise<void>((resolve, reject) => {
      sock.once('error', reject);
      sock.bind(this.o.port ?? 53, this.o.address, () => {
        sock.off('error', reject);
        resolve();
      });
    });
    this.sock = sock;
  }

  /** The reply to one query, or null to drop it. */
  async answer(msg: Buffer): Promise<Buffer | null> {
    const q = parseQuery(msg);
    if (!q) return null;
    if (!this.o.allowed(q.name)) return errorReply(msg, q, RCODE_REFUSED);
    const reply = await ask(msg, this.o.upstream ?? upstreamOf()).catch(() => null);
    if (!reply) return errorReply(msg, q, RCODE_SERVFAIL);
    const addrs = answersOf(reply);
    if (addrs.length > 0) await this.o.onAnswer(addrs).catch(() => {});
    return reply;
  }

  close(): void {
    this.sock?.close();
    this.sock = undefined;
  }
}

function ask(query: Buffer, up: { host: string; port: number }): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const s = createSocket('udp4');
    const timer = setTimeout(() => {
      s.close();
      reject(new Error('upstream timeout'));
    }, UPSTREAM_TIMEOUT_MS);
    s.on('message', (m) => {
      if (m.length >= 2 && m.readUInt16BE(0) === query.readUInt16BE(0)) {
        clearTimeout(timer);
        s.close();
        resolve(m);
      }
    });
    s.on('error', (e) => {
      clearTimeout(timer);
      s.close();
      reject(e);
    });
    s.send(query, up.port, up.host);
  });
}
