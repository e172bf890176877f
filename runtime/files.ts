/**
 * The files API on the host side, confined to a sandbox's root directory.
 *
 * The agent inside owns that tree and may plant symlinks, `..` tricks, FIFOs or device files, and
 * may swap a directory for a symlink while we walk it. So paths are resolved in two steps:
 * 1. logically, as if chrooted: symlinks are expanded against the sandbox root, `..` stops at it;
 * 2. physically, one component at a time from an fd of the root, each opened through
 *    `/proc/self/fd/<dir>/<name>` with O_NOFOLLOW — an `openat` without a native addon. A component
 *    swapped for a symlink between the two steps fails with ELOOP instead of being followed.
 * Only regular files are read or written; anything else (device files, FIFOs, sockets) is
 * FORBIDDEN, and opens are O_NONBLOCK so that a FIFO swapped in at the last moment cannot hang us.
 * What the API creates is owned by the sandbox's root (its unprivileged host uid), as if the
 * sandbox had made it; sizes are bounded by the chunk limit per call and the writable layer's size.
 */

import { isUtf8 } from 'node:buffer';
import { constants } from 'node:fs';
import { type FileHandle, lstat, mkdir, open, readdir, readlink, rmdir, stat, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import type { FileEntry, FileType } from '../protocol/index.ts';
import { Limits, ProtocolError } from '../protocol/index.ts';
import { TarUpload, type TreeRoot, tarOf } from './files-tree.ts';
import { TreeWatch, type WatchEvent, type WatchRoot } from './files-watch.ts';
import { ByteBudget } from './limit.ts';
import { emptyTree as emptyTreeInWorker } from './tree-remove.ts';

const { O_RDONLY, O_WRONLY, O_CREAT, O_TRUNC, O_NOFOLLOW, O_NONBLOCK, O_DIRECTORY } = constants;
const MAX_LINKS = 40;
/**
 * Components walked for one path, links expanded: the kernel's 40 links, each of up to 4 KiB of
 * `a/../`, made one read 64,000 lstat calls — a thread-pool thread held for 10–13 s. No path a
 * program uses comes near it: PATH_MAX allows 2,048 components in a path without links.
 */
const MAX_STEPS = 4096;
/** Offsets past this are refused: no sandbox layer is that large, and a sparse file that big helps no one. */
export const MAX_OFFSET = 2 ** 40;

/**
 * Upload bandwidth per sandbox root. Measured here, a 1 MiB `files.write` costs the node ~5 ms of
 * CPU (NATS framing, decoding, the write itself) on the event loop every sandbox shares: one
 * trainer streaming a big file at full speed would slow every other sandbox's exec by 3× or more
 * on a 2-core node. A token bucket (a burst of 16 MiB, then 32 MiB/s) keeps ordinary uploads
 * instant and bounds what a flood takes. PADDOCK_FILES_WRITE_MIBPS sets the rate.
 */
const uploads = new ByteBudget((Number(process.env.PADDOCK_FILES_WRITE_MIBPS) || 32) * 1024 * 1024, 16 * 1024 * 1024);

async function spend(root: string, bytes: number): Promise<void> {
  const waitMs = uploads.spend(root, bytes);
  if (waitMs > 0) await new Promise((r) => setTimeout(r, waitMs));
}

/** Who owns what the files API creates: the sandbox's root, seen from the host. */
export interface Owner {
  uid: number;
  gid: number;
}

function errnoOf(e: unknown): string | undefined {
  return (e as NodeJS.ErrnoException | undefined)?.code;
}

function fail(e: unknown, path: string): never {
  if (e instanceof ProtocolError) throw e;
  switch (errnoOf(e)) {
    case 'ENOENT':
      throw new ProtocolError('NOT_FOUND', `${path}: no such file or directory`);
    case 'ELOOP':
      throw new ProtocolError('FORBIDDEN', `${path}: path changed to a symlink while being accessed`);
    case 'ENOTDIR':
      throw new ProtocolError('INVALID_REQUEST', `${path}: a component is not a directory`);
    case 'EISDIR':
      throw new ProtocolError('INVALID_REQUEST', `${path}: is a directory`);
    case 'ENOTEMPTY':
      throw new ProtocolError('INVALID_REQUEST', `${path}: directory not empty (pass recursive)`);
    case 'ENXIO':
      throw new ProtocolError('FORBIDDEN', `${path}: not a regular file`);
    case 'ENOSPC':
    case 'EDQUOT':
      throw new ProtocolError('DISK_LIMIT', `${path}: the sandbox's writable layer is full`);
    case 'EFBIG':
      throw new ProtocolError('DISK_LIMIT', `${path}: file too large`);
    case 'EACCES':
    case 'EPERM':
    case 'EROFS':
      throw new ProtocolError('FORBIDDEN', `${path}: permission denied`);
    default:
      throw e;
  }
}

const viaFd = (fd: number, name: string) => `/proc/self/fd/${fd}/${name}`;

export class RootFiles implements TreeRoot, WatchRoot {
  /**
   * `oneFilesystem`: never walk into a directory on another filesystem than the root's — a root
   * reached through a process's /proc/<pid>/root has that process's /proc, /dev and /sys mounted
   * in it, and the node is real root there. (overlayfs gives every directory its own device number,
   * so the test is exact for the directories of a sandbox's root.)
   */
  constructor(
    readonly root: string,
    readonly owner?: Owner,
    private readonly opts: {
      oneFilesystem?: boolean;
      /**
       * Called before a write with the open file and the range it will fill: allocates that range
       * on the sandbox's account (the container backend's writable layer is a tmpfs, whose pages
       * are charged to whoever allocates them: a 512 MiB write left the sandbox's memory cgroup at
       * 0.23 MiB and cost the node 949 MiB).
       */
      charge?: (fd: number, offset: number, length: number) => Promise<void>;
      /** `charge` for several ranges at once (what one charge costs is its call, not its bytes). */
      chargeMany?: (ranges: Array<{ fd: number; offset: number; length: number }>) => Promise<void>;
    } = {},
  ) {}

  /** Step 1: the path's components as the sandbox would see them, symlinks expanded in-root. */
  async resolve(path: string, followFinal: boolean): Promise<string[]> {
    const stack: string[] = [];
    let queue = path.split('/').filter((c) => c !== '' && c !== '.');
    let links = 0;
    let steps = 0;
    let missing = false;
    const dev = this.opts.oneFilesystem ? (await stat(this.root)).dev : undefined;
    while (queue.length > 0) {
      const c = queue.shift() as string;
      if (++steps > MAX_STEPS) throw new ProtocolError('FORBIDDEN', `${path}: more than ${MAX_STEPS} path components through symbolic links`);
      if (c === '..') {
        stack.pop();
        continue;
      }
      if (!missing && (queue.length > 0 || followFinal)) {
        const host = join(this.root, ...stack, c);
        const st = await lstat(host).catch((e: unknown) => {
          if (errnoOf(e) === 'ENOENT' || errnoOf(e) === 'ENOTDIR') return null;
          throw e;
        });
        if (st === null) missing = true;
        else if (dev !== undefined && st.isDirectory() && st.dev !== dev) throw otherFilesystem(c);
        else if (st.isSymbolicLink()) {
          if (++links > MAX_LINKS) throw new ProtocolError('FORBIDDEN', `${path}: too many levels of symbolic links`);
          // Swapped for a directory since the lstat: EINVAL. The same race the walk's O_NOFOLLOW catches.
          const target = await readlink(host).catch((e: unknown) => {
            if (errnoOf(e) === 'EINVAL') throw changed(path);
            throw e;
          });
          if (target.startsWith('/')) stack.length = 0;
          queue = [...target.split('/').filter((x) => x !== '' && x !== '.'), ...queue];
          continue;
        }
      }
      stack.push(c);
    }
    return stack;
  }

  /** Step 2: an fd of the directory `parts`, walked one O_NOFOLLOW component at a time. */
  private async openDir(parts: string[], create: boolean): Promise<FileHandle> {
    let cur = await open(this.root, O_RDONLY | O_DIRECTORY);
    try {
      const dev = this.opts.oneFilesystem ? (await cur.stat()).dev : undefined;
      for (const c of parts) {
        const p = viaFd(cur.fd, c);
        let next: FileHandle;
        try {
          next = await open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
        } catch (e) {
          // ENOTDIR for what is a directory or a symlink when looked at again: swapped since step 1
          // (O_DIRECTORY answers before O_NOFOLLOW's ELOOP). The same race as ELOOP: FORBIDDEN.
          if (errnoOf(e) === 'ENOTDIR') {
            const now = await lstat(p).catch(() => null);
            if (now?.isSymbolicLink() || now?.isDirectory()) throw Object.assign(new Error(`${c}: changed while being walked`), { code: 'ELOOP' });
          }
          if (!(create && errnoOf(e) === 'ENOENT')) throw e;
          const made = await mkdir(p, { mode: 0o755 }).then(
            () => true,
            (e2: unknown) => {
              if (errnoOf(e2) !== 'EEXIST') throw e2;
              return false;
            },
          );
          next = await open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
          if (made && this.owner) await next.chown(this.owner.uid, this.owner.gid);
        }
        await cur.close();
        cur = next;
        if (dev !== undefined && (await cur.stat()).dev !== dev) throw otherFilesystem(c);
      }
      return cur;
    } catch (e) {
      await cur.close();
      throw e;
    }
  }

  private async withParent<T>(path: string, followFinal: boolean, create: boolean, fn: (dir: FileHandle, name: string) => Promise<T>): Promise<T> {
    try {
      const parts = await this.resolve(path, followFinal);
      const name = parts.pop();
      if (name === undefined) throw new ProtocolError('INVALID_REQUEST', `${path}: is the root directory`);
      const dir = await this.openDir(parts, create);
      try {
        return await fn(dir, name);
      } finally {
        await dir.close();
      }
    } catch (e) {
      fail(e, path);
    }
  }

  async read(path: string, offset = 0, length: number = Limits.files.chunkMax): Promise<{ data: Buffer; size: number; eof: boolean }> {
    const want = Math.min(length, Limits.files.chunkMax);
    return this.withParent(path, true, false, async (dir, name) => {
      const p = viaFd(dir.fd, name);
      const pre = await lstat(p);
      if (pre.isDirectory()) throw new ProtocolError('INVALID_REQUEST', `${path}: is a directory`);
      if (!pre.isFile()) throw new ProtocolError('FORBIDDEN', `${path}: not a regular file`);
      const fh = await open(p, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
      try {
        const st = await fh.stat();
        if (!st.isFile()) throw new ProtocolError('FORBIDDEN', `${path}: not a regular file`);
        const n = Math.max(0, Math.min(want, st.size - offset));
        const buf = Buffer.allocUnsafe(n);
        let got = 0;
        while (got < n) {
          const { bytesRead } = await fh.read(buf, got, n - got, offset + got);
          if (bytesRead === 0) break;
          got += bytesRead;
        }
        return { data: buf.subarray(0, got), size: st.size, eof: offset + got >= st.size };
      } finally {
        await fh.close();
      }
    });
  }

  /** Replaces the file (offset undefined) or writes at `offset` (chunked uploads). Parents are created. */
  async write(path: string, data: Uint8Array, opts: { offset?: number; mode?: number } = {}): Promise<{ size: number }> {
    if (data.length > Limits.files.chunkMax) throw new ProtocolError('PAYLOAD_TOO_LARGE', `write chunk larger than ${Limits.files.chunkMax} bytes`);
    if ((opts.offset ?? 0) + data.length > MAX_OFFSET) throw new ProtocolError('INVALID_REQUEST', `offset: writes end at ${MAX_OFFSET} bytes at most`);
    await spend(this.root, data.length);
    return this.withParent(path, true, true, async (dir, name) => {
      const p = viaFd(dir.fd, name);
      const pre = await lstat(p).catch((e: unknown) => {
        if (errnoOf(e) === 'ENOENT') return null;
        throw e;
      });
      if (pre?.isDirectory()) throw new ProtocolError('INVALID_REQUEST', `${path}: is a directory`);
      if (pre && !pre.isFile()) throw new ProtocolError('FORBIDDEN', `${path}: not a regular file`);
      const flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | (opts.offset === undefined ? O_TRUNC : 0);
      const fh = await open(p, flags, opts.mode ?? 0o644);
      try {
        const st = await fh.stat();
        if (!st.isFile()) throw new ProtocolError('FORBIDDEN', `${path}: not a regular file`);
        if (pre === null && this.owner) await fh.chown(this.owner.uid, this.owner.gid);
        let done = 0;
        const base = opts.offset ?? 0;
        if (this.opts.charge && data.length > 0) await this.opts.charge(fh.fd, base, data.length);
        while (done < data.length) {
          const { bytesWritten } = await fh.write(data, done, data.length - done, base + done);
          done += bytesWritten;
        }
        if (opts.mode !== undefined) await fh.chmod(opts.mode & 0o7777);
        return { size: (await fh.stat()).size };
      } finally {
        await fh.close();
      }
    });
  }

  async list(path: string): Promise<FileEntry[]> {
    try {
      const parts = await this.resolve(path, true);
      const dir = await this.openDir(parts, false);
      try {
        // As bytes: a name that is not UTF-8 read as a string no longer names its file.
        const names = await readdir(`/proc/self/fd/${dir.fd}`, { encoding: 'buffer' });
        const entries: FileEntry[] = [];
        for (const raw of names.sort(Buffer.compare)) {
          const st = await lstat(viaFdBytes(dir.fd, raw)).catch(() => null);
          if (!st) continue;
          const type: FileType = st.isFile() ? 'file' : st.isDirectory() ? 'dir' : st.isSymbolicLink() ? 'symlink' : 'other';
          const name = raw.toString('utf8');
          const e: FileEntry = { name, type, size: st.size, mode: st.mode & 0o7777, mtimeMs: Math.floor(st.mtimeMs) };
          if (!isUtf8(raw)) e.nameBytes = new Uint8Array(raw);
          entries.push(e);
        }
        return entries;
      } finally {
        await dir.close();
      }
    } catch (e) {
      fail(e, path);
    }
  }

  /** @internal (TreeRoot) an fd of the existing directory `path`, resolved as list resolves it. */
  async openDirectory(path: string): Promise<FileHandle> {
    try {
      return await this.openDir(await this.resolve(path, true), false);
    } catch (e) {
      if (errnoOf(e) === 'ENOTDIR') throw new ProtocolError('INVALID_REQUEST', `${path}: not a directory`, { detail: { reason: 'not_a_directory' } });
      fail(e, path);
    }
  }

  /** @internal (WatchRoot) an fd of the directory at already resolved components. */
  openParts(parts: string[]): Promise<FileHandle> {
    return this.openDir(parts, false);
  }

  /**
   * Watches the directory `path` (files-watch.ts): resolves once watching. `onEnd` is called if the
   * watch ends by itself (the directory removed, a limit reached).
   */
  async watch(path: string, recursive: boolean, onChange: (ev: WatchEvent) => void, onEnd: (reason: 'removed' | ProtocolError) => void): Promise<{ close(): void }> {
    try {
      return await TreeWatch.start(this, path, recursive, onChange, onEnd);
    } catch (e) {
      if (errnoOf(e) === 'ENOTDIR') throw new ProtocolError('INVALID_REQUEST', `${path}: not a directory`, { detail: { reason: 'not_a_directory' } });
      fail(e, path);
    }
  }

  /** @internal (TreeRoot) */
  async device(): Promise<number | undefined> {
    return this.opts.oneFilesystem ? (await stat(this.root)).dev : undefined;
  }

  /** @internal (TreeRoot) */
  charge(fd: number, offset: number, length: number): Promise<void> {
    return this.opts.charge ? this.opts.charge(fd, offset, length) : Promise.resolve();
  }

  /** @internal (TreeRoot) */
  async chargeMany(ranges: Array<{ fd: number; offset: number; length: number }>): Promise<void> {
    if (ranges.length === 0) return;
    if (this.opts.chargeMany) return this.opts.chargeMany(ranges);
    for (const r of ranges) await this.charge(r.fd, r.offset, r.length);
  }

  /** @internal (TreeRoot) */
  spend(bytes: number): Promise<void> {
    return spend(this.root, bytes);
  }

  /** Unpacks a tar archive, fed in chunks, into the existing directory `path` (files-tree.ts). */
  upload(path: string): Promise<TarUpload> {
    return TarUpload.start(this, path);
  }

  /** A tar archive of `path`, pulled piece by piece (files-tree.ts). */
  download(path: string): AsyncGenerator<Uint8Array, void, undefined> {
    return tarOf(this, path);
  }

  async remove(path: string, recursive: boolean): Promise<void> {
    await this.withParent(path, false, false, async (dir, name) => {
      await removeAt(dir, name, recursive, this.opts.oneFilesystem ? (await dir.stat()).dev : undefined);
    });
  }
}

const otherFilesystem = (name: string) => new ProtocolError('FORBIDDEN', `${name}: a mount of the sandbox's (/proc, /dev, /sys), not its files`);

const changed = (path: string) => new ProtocolError('FORBIDDEN', `${path}: path changed while being accessed`);

/** `/proc/self/fd/<fd>/<name>` for a name given as bytes (names need not be UTF-8). */
const viaFdBytes = (fd: number, name: Buffer) => Buffer.concat([Buffer.from(`/proc/self/fd/${fd}/`), name]);

/** `dev`: the only device whose directories may be entered (one-filesystem roots). */
async function removeAt(dir: FileHandle, name: string, recursive: boolean, dev?: number): Promise<void> {
  const p = viaFd(dir.fd, name);
  const st = await lstat(p);
  if (!st.isDirectory()) {
    await unlink(p);
    return;
  }
  if (dev !== undefined && st.dev !== dev) throw otherFilesystem(name);
  if (recursive) await emptyTree(p, st.ino, name, dev);
  await rmdir(p);
}

/** Empties the directory at `top` in a worker thread (runtime/tree-remove.ts: one fd at a time, whatever the depth). */
async function emptyTree(top: string, topIno: number, shown: string, dev?: number): Promise<void> {
  const r = await emptyTreeInWorker({ top, topIno, shown, ...(dev !== undefined ? { dev } : {}) });
  if (r.ok) return;
  if ('refusal' in r) throw r.refusal.kind === 'changed' ? changed(r.refusal.name) : otherFilesystem(r.refusal.name);
  throw Object.assign(new Error(r.message), r.errno ? { code: r.errno } : {});
}
