/**
 * Directory trees in and out of a sandbox's root as tar archives, under the same confinement as
 * the rest of the files API (files.ts): every directory is entered with O_NOFOLLOW from an fd of
 * the one above it, so an entry never goes through a symlink, whether the archive made it or the
 * sandbox had it; `..` in an entry's name is refused, never resolved; only regular files,
 * directories and symlinks are made. The tar format itself (headers, checksums, long names through
 * pax records) is node-tar's: its Parser reads the archive as it comes, its Header and Pax encode.
 *
 * Neither direction holds more than a chunk: an upload is fed one chunk at a time and answers
 * once the chunk's entries are on disk; a download is a generator pulled one chunk at a time,
 * walking with one directory fd open (going back up through `..`, checked to be the directory it
 * came down from, as tree-remove.ts does).
 */

import { closeSync, constants, fchmodSync, fchownSync, futimesSync, open as openCb, writeSync } from 'node:fs';
import { type FileHandle, lchown, lstat, mkdir, open, readdir, readlink, symlink, unlink } from 'node:fs/promises';
import { Header, Parser, Pax, type ReadEntry } from 'tar';
import { ProtocolError } from '../protocol/index.ts';
import { Semaphore } from './limit.ts';

/** open(2) through the thread pool, giving a plain fd (a small file's later calls are synchronous: see hold). */
function openFd(path: string, flags: number, mode: number): Promise<number> {
  return new Promise((resolve, reject) => openCb(path, flags, mode, (err, fd) => (err ? reject(err) : resolve(fd))));
}

const { O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_TRUNC, O_NOFOLLOW, O_NONBLOCK, O_DIRECTORY } = constants;
/** The process's umask (read once: reading it sets it, for a moment). */
const UMASK = (() => {
  const m = process.umask(0o022);
  process.umask(m);
  return m | 0o022;
})();

/** What the tree functions need of a sandbox's files API (RootFiles gives it). */
export interface TreeRoot {
  /** An fd of the existing directory `path` (resolved in-root as files.list does); the caller closes it. */
  openDirectory(path: string): Promise<FileHandle>;
  /** Owner of what is made (the sandbox's root on the host). */
  readonly owner?: { uid: number; gid: number };
  /** The only device whose directories may be entered, for one-filesystem roots. */
  device(): Promise<number | undefined>;
  /** Allocates a file range on the sandbox's account before it is written (DISK_LIMIT past its layer). */
  charge?(fd: number, offset: number, length: number): Promise<void>;
  /** The same for several ranges at once. */
  chargeMany?(ranges: Array<{ fd: number; offset: number; length: number }>): Promise<void>;
  /** The write rate limit of the root (files.ts's token bucket). */
  spend(bytes: number): Promise<void>;
}

export interface UploadProgress {
  entries: number;
  bytes: number;
  done: boolean;
}

const viaFd = (fd: number, name: string) => `/proc/self/fd/${fd}/${name}`;
const viaFdBytes = (fd: number, name: Buffer) => Buffer.concat([Buffer.from(`/proc/self/fd/${fd}/`), name]);
const errnoOf = (e: unknown) => (e as NodeJS.ErrnoException | undefined)?.code;

/** Entry types that are refused: what they would make is either a way out of the root or a device. */
/**
 * Files up to this size are written in batches (BATCH_FILES or BATCH_BYTES at a time): opened as
 * they come, their bytes held, then charged to the sandbox in one call and written. One charge is a
 * spawner run (~5 ms here): charged one by one, 10,000 small files took 50 s.
 */
const SMALL_FILE = 64 * 1024;
const BATCH_FILES = 128;
const BATCH_BYTES = 1024 * 1024;

/**
 * Upload chunks being unpacked at once, node-wide: each may hold a batch of open files (BATCH_FILES),
 * and the node's fds are one table for every sandbox (its hard limit here is 20,000).
 */
const unpacking = new Semaphore(8);

