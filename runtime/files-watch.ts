/**
 * Watching a directory of a sandbox (files.watch) with inotify, one watch per directory, through
 * Node's non-recursive fs.watch: libuv keeps one inotify instance per process and adds a watch to
 * it per directory, so a watch costs the node one of the host user's inotify *watches*
 * (fs.inotify.max_user_watches), never an instance (max_user_instances is 128 by default and
 * shared by every process of the user). Node 20's own `recursive: true` on Linux walks the tree by
 * path and stats through symlinks: not something to point at a tree an agent controls.
 *
 * Each directory is opened the way files.ts opens one (from the root, one O_NOFOLLOW component at
 * a time) and watched through `/proc/self/fd/<fd>/.`: the kernel resolves that to the directory
 * the fd holds, so a directory swapped for a symlink between the walk and the watch is never
 * followed, and events on the watched directory itself come named `.` (libuv names them by the
 * path's last component), which no entry can be called.
 *
 * fs.watch says only `rename` (made, removed or moved: IN_CREATE, IN_DELETE, IN_MOVED_*) or
 * `change`, and by the time a `rename` is looked at the entry may have come and gone again (`echo
 * > f; rm f` in one command). So each watched directory keeps the names it holds, with their
 * inodes: a `rename` of a name not held is `created` (even if it is already gone: its own
 * `rename` follows), of a held name that is gone `removed`, of a held name now another inode
 * `removed` then `created`.
 *
 * Directories watched are bounded per sandbox and per node: past either, BUSY. A directory moved
 * elsewhere keeps being reported under the path it was watched at.
 */

import { isUtf8 } from 'node:buffer';
import { type FSWatcher, readFileSync, watch } from 'node:fs';
import { type FileHandle, lstat, readdir } from 'node:fs/promises';
import { type FileChange, ProtocolError } from '../protocol/index.ts';

/** What a watch needs of a sandbox's files API (RootFiles gives it). */
export interface WatchRoot {
  readonly root: string;
  /** The path's components with symlinks expanded in-root (files.ts step 1). */
  resolve(path: string, followFinal: boolean): Promise<string[]>;
  /** An fd of the directory at those components, walked with O_NOFOLLOW (files.ts step 2). */
  openParts(parts: string[]): Promise<FileHandle>;
  device(): Promise<number | undefined>;
}

export interface WatchEvent {
  type: FileChange;
  /** Absolute inside the sandbox. */
  path: string;
  /** The path exactly, when it is not valid UTF-8. */
  pathBytes?: Uint8Array;
}

function userWatches(): number {
  try {
    return Number(readFileSync('/proc/sys/fs/inotify/max_user_watches', 'utf8').trim()) || 8192;
  } catch {
    return 8192;
  }
}

/**
 * Directories watched at once: per sandbox, and node-wide. The node-wide default leaves three
 * quarters of the user's inotify watches to everything else the node's user runs.
 */
export const WATCH_LIMITS = {
  perSandbox: Number(process.env.PADDOCK_WATCH_DIRS_PER_SANDBOX) || 1024,
  perNode: Number(process.env.PADDOCK_WATCH_DIRS) || Math.min(65536, Math.floor(userWatches() / 4)),
};

let nodeWatched = 0;
const perRoot = new Map<string, number>();

/** Directories watched on this node now (all sandboxes). */
export function watchedDirs(): number {
  return nodeWatched;
}

const errnoOf = (e: unknown) => (e as NodeJS.ErrnoException | undefined)?.code;
const viaFdBytes = (fd: number, name: Buffer) => Buffer.concat([Buffer.from(`/proc/self/fd/${fd}/`), name]);

export class TreeWatch {
  /** By directory (components joined with '/'). */
  private readonly watchers = new Map<string, FSWatcher>();
  /** What each watched directory holds: name (as latin1, one char a byte) → inode (GONE: reported made, already gone). */
  private readonly held = new Map<string, Map<string, number>>();
  private chain: Promise<void> = Promise.resolve();
  private closed = false;

  private constructor(
    private readonly root: WatchRoot,
    private readonly base: string[],
    private readonly recursive: boolean,
    private readonly dev: number | undefined,
    private readonly onChange: (ev: WatchEvent) => void,
    /** Called once when the watch ends by itself: the directory was removed, or a limit was reached. */
    private readonly onEnd: (reason: 'removed' | ProtocolError) => void,
  ) {}

