/**
 * A read-only FUSE filesystem of one flat directory, spoken directly over /dev/fuse: no libfuse,
 * no native addon (npm skips install scripts here, and the kernel protocol for a flat read-only
 * tree is a dozen message types). Each file's bytes come from an async `read` callback, so a
 * file can be filled from the network the first time the kernel asks for a range of it.
 *
 * Reads of /dev/fuse block, and Node can only do them on libuv's thread pool: the process that
 * runs this must start with a UV_THREADPOOL_SIZE larger than `readers`, or replies and cache I/O
 * starve. Replies are written synchronously (a /dev/fuse write never blocks).
 */
import { spawn } from 'node:child_process';
import { closeSync, openSync, read, writeSync } from 'node:fs';

const OP = {
  LOOKUP: 1,
  FORGET: 2,
  GETATTR: 3,
  OPEN: 14,
  READ: 15,
  STATFS: 17,
  RELEASE: 18,
  GETXATTR: 22,
  LISTXATTR: 23,
  FLUSH: 25,
  INIT: 26,
  OPENDIR: 27,
  READDIR: 28,
  RELEASEDIR: 29,
  ACCESS: 34,
  INTERRUPT: 36,
  DESTROY: 38,
  BATCH_FORGET: 42,
} as const;

export const Errno = { EPERM: 1, ENOENT: 2, EIO: 5, EBADF: 9, EACCES: 13, ENOTDIR: 20, EISDIR: 21, EINVAL: 22, EROFS: 30, ENOSYS: 38 } as const;

/** An error the kernel passes to the reading process as `-errno`. */
export class FuseError extends Error {
  constructor(
    readonly errno: number,
    message: string,
  ) {
    super(message);
  }
}

const IN_HEADER = 40;
const OUT_HEADER = 16;
const ROOT = 1n;
const S_IFDIR = 0o040000;
const S_IFREG = 0o100000;
const FUSE_ASYNC_READ = 1 << 0;
const FUSE_MAX_PAGES = 1 << 22;
const FOPEN_KEEP_CACHE = 1 << 1;
/** Largest READ the kernel may send: 256 pages. */
const MAX_PAGES = 256;
const MAX_WRITE = 4096;
/** Files never change (content-addressed), so the kernel may keep names and sizes for an hour. */
const VALID_SEC = 3600n;

export interface FuseFile {
  name: string;
  size: number;
}

export interface FuseHandlers {
  read(name: string, offset: number, length: number): Promise<Buffer>;
  /** A name the directory does not list yet: return its file if it can be had, else null. */
  resolve?(name: string): FuseFile | null;
  onError?(err: unknown): void;
  /** The kernel ended the connection (ENODEV): the mount and every file open on it are gone. */
  onEnd?(): void;
}

function header(len: number, error: number, unique: bigint): Buffer {
  const b = Buffer.alloc(OUT_HEADER);
  b.writeUInt32LE(len, 0);
  b.writeInt32LE(error, 4);
  b.writeBigUInt64LE(unique, 8);
  return b;
}

/** struct fuse_attr (88 bytes). */
function attr(ino: bigint, size: number, mode: number, nlink: number): Buffer {
  const b = Buffer.alloc(88);
  b.writeBigUInt64LE(ino, 0);
  b.writeBigUInt64LE(BigInt(size), 8);
  b.writeBigUInt64LE(BigInt(Math.ceil(size / 512)), 16);
  b.writeUInt32LE(mode, 60);
  b.writeUInt32LE(nlink, 64);
  b.writeUInt32LE(4096, 80);
  return b;
}

/** The mount(2) syscall number: perl calls it for us (Node has no mount, and mount(8) would add a loop device). */
export function mountSyscall(): number {
  if (process.arch === 'x64') return 165;
  if (process.arch === 'arm64') return 40;
  throw new Error(`no mount(2) number known for ${process.arch}`);
}

/**
 * mount(2) through perl (perl-base is Essential on Debian): `fd` of the caller is passed to the
 * child as its fd 3, for FUSE's `fd=3` option. Rejects with the kernel's errno text.
 */
export function sysMount(source: string, target: string, fstype: string, flags: number, data: string, fd?: number): Promise<void> {
  const script = 'my ($s,$t,$f,$fl,$d)=@ARGV; my $r = syscall($ENV{PDK_NR}+0, $s, $t, $f, $fl+0, length($d) ? $d : 0); if ($r != 0) { print STDERR "$!\\n"; exit 1 }';
  return new Promise((resolve, reject) => {
    const child = spawn('perl', ['-e', script, source, target, fstype, String(flags), data], {
      stdio: fd === undefined ? ['ignore', 'ignore', 'pipe'] : ['ignore', 'ignore', 'pipe', fd],
      env: { PDK_NR: String(mountSyscall()), PATH: process.env.PATH ?? '/usr/bin:/bin' },
    });
    let err = '';
    child.stderr?.on('data', (d: Buffer) => {
      err += d.toString();
    });
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`mount ${fstype} ${source} on ${target}: ${err.trim() || `exit ${code}`}`))));
  });
}