interface Pending {
  fd: number;
  parent: string[];
  name: string;
  data: Buffer;
  mode: number;
  mtime?: Date;
}

const REFUSED: Record<string, string> = {
  Link: 'a hardlink',
  CharacterDevice: 'a character device',
  BlockDevice: 'a block device',
  FIFO: 'a FIFO',
};

/**
 * Unpacks one tar archive into an existing directory, fed chunk by chunk. Each `write` resolves
 * once everything the chunk held is written. After an error nothing more is written: entries
 * before the failing one stay as written, a file cut short by it is removed, and every later call
 * gives the same error.
 */
export class TarUpload {
  private readonly parser: Parser;
  /** The writes of the entries parsed so far, in archive order. */
  private chain: Promise<void> = Promise.resolve();
  private error?: ProtocolError;
  private entries = 0;
  private bytes = 0;
  /** The directory the last entry went into, kept open for the next (archives list siblings together). */
  private cached?: { key: string; fh: FileHandle };
  /** The file being written, removed if the archive breaks before its end. */
  private open?: { fh: FileHandle; dir: FileHandle; name: string; written: number; path: string };
  private ended = false;
  private closed = false;
  /** Small files opened and waiting to be written together (SMALL_FILE). */
  private batch: Pending[] = [];
  private batchBytes = 0;

  private constructor(
    private readonly root: TreeRoot,
    private readonly dest: FileHandle,
    private readonly shown: string,
    private readonly dev: number | undefined,
  ) {
    this.parser = new Parser({ strict: true, onReadEntry: (e) => this.onEntry(e) });
    // Errors take their place behind the writes queued before them: `entries` then counts what stays.
    this.parser.on('error', (e: Error & { code?: string }) => this.failLater(new ProtocolError('INVALID_REQUEST', `${shown}: not a valid tar archive: ${e.message}`, { detail: { reason: e.code ?? 'TAR_BAD_ARCHIVE' } })));
  }

  /** NOT_FOUND, INVALID_REQUEST (not a directory) and FORBIDDEN come from opening the destination. */
  static async start(root: TreeRoot, path: string): Promise<TarUpload> {
    const dest = await root.openDirectory(path);
    return new TarUpload(root, dest, path, await root.device());
  }