  /**
   * Watches the directory `path` (and, recursive, every directory below it); resolves once the
   * watches are in place. NOT_FOUND, FORBIDDEN, INVALID_REQUEST (not a directory), BUSY (limits).
   */
  static async start(root: WatchRoot, path: string, recursive: boolean, onChange: (ev: WatchEvent) => void, onEnd: (reason: 'removed' | ProtocolError) => void): Promise<TreeWatch> {
    const base = await root.resolve(path, true);
    const w = new TreeWatch(root, base, recursive, await root.device(), onChange, onEnd);
    try {
      await w.add(base, false);
    } catch (e) {
      w.close();
      throw e;
    }
    return w;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const key of [...this.watchers.keys()]) this.unwatch(key);
  }

  private reserve(): void {
    const mine = perRoot.get(this.root.root) ?? 0;
    if (mine >= WATCH_LIMITS.perSandbox) throw new ProtocolError('BUSY', `a sandbox may watch ${WATCH_LIMITS.perSandbox} directories at once`, { detail: { limit: 'perSandbox', max: WATCH_LIMITS.perSandbox } });
    if (nodeWatched >= WATCH_LIMITS.perNode) throw new ProtocolError('BUSY', `this node watches ${WATCH_LIMITS.perNode} directories already`, { detail: { limit: 'perNode', max: WATCH_LIMITS.perNode } });
    perRoot.set(this.root.root, mine + 1);
    nodeWatched++;
  }

  private release(): void {
    const mine = (perRoot.get(this.root.root) ?? 1) - 1;
    if (mine > 0) perRoot.set(this.root.root, mine);
    else perRoot.delete(this.root.root);
    nodeWatched--;
  }

  private unwatch(key: string): void {
    const w = this.watchers.get(key);
    if (!w) return;
    this.watchers.delete(key);
    this.held.delete(key);
    w.close();
    this.release();
  }

  /** Watches `parts` (and, recursive, what is below it, one directory fd at a time); `announce`: report what it finds as created. */
  private async add(top: string[], announce: boolean): Promise<void> {
    const queue: string[][] = [top];
    while (queue.length > 0 && !this.closed) {
      const parts = queue.shift() as string[];
      const key = parts.join('/');
      if (this.watchers.has(key)) continue;
      let fh: FileHandle;
      try {
        fh = await this.root.openParts(parts);
      } catch (e) {
        // A directory below the top that went away (or became a symlink) since it was listed: skip it.
        if (parts !== top && (e instanceof ProtocolError || ['ENOENT', 'ENOTDIR', 'ELOOP'].includes(errnoOf(e) ?? ''))) continue;
        throw e;
      }
      try {
        if (this.dev !== undefined && (await fh.stat()).dev !== this.dev) {
          if (parts === top && parts === this.base) throw new ProtocolError('FORBIDDEN', `/${key}: a mount of the sandbox's (/proc, /dev, /sys), not its files`);
          continue;
        }
        this.reserve();
        let w: FSWatcher;
        try {
          w = watch(`/proc/self/fd/${fh.fd}/.`, { encoding: 'buffer', persistent: false }, (ev, name) => this.queue(parts, ev, name));
        } catch (e) {
          this.release();
          throw e;
        }
        w.on('error', () => this.unwatch(key));
        this.watchers.set(key, w);
        const names = new Map<string, number>();
        this.held.set(key, names);
        for (const raw of await readdir(`/proc/self/fd/${fh.fd}`, { encoding: 'buffer' })) {
          const st = await lstat(viaFdBytes(fh.fd, raw)).catch(() => null);
          if (!st) continue;
          names.set(raw.toString('latin1'), st.ino);
          if (announce) this.emit('created', parts, raw);
          // Names that are not UTF-8 cannot be walked by name here: such a directory is not watched.
          if (this.recursive && st.isDirectory() && isUtf8(raw) && (this.dev === undefined || st.dev === this.dev)) queue.push([...parts, raw.toString('utf8')]);
        }
      } finally {
        await fh.close();
      }
    }
  }

  private queue(parts: string[], ev: string, name: Buffer | string | null): void {
    const raw = name === null ? null : Buffer.isBuffer(name) ? name : Buffer.from(name);
    this.chain = this.chain.then(() => this.handle(parts, ev, raw)).catch((e: unknown) => this.stop(e instanceof ProtocolError ? e : new ProtocolError('BACKEND_FAILED', `watch: ${(e as Error).message}`)));
  }

  private stop(reason: 'removed' | ProtocolError): void {
    if (this.closed) return;
    this.close();
    this.onEnd(reason);
  }

  private async handle(parts: string[], ev: string, raw: Buffer | null): Promise<void> {
    if (this.closed) return;
    const key = parts.join('/');
    if (!this.watchers.has(key)) return;
    if (raw === null || raw.equals(SELF)) {
      // The watched directory itself: removed (or moved away and its watch dropped by the kernel).
      const still = await this.root.openParts(parts).then(
        async (fh) => {
          await fh.close();
          return true;
        },
        () => false,
      );
      if (still) return;
      if (key === this.base.join('/')) return this.stop('removed');
      for (const k of [...this.watchers.keys()]) if (k === key || k.startsWith(`${key}/`)) this.unwatch(k);
      return;
    }
    if (ev === 'change') {
      this.emit('modified', parts, raw);
      return;
    }
    const st = await this.root.openParts(parts).then(
      async (fh) => {
        try {
          return await lstat(viaFdBytes(fh.fd, raw)).catch(() => null);
        } finally {
          await fh.close();
        }
      },
      () => null,
    );
    const childKey = `${key === '' ? '' : `${key}/`}${raw.toString('utf8')}`;
    const names = this.held.get(key) ?? new Map<string, number>();
    const name = raw.toString('latin1');
    const had = names.get(name);
    if (had !== undefined && (!st || st.ino !== had)) {
      names.delete(name);
      this.emit('removed', parts, raw);
      for (const k of [...this.watchers.keys()]) if (k === childKey || k.startsWith(`${childKey}/`)) this.unwatch(k);
    }
    if (!st) {
      if (had === undefined) {
        this.emit('created', parts, raw);
        names.set(name, GONE);
      }
      return;
    }
    if (had === st.ino) return;
    names.set(name, st.ino);
    this.emit('created', parts, raw);
    if (this.recursive && st.isDirectory() && isUtf8(raw) && (this.dev === undefined || st.dev === this.dev)) {
      // What was made inside it before its watch was in place is reported as created too.
      await this.add([...parts, raw.toString('utf8')], true);
    }
  }

  private emit(type: FileChange, parts: string[], raw: Buffer): void {
    const bytes = Buffer.concat([Buffer.from(`/${parts.map((p) => `${p}/`).join('')}`), raw]);
    const ev: WatchEvent = { type, path: bytes.toString('utf8') };
    if (!isUtf8(bytes)) ev.pathBytes = new Uint8Array(bytes);
    this.onChange(ev);
  }
}

const SELF = Buffer.from('.');
/** Inode 0 is never a file's: a name reported made whose entry was gone when looked at. */
const GONE = 0;