export const MS_RDONLY = 1;

/**
 * One FUSE mount serving a flat directory. `add` makes a file appear; its reads go to `handlers.read`.
 */
export class FuseServer {
  private fd = -1;
  private readonly byName = new Map<string, { ino: bigint; size: number }>();
  private readonly byIno = new Map<bigint, string>();
  private nextIno = 2n;
  private closed = false;
  /** Requests being answered: counted so that `close` can say whether some were cut short. */
  inflight = 0;

  constructor(
    readonly mountpoint: string,
    private readonly handlers: FuseHandlers,
    private readonly readers = 4,
    /** Largest read-ahead the kernel may do on these files, in bytes; undefined: what it proposes (128 KiB). */
    private readonly maxReadahead?: number,
  ) {}

  add(file: FuseFile): void {
    const cur = this.byName.get(file.name);
    if (cur) {
      cur.size = file.size;
      return;
    }
    const ino = this.nextIno++;
    this.byName.set(file.name, { ino, size: file.size });
    this.byIno.set(ino, file.name);
  }

  has(name: string): boolean {
    return this.byName.has(name);
  }

  async mount(): Promise<void> {
    this.fd = openSync('/dev/fuse', 'r+');
    try {
      await sysMount('paddock-layers', this.mountpoint, 'fuse.paddock', MS_RDONLY, 'fd=3,rootmode=40000,user_id=0,group_id=0,allow_other', this.fd);
    } catch (e) {
      closeSync(this.fd);
      this.fd = -1;
      throw e;
    }
    for (let i = 0; i < this.readers; i++) this.loop();
  }

  private loop(): void {
    const buf = Buffer.alloc(IN_HEADER + MAX_WRITE + 64 * 1024);
    const next = () => {
      if (this.closed) return;
      read(this.fd, buf, 0, buf.length, null, (err, n) => {
        if (err) {
          // ENOENT: a request was interrupted before we read it; ENODEV: unmounted.
          const code = (err as NodeJS.ErrnoException).code;
          if (code === 'ENOENT' || code === 'EINTR' || code === 'EAGAIN') {
            next();
            return;
          }
          const wasOpen = !this.closed;
          this.closed = true;
          if (wasOpen && code === 'ENODEV') this.handlers.onEnd?.();
          return;
        }
        const msg = Buffer.from(buf.subarray(0, n));
        next();
        this.dispatch(msg);
      });
    };
    next();
  }

  private reply(unique: bigint, ...parts: Buffer[]): void {
    const len = OUT_HEADER + parts.reduce((s, p) => s + p.length, 0);
    this.write(Buffer.concat([header(len, 0, unique), ...parts], len));
  }

  private fail(unique: bigint, errno: number): void {
    this.write(header(OUT_HEADER, -errno, unique));
  }

  private write(b: Buffer): void {
    if (this.closed || this.fd < 0) return;
    try {
      writeSync(this.fd, b);
    } catch (err) {
      // ENOENT: the kernel gave up on the request (interrupted); anything else: we are unmounting.
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') this.handlers.onError?.(err);
    }
  }

  private entry(ino: bigint, size: number, mode: number, nlink: number): Buffer {
    const b = Buffer.alloc(40);
    b.writeBigUInt64LE(ino, 0);
    b.writeBigUInt64LE(VALID_SEC, 16);
    b.writeBigUInt64LE(VALID_SEC, 24);
    return Buffer.concat([b, attr(ino, size, mode, nlink)]);
  }

  private fileAttr(ino: bigint): Buffer | null {
    if (ino === ROOT) return attr(ROOT, 0, S_IFDIR | 0o755, 2);
    const name = this.byIno.get(ino);
    const f = name === undefined ? undefined : this.byName.get(name);
    return f ? attr(ino, f.size, S_IFREG | 0o444, 1) : null;
  }