  async write(chunk: Uint8Array): Promise<UploadProgress> {
    if (this.ended) throw new ProtocolError('INVALID_REQUEST', `${this.shown}: the upload has ended`);
    return unpacking.run(() => {
      if (!this.error) this.parser.write(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength));
      return this.settle();
    });
  }

  /** The archive ends here: it must be complete. */
  end(chunk?: Uint8Array): Promise<UploadProgress> {
    return unpacking.run(() => this.finish(chunk));
  }

  private async finish(chunk?: Uint8Array): Promise<UploadProgress> {
    if (chunk && chunk.length > 0 && !this.error) this.parser.write(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength));
    this.ended = true;
    if (!this.error) {
      const finished = new Promise<void>((r) => this.parser.once('end', () => r()));
      this.parser.end();
      await finished;
    }
    const p = await this.settle();
    await this.close();
    return { ...p, done: true };
  }

  /** Stops where it is (a caller that went away); what was written stays. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.ended = true;
    if (!this.error) this.error = new ProtocolError('CANCELLED', `${this.shown}: the upload was abandoned`);
    await this.chain.catch(() => {});
    await this.discardOpen();
    await this.discardBatch();
    await this.cached?.fh.close().catch(() => {});
    this.cached = undefined;
    await this.dest.close().catch(() => {});
  }

  private async settle(): Promise<UploadProgress> {
    // A chunk is answered once its files are on disk, held small ones included.
    this.enqueue(() => this.flush());
    await this.chain.catch(() => {});
    if (this.error) {
      await this.close();
      throw this.error;
    }
    return { entries: this.entries, bytes: this.bytes, done: false };
  }

  private failLater(e: unknown): void {
    // The small files held before the failing entry are written: they are among what stays.
    this.enqueue(() => this.flush());
    this.chain = this.chain.then(() => this.failWith(e));
  }

  private failWith(e: unknown): void {
    if (this.error) return;
    this.error = e instanceof ProtocolError ? e : toProtocolError(e, this.shown);
    if (this.error.detail?.entries === undefined) {
      this.error = new ProtocolError(this.error.code, this.error.message, { detail: { ...this.error.detail, entries: this.entries } });
    }
  }

  /** Queues the entry's work behind the entries before it; data arrives (synchronously) as the parser reads it. */
  private onEntry(e: ReadEntry): void {
    if (this.error) {
      e.resume();
      return;
    }
    let parts: string[];
    try {
      parts = entryParts(e.path);
      const refused = REFUSED[e.type];
      if (refused) throw new ProtocolError('FORBIDDEN', `${e.path}: ${refused}; only files, directories and symlinks can be uploaded`, { detail: { entry: e.path, type: e.type } });
      if (!['File', 'OldFile', 'ContiguousFile', 'Directory', 'SymbolicLink'].includes(e.type)) {
        throw new ProtocolError('INVALID_REQUEST', `${e.path}: tar entries of type ${e.type} are not supported`, { detail: { entry: e.path, type: e.type } });
      }
    } catch (err) {
      this.failLater(err);
      e.resume();
      return;
    }
    const mode = (e.mode ?? 0o644) & 0o7777;
    if (e.type !== 'SymbolicLink' && e.type !== 'Directory' && e.size <= SMALL_FILE) {
      const data: Buffer[] = [];
      e.on('data', (d: Buffer) => data.push(d));
      e.on('end', () => this.enqueue(() => this.hold(parts, mode, e.mtime, Buffer.concat(data), e.path)));
      return;
    }
    // Anything else waits for the held small files: a later entry may replace one of them.
    const then = (fn: () => Promise<void>) =>
      this.enqueue(async () => {
        await this.flush();
        await fn();
      });
    if (e.type === 'Directory') {
      if (parts.length > 0) then(() => this.makeDir(parts, mode, e.path));
      e.resume();
      return;
    }
    if (parts.length === 0) {
      this.failLater(new ProtocolError('INVALID_REQUEST', `${e.path}: an entry without a name`, { detail: { entry: e.path } }));
      e.resume();
      return;
    }
    if (e.type === 'SymbolicLink') {
      const target = e.linkpath ?? '';
      then(() => this.makeSymlink(parts, target, e.path));
      e.resume();
      return;
    }
    then(() => this.openFile(parts, mode, e.path));
    e.on('data', (d: Buffer) => then(() => this.writeData(d)));
    e.on('end', () => then(() => this.closeFile(mode, e.mtime)));
  }

  /** Queues `fn` behind the work before it; skipped once the upload has failed. (Not `then`: that would make the upload a thenable.) */
  private enqueue(fn: () => Promise<void>): void {
    this.chain = this.chain.then(async () => {
      if (this.error) return;
      try {
        await fn();
      } catch (err) {
        this.failWith(err);
      }
    });
  }

  /** Opens a small file now, writes it with the rest of its batch (flush). */
  private async hold(parts: string[], mode: number, mtime: Date | undefined, data: Buffer, entry: string): Promise<void> {
    const parent = parts.slice(0, -1);
    const dir = await this.dir(parent, entry);
    const name = parts[parts.length - 1] as string;
    // Twice in one batch: the earlier copy is written first, as the archive says.
    if (this.batch.some((p) => p.name === name && p.parent.join('/') === parent.join('/'))) {
      await this.flush();
      return this.hold(parts, mode, mtime, data, entry);
    }
    // Most names are new: O_EXCL makes a new regular file or fails, so no lstat before and no
    // fstat after (8 calls a file were 5.8 s of 10,000 files; each is a thread-pool round trip).
    // Only the open goes through the thread pool: its path lookup may reach a lower layer that is
    // loaded lazily. Everything after it is on the new file in the writable layer (tmpfs), microseconds
    // a call, synchronously: each was a ~60 µs round trip (10,000 files: 4 of 5 calls a file).
    const p = viaFd(dir.fd, name);
    let fd = await openFd(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK, mode & 0o777).catch((e: unknown) => {
      if (errnoOf(e) === 'EEXIST') return null;
      throw e;
    });
    if (fd === null) {
      await this.clear(dir, name, entry);
      fd = await openFd(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK, mode & 0o777);
    }
    this.batch.push({ fd, parent, name, data, mode, ...(mtime ? { mtime } : {}) });
    this.batchBytes += data.length;
    if (this.root.owner) fchownSync(fd, this.root.owner.uid, this.root.owner.gid);
    if (this.batch.length >= BATCH_FILES || this.batchBytes >= BATCH_BYTES) await this.flush();
  }

  private async flush(): Promise<void> {
    const batch = this.batch;
    if (batch.length === 0) return;
    await this.root.spend(this.batchBytes);
    const ranges = batch.filter((p) => p.data.length > 0).map((p) => ({ fd: p.fd, offset: 0, length: p.data.length }));
    if (this.root.chargeMany) await this.root.chargeMany(ranges);
    else if (this.root.charge) for (const r of ranges) await this.root.charge(r.fd, r.offset, r.length);
    while (batch.length > 0) {
      const p = batch[0] as Pending;
      let done = 0;
      // A failure (ENOSPC, say) leaves this file in the batch: discardBatch closes and removes it with the rest.
      while (done < p.data.length) done += writeSync(p.fd, p.data, done, p.data.length - done, done);
      // open's mode went through the umask, which only ever takes the group and other write bits.
      if (p.mode & (0o7000 | UMASK)) fchmodSync(p.fd, p.mode);
      if (p.mtime) futimesSync(p.fd, p.mtime, p.mtime);
      closeSync(p.fd);
      batch.shift();
      this.batchBytes -= p.data.length;
      this.entries++;
      this.bytes += p.data.length;
    }
  }

  /** Held files not written when the upload failed are removed: none of them is left empty as if whole. */
  private async discardBatch(): Promise<void> {
    const batch = this.batch.splice(0);
    this.batchBytes = 0;
    for (const p of batch) {
      try {
        closeSync(p.fd);
      } catch {
        // closed already
      }
      const dir = await this.dir(p.parent, p.name).catch(() => null);
      if (dir) await unlink(viaFd(dir.fd, p.name)).catch(() => {});
    }
  }

  /** An fd of dest/parts, made where missing; never through a symlink or onto another filesystem. */
  private async dir(parts: string[], entry: string): Promise<FileHandle> {
    if (parts.length === 0) return this.dest;
    const key = parts.join('/');
    if (this.cached?.key === key) return this.cached.fh;
    await this.cached?.fh.close();
    this.cached = undefined;
    let cur = this.dest;
    try {
      for (const c of parts) {
        const p = viaFd(cur.fd, c);
        let next: FileHandle;
        try {
          next = await open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
        } catch (e) {
          const code = errnoOf(e);
          if (code === 'ELOOP' || code === 'ENOTDIR') {
            const st = await lstat(p).catch(() => null);
            throw new ProtocolError('FORBIDDEN', `${entry}: ${c} is ${st?.isSymbolicLink() ? 'a symlink' : 'not a directory'}: entries are never written through one`, { detail: { entry } });
          }
          if (code !== 'ENOENT') throw e;
          next = await this.mkdirAt(cur, c, 0o755);
        }
        if (cur !== this.dest) await cur.close();
        cur = next;
        if (this.dev !== undefined && (await cur.stat()).dev !== this.dev) throw new ProtocolError('FORBIDDEN', `${entry}: ${c} is a mount of the sandbox's (/proc, /dev, /sys), not its files`, { detail: { entry } });
      }
    } catch (e) {
      if (cur !== this.dest) await cur.close();
      throw e;
    }
    this.cached = { key, fh: cur };
    return cur;
  }

  /** mkdir then open with O_NOFOLLOW: chown and chmod go through the fd, never through a name that may have become a symlink. */
  private async mkdirAt(parent: FileHandle, name: string, mode: number): Promise<FileHandle> {
    const p = viaFd(parent.fd, name);
    const made = await mkdir(p, { mode: 0o700 }).then(
      () => true,
      (e: unknown) => {
        if (errnoOf(e) !== 'EEXIST') throw e;
        return false;
      },
    );
    const fh = await open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (made) {
      if (this.root.owner) await fh.chown(this.root.owner.uid, this.root.owner.gid);
      await fh.chmod(mode);
    }
    return fh;
  }

  private async makeDir(parts: string[], mode: number, entry: string): Promise<void> {
    const parent = await this.dir(parts.slice(0, -1), entry);
    const name = parts[parts.length - 1] as string;
    const st = await lstat(viaFd(parent.fd, name)).catch(() => null);
    if (st && !st.isDirectory()) throw new ProtocolError('INVALID_REQUEST', `${entry}: exists and is not a directory`, { detail: { entry } });
    const fh = await this.mkdirAt(parent, name, mode);
    try {
      await fh.chmod(mode);
    } finally {
      await fh.close();
    }
    this.entries++;
  }

  /** Removes what is at `name` unless it is a directory (which an entry never replaces). */
  private async clear(dir: FileHandle, name: string, entry: string): Promise<boolean> {
    const p = viaFd(dir.fd, name);
    const st = await lstat(p).catch(() => null);
    if (!st) return false;
    if (st.isDirectory()) throw new ProtocolError('INVALID_REQUEST', `${entry}: is a directory`, { detail: { entry } });
    await unlink(p);
    return true;
  }

  private async makeSymlink(parts: string[], target: string, entry: string): Promise<void> {
    if (target === '' || target.includes('\0')) throw new ProtocolError('INVALID_REQUEST', `${entry}: a symlink without a target`, { detail: { entry } });
    const dir = await this.dir(parts.slice(0, -1), entry);
    const name = parts[parts.length - 1] as string;
    await this.clear(dir, name, entry);
    // The target is stored as text and never resolved here: inside the sandbox, `/etc` is its own /etc.
    const p = viaFd(dir.fd, name);
    await symlink(target, p);
    if (this.root.owner) await lchown(p, this.root.owner.uid, this.root.owner.gid);
    this.entries++;
  }

  private async openFile(parts: string[], mode: number, entry: string): Promise<void> {
    const dir = await this.dir(parts.slice(0, -1), entry);
    const name = parts[parts.length - 1] as string;
    await this.clear(dir, name, entry);
    const fh = await open(viaFd(dir.fd, name), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK, mode & 0o777);
    if (!(await fh.stat()).isFile()) {
      await fh.close();
      throw new ProtocolError('FORBIDDEN', `${entry}: not a regular file`, { detail: { entry } });
    }
    this.open = { fh, dir, name, written: 0, path: entry };
    if (this.root.owner) await fh.chown(this.root.owner.uid, this.root.owner.gid);
  }

  private async writeData(d: Buffer): Promise<void> {
    const o = this.open;
    if (!o || d.length === 0) return;
    await this.root.spend(d.length);
    if (this.root.charge) await this.root.charge(o.fh.fd, o.written, d.length);
    let done = 0;
    while (done < d.length) {
      const { bytesWritten } = await o.fh.write(d, done, d.length - done, o.written + done);
      done += bytesWritten;
    }
    o.written += d.length;
    this.bytes += d.length;
  }

  private async closeFile(mode: number, mtime?: Date): Promise<void> {
    const o = this.open;
    if (!o) return;
    this.open = undefined;
    try {
      await o.fh.chmod(mode);
      if (mtime) await o.fh.utimes(mtime, mtime);
    } finally {
      await o.fh.close();
    }
    this.entries++;
  }

  /** A file the archive broke off in the middle of is not left behind as if it were whole. */
  private async discardOpen(): Promise<void> {
    const o = this.open;
    if (!o) return;
    this.open = undefined;
    await o.fh.close().catch(() => {});
    await unlink(viaFd(o.dir.fd, o.name)).catch(() => {});
  }
}

/** An entry's name as components under the destination: a leading `/` or `./` is dropped, `..` refused. */
function entryParts(path: string): string[] {
  const parts = path.split('/').filter((c) => c !== '' && c !== '.');
  if (parts.includes('..')) throw new ProtocolError('FORBIDDEN', `${path}: entries may not contain '..'`, { detail: { entry: path } });
  if (path.includes('\0')) throw new ProtocolError('INVALID_REQUEST', `${path}: a name with NUL`, { detail: { entry: path } });
  return parts;
}

function toProtocolError(e: unknown, shown: string): ProtocolError {
  switch (errnoOf(e)) {
    case 'ENOSPC':
    case 'EDQUOT':
    case 'EFBIG':
      return new ProtocolError('DISK_LIMIT', `${shown}: the sandbox's writable layer is full`);
    case 'ELOOP':
      return new ProtocolError('FORBIDDEN', `${shown}: a path changed to a symlink while being written`);
    case 'EACCES':
    case 'EPERM':
    case 'EROFS':
      return new ProtocolError('FORBIDDEN', `${shown}: permission denied`);
    case 'ENAMETOOLONG':
      return new ProtocolError('INVALID_REQUEST', `${shown}: a name is too long`);
    default:
      return new ProtocolError('BACKEND_FAILED', `${shown}: ${(e as Error).message}`);
  }
}