  private dispatch(msg: Buffer): void {
    const opcode = msg.readUInt32LE(4);
    const unique = msg.readBigUInt64LE(8);
    const nodeid = msg.readBigUInt64LE(16);
    const body = msg.subarray(IN_HEADER);
    switch (opcode) {
      case OP.INIT: {
        const major = body.readUInt32LE(0);
        const out = Buffer.alloc(64);
        out.writeUInt32LE(7, 0);
        out.writeUInt32LE(31, 4);
        const proposed = body.readUInt32LE(8);
        out.writeUInt32LE(this.maxReadahead === undefined ? proposed : Math.min(proposed, this.maxReadahead), 8);
        out.writeUInt32LE(FUSE_ASYNC_READ | FUSE_MAX_PAGES, 12);
        out.writeUInt16LE(64, 16);
        out.writeUInt16LE(48, 18);
        out.writeUInt32LE(MAX_WRITE, 20);
        out.writeUInt32LE(1, 24);
        out.writeUInt16LE(MAX_PAGES, 28);
        if (major !== 7) {
          this.fail(unique, Errno.EINVAL);
          return;
        }
        this.reply(unique, out);
        return;
      }
      case OP.LOOKUP: {
        const name = body.subarray(0, body.indexOf(0)).toString();
        if (nodeid !== ROOT) {
          this.fail(unique, Errno.ENOENT);
          return;
        }
        let f = this.byName.get(name);
        if (!f && this.handlers.resolve) {
          const r = this.handlers.resolve(name);
          if (r) {
            this.add(r);
            f = this.byName.get(name);
          }
        }
        if (!f) {
          this.fail(unique, Errno.ENOENT);
          return;
        }
        this.reply(unique, this.entry(f.ino, f.size, S_IFREG | 0o444, 1));
        return;
      }
      case OP.GETATTR: {
        const a = this.fileAttr(nodeid);
        if (!a) {
          this.fail(unique, Errno.ENOENT);
          return;
        }
        const head = Buffer.alloc(16);
        head.writeBigUInt64LE(VALID_SEC, 0);
        this.reply(unique, head, a);
        return;
      }
      case OP.OPEN:
      case OP.OPENDIR: {
        const flags = body.readUInt32LE(0);
        if ((flags & 3) !== 0) {
          this.fail(unique, Errno.EROFS);
          return;
        }
        const out = Buffer.alloc(16);
        out.writeUInt32LE(opcode === OP.OPEN ? FOPEN_KEEP_CACHE : 0, 8);
        this.reply(unique, out);
        return;
      }
      case OP.READ: {
        const offset = Number(body.readBigUInt64LE(8));
        const size = body.readUInt32LE(16);
        const name = this.byIno.get(nodeid);
        const f = name === undefined ? undefined : this.byName.get(name);
        if (name === undefined || !f) {
          this.fail(unique, Errno.EBADF);
          return;
        }
        if (offset >= f.size) {
          this.reply(unique);
          return;
        }
        this.inflight++;
        this.handlers.read(name, offset, Math.min(size, f.size - offset)).then(
          (data) => {
            this.inflight--;
            this.reply(unique, data);
          },
          (err: unknown) => {
            this.inflight--;
            this.handlers.onError?.(err);
            this.fail(unique, err instanceof FuseError ? err.errno : Errno.EIO);
          },
        );
        return;
      }
      case OP.READDIR: {
        if (nodeid !== ROOT) {
          this.fail(unique, Errno.ENOTDIR);
          return;
        }
        const offset = Number(body.readBigUInt64LE(8));
        const size = body.readUInt32LE(16);
        const names: Array<[string, bigint, number]> = [
          ['.', ROOT, 4],
          ['..', ROOT, 4],
          ...[...this.byName].map(([n, f]): [string, bigint, number] => [n, f.ino, 8]),
        ];
        const parts: Buffer[] = [];
        let used = 0;
        for (let i = offset; i < names.length; i++) {
          const [n, ino, type] = names[i] as [string, bigint, number];
          const nb = Buffer.from(n);
          const len = (24 + nb.length + 7) & ~7;
          if (used + len > size) break;
          const d = Buffer.alloc(len);
          d.writeBigUInt64LE(ino, 0);
          d.writeBigUInt64LE(BigInt(i + 1), 8);
          d.writeUInt32LE(nb.length, 16);
          d.writeUInt32LE(type, 20);
          nb.copy(d, 24);
          parts.push(d);
          used += len;
        }
        this.reply(unique, ...parts);
        return;
      }
      case OP.STATFS: {
        const out = Buffer.alloc(80);
        out.writeUInt32LE(4096, 40);
        out.writeUInt32LE(255, 44);
        out.writeUInt32LE(4096, 48);
        this.reply(unique, out);
        return;
      }
      case OP.RELEASE:
      case OP.RELEASEDIR:
      case OP.FLUSH:
      case OP.DESTROY:
        this.reply(unique);
        return;
      case OP.FORGET:
      case OP.BATCH_FORGET:
      case OP.INTERRUPT:
        // No reply: forgets are advisory (names live as long as the mount), and an interrupted
        // read still ends within the fetch timeout.
        return;
      default:
        // GETXATTR, LISTXATTR, ACCESS and the writes: ENOSYS makes the kernel stop asking.
        this.fail(unique, Errno.ENOSYS);
        return;
    }
  }

  /** Whether the connection has ended (ENODEV, or close). */
  get ended(): boolean {
    return this.closed;
  }

  /** Stops serving; the caller unmounts. Reads still pending get ENOTCONN from the kernel. */
  close(): void {
    this.closed = true;
    if (this.fd >= 0) {
      try {
        closeSync(this.fd);
      } catch {
        // already gone
      }
      this.fd = -1;
    }
  }
}