// ─── Download ───────────────────────────────────────────────────────────────────────────────────

/** File bytes read per step: small enough that a pull never holds much more than its chunk. */
const READ_STEP = 256 * 1024;
const BLOCK = 512;
const ZEROS = Buffer.alloc(BLOCK * 2);

interface Level {
  /** The path of the directory inside the archive ('' for the top), with a trailing '/'. */
  rel: string;
  ino: number;
  names: Buffer[];
}

/** The header blocks of one entry (a pax record first when the name or target does not fit ustar). */
function headerOf(h: { path: string; type: 'File' | 'Directory' | 'SymbolicLink'; mode: number; size: number; mtime: Date; linkpath?: string }): Buffer {
  const fields = { ...h, uid: 0, gid: 0, uname: 'root', gname: 'root' };
  const header = new Header(fields);
  const needPax = header.encode();
  const block = header.block as Buffer;
  if (!needPax) return block;
  const pax = new Pax({ path: h.path, mtime: h.mtime, ...(h.linkpath !== undefined ? { linkpath: h.linkpath } : {}), size: h.size }).encode();
  return Buffer.concat([pax, block]);
}

/**
 * A tar archive of `path` (a directory: what is below it, names relative to it; a file: that file),
 * as a generator of pieces. Symlinks are archived as symlinks; sockets, FIFOs and devices, and
 * directories of another filesystem (a sandbox's /proc, /dev, /sys), are left out; entries that
 * vanish or change while being walked are left out too, a file that shrinks is padded with zeros to
 * the size its header gave.
 */
export async function* tarOf(root: TreeRoot, path: string): AsyncGenerator<Buffer, void, undefined> {
  const dev = await root.device();
  let cur = await root.openDirectory(path).catch(async (e: unknown) => {
    if (e instanceof ProtocolError && e.code === 'INVALID_REQUEST' && /not a directory/.test(e.message)) return null;
    throw e;
  });
  if (cur === null) {
    yield* singleFile(root, path);
    return;
  }
  const levels: Level[] = [];
  try {
    levels.push({ rel: '', ino: (await cur.stat()).ino, names: await namesOf(cur) });
    for (;;) {
      const level = levels[levels.length - 1] as Level;
      const raw = level.names.shift();
      if (raw === undefined) {
        if (levels.length === 1) break;
        const up = await open(`/proc/self/fd/${cur.fd}/..`, O_RDONLY | O_DIRECTORY);
        const parent = levels[levels.length - 2] as Level;
        const ust = await up.stat();
        if (ust.ino !== parent.ino || (dev !== undefined && ust.dev !== dev)) {
          await up.close();
          throw new ProtocolError('FORBIDDEN', `${path}: the tree changed while being read (a directory was moved)`);
        }
        await cur.close();
        cur = up;
        levels.pop();
        continue;
      }
      const p = viaFdBytes(cur.fd, raw);
      const st = await lstat(p).catch(() => null);
      if (!st) continue;
      // Names go in as UTF-8: one that is not (rare) comes out with U+FFFD where its bad bytes were.
      const name = `${level.rel}${raw.toString('utf8')}`;
      const mtime = new Date(Math.floor(st.mtimeMs / 1000) * 1000);
      if (st.isSymbolicLink()) {
        const target = await readlink(p).catch(() => null);
        if (target === null) continue;
        yield headerOf({ path: name, type: 'SymbolicLink', mode: st.mode & 0o7777, size: 0, mtime, linkpath: target });
      } else if (st.isFile()) {
        yield* fileEntry(p, name, mtime);
      } else if (st.isDirectory()) {
        if (dev !== undefined && st.dev !== dev) continue;
        const next = await open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW).catch(() => null);
        if (!next) continue;
        const nst = await next.stat();
        if (nst.ino !== st.ino || (dev !== undefined && nst.dev !== dev)) {
          await next.close();
          continue;
        }
        yield headerOf({ path: `${name}/`, type: 'Directory', mode: st.mode & 0o7777, size: 0, mtime });
        let names: Buffer[];
        try {
          names = await namesOf(next);
        } catch (e) {
          await next.close();
          throw e;
        }
        await cur.close();
        cur = next;
        levels.push({ rel: `${name}/`, ino: nst.ino, names });
      }
    }
  } finally {
    await cur.close();
  }
  yield ZEROS;
}

async function namesOf(dir: FileHandle): Promise<Buffer[]> {
  return (await readdir(`/proc/self/fd/${dir.fd}`, { encoding: 'buffer' })).sort(Buffer.compare);
}

/** One regular file's header and bytes, read through an fd opened without following a link. */
async function* fileEntry(p: string | Buffer, name: string, mtime: Date): AsyncGenerator<Buffer, void, undefined> {
  const fh = await open(p, O_RDONLY | O_NOFOLLOW | O_NONBLOCK).catch(() => null);
  if (!fh) return;
  try {
    const st = await fh.stat();
    if (!st.isFile()) return;
    const size = st.size;
    yield headerOf({ path: name, type: 'File', mode: st.mode & 0o7777, size, mtime });
    let off = 0;
    while (off < size) {
      const want = Math.min(READ_STEP, size - off);
      const buf = Buffer.alloc(want);
      const { bytesRead } = await fh.read(buf, 0, want, off);
      // Shrunk since its header: the archive must still hold `size` bytes (zeros) to stay readable.
      off += want;
      yield bytesRead === want ? buf : buf.fill(0, bytesRead);
    }
    const pad = (BLOCK - (size % BLOCK)) % BLOCK;
    if (pad) yield ZEROS.subarray(0, pad);
  } finally {
    await fh.close();
  }
}

async function* singleFile(root: TreeRoot, path: string): AsyncGenerator<Buffer, void, undefined> {
  const parts = path.split('/').filter((c) => c !== '' && c !== '.');
  const name = parts.pop() as string;
  const dir = await root.openDirectory(`/${parts.join('/')}`);
  try {
    const p = viaFd(dir.fd, name);
    const st = await lstat(p);
    if (!st.isFile()) throw new ProtocolError('FORBIDDEN', `${path}: not a regular file or directory`);
    yield* fileEntry(p, name, new Date(Math.floor(st.mtimeMs / 1000) * 1000));
  } finally {
    await dir.close();
  }
  yield ZEROS;
}
