/**
 * The node's layers: each EROFS layer a sandbox needs is mounted once per node, read-only, from a
 * file the layer daemon (lazyfs-main.ts) hands out — the node-local copy when the cache holds the
 * whole blob, else a FUSE file whose bytes arrive from the store on first read. Mounts are counted
 * per sandbox; a layer no sandbox uses stays mounted for `idleMs` (the next create is likely to
 * want it again), and is unmounted earlier when the cache needs its room.
 *
 * The mount is file-backed EROFS (no loop device: mount(8) would add one per layer, a global and
 * scarce resource) via mount(2) directly.
 */
import { type ChildProcess, fork } from 'node:child_process';
import { mkdir, rmdir } from 'node:fs/promises';
import { join } from 'node:path';
import { type LayerCacheStats, type LayerLoadMode, type NodeLayerStats, ProtocolError } from '../../protocol/index.ts';
import { mounts } from '../cgroups.ts';
import { run } from '../proc.ts';
import { moduleFile } from '../source.ts';
import { MS_RDONLY, sysMount } from './fuse.ts';
import type { LayerDaemonConfig, LayerDaemonMessage, LayerDaemonRequest } from './lazyfs-main.ts';
import { hexOf, type LayerRef } from './store.ts';

export interface LayerManagerOptions {
  nodeDir: string;
  cacheDir: string;
  budgetBytes: number;
  mode: LayerLoadMode;
  /** HTTP base URL with the store layout (server.ts, or `rclone serve http`). */
  storeUrl: string;
  timeoutMs: number;
  attempts?: number;
  idleMs: number;
  /** The kernel's read-ahead on lazily loaded layer files, bytes (undefined: its default). */
  readaheadBytes?: number;
  log?: { warn(o: object, msg: string): void; info(o: object, msg: string): void };
}

interface Mounted {
  target: string;
  users: number;
  lazy: boolean;
  idle?: NodeJS.Timeout;
}

type Request = LayerDaemonRequest extends infer R ? (R extends { id: number } ? Omit<R, 'id'> : never) : never;

export class LayerManager {
  private daemon?: ChildProcess;
  private seq = 0;
  private readonly waiting = new Map<number, { resolve(v: unknown): void; reject(e: Error): void }>();
  private readonly mountsByDigest = new Map<string, Promise<Mounted>>();
  /** Last store failure per layer: a create that fails explains itself with it. */
  private readonly fetchErrors = new Map<string, { message: string; at: number }>();
  /** Unmounts in progress: a new mount of the same layer waits for its unmount to finish. */
  private readonly unmounting = new Map<string, Promise<void>>();
  private readonly layersDir: string;
  private closed = false;

  constructor(private readonly o: LayerManagerOptions) {
    this.layersDir = join(o.nodeDir, 'layers');
  }

  async start(): Promise<void> {
    await mkdir(this.layersDir, { recursive: true });
    const cfg: LayerDaemonConfig = {
      mountpoint: join(this.o.nodeDir, 'lazy'),
      cacheDir: this.o.cacheDir,
      budgetBytes: this.o.budgetBytes,
      storeUrl: this.o.storeUrl,
      timeoutMs: this.o.timeoutMs,
      attempts: this.o.attempts ?? 2,
      readaheadBytes: this.o.readaheadBytes,
      nodeDir: this.o.nodeDir,
    };
    const child = fork(moduleFile('runtime/images/lazyfs-main'), [JSON.stringify(cfg)], {
      // FUSE reads block libuv threads: room for them plus the cache's own file I/O.
      env: { ...process.env, UV_THREADPOOL_SIZE: '16' },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    this.daemon = child;
    await new Promise<void>((resolve, reject) => {
      const onExit = (code: number | null) => reject(new Error(`layer daemon exited (${code}) before it was ready`));
      child.once('exit', onExit);
      child.on('message', (m: LayerDaemonMessage) => {
        if ('event' in m) {
          if (m.event === 'ready') {
            child.off('exit', onExit);
            resolve();
          } else if (m.event === 'fatal') reject(new Error(`layer daemon: ${m.message}`));
          else if (m.event === 'pressure') void this.unmountIdle();
          else if (m.event === 'fetch-error') {
            this.fetchErrors.set(m.digest, { message: m.message, at: Date.now() });
            this.o.log?.warn({ digest: m.digest, err: m.message }, 'layer read from the store failed');
          }
          return;
        }
        const w = this.waiting.get(m.id);
        if (!w) return;
        this.waiting.delete(m.id);
        if (m.ok) w.resolve(m.result);
        else w.reject(new ProtocolError(m.full ? 'NO_CAPACITY' : 'BACKEND_FAILED', m.error));
      });
    });
    child.on('exit', (code, signal) => {
      for (const w of this.waiting.values()) w.reject(new ProtocolError('BACKEND_FAILED', `layer daemon exited (${code ?? signal})`));
      this.waiting.clear();
      if (!this.closed) this.o.log?.warn({ code, signal }, 'layer daemon exited: lazy layers now read as I/O errors');
    });
  }

  private call<T>(req: Request): Promise<T> {
    const d = this.daemon;
    if (!d?.connected) return Promise.reject(new ProtocolError('BACKEND_FAILED', 'layer daemon is not running'));
    const id = ++this.seq;
    return new Promise<T>((resolve, reject) => {
      this.waiting.set(id, { resolve: resolve as (v: unknown) => void, reject });
      d.send({ ...req, id } as LayerDaemonRequest);
    });
  }

  /** Mounts a layer (once per node) for one more sandbox; resolves to its mount point. */
  async acquire(ref: LayerRef): Promise<string> {
    const digest = `sha256:${hexOf(ref.digest)}`;
    for (;;) {
      let p = this.mountsByDigest.get(digest);
      if (!p) {
        p = this.mount(ref, digest);
        this.mountsByDigest.set(digest, p);
        p.catch(() => this.mountsByDigest.delete(digest));
      }
      const m = await p;
      // Raced with an idle unmount that already started: mount again.
      if (this.mountsByDigest.get(digest) !== p) continue;
      clearTimeout(m.idle);
      m.idle = undefined;
      m.users++;
      return m.target;
    }
  }

  /**
   * The layer as a file, not mounted on the host (a VM attaches it as a read-only disk and mounts
   * it in its own kernel): the local copy, or in lazy mode the FUSE file whose bytes come from the
   * store as the guest reads them, as for a mount. QEMU opens it as root before it drops to its
   * user (microvm/jail.ts): a FUSE mount of root's serves root alone. Counted in the cache like a
   * mount until `releaseFile`.
   */
  async acquireFile(ref: LayerRef): Promise<string> {
    const digest = `sha256:${hexOf(ref.digest)}`;
    const got = await this.call<{ path: string; local: boolean }>({ op: 'acquire', ref: { digest, size: ref.size, index: ref.index, chunk: ref.chunk }, mode: this.o.mode });
    return got.path;
  }

  releaseFile(ref: LayerRef): void {
    void this.call({ op: 'release', digest: `sha256:${hexOf(ref.digest)}` }).catch(() => {});
  }

  private async mount(ref: LayerRef, digest: string): Promise<Mounted> {
    const hex = hexOf(digest);
    const target = join(this.layersDir, hex);
    await this.unmounting.get(digest);
    const since = Date.now();
    const got = await this.call<{ path: string; local: boolean }>({ op: 'acquire', ref: { digest, size: ref.size, index: ref.index, chunk: ref.chunk }, mode: this.o.mode });
    try {
      await mkdir(target, { recursive: true });
      if (!mounts().some((x) => x.target === target)) await sysMount(got.path, target, 'erofs', MS_RDONLY, '');
    } catch (err) {
      await this.call({ op: 'release', digest }).catch(() => {});
      const why = this.failure(digest, since);
      throw new ProtocolError('BACKEND_FAILED', `layer ${digest} cannot be mounted: ${why ?? (err as Error).message}`, { cause: err });
    }
    return { target, users: 0, lazy: !got.local };
  }

  /** The store failure behind a layer's trouble since `since`, if there was one. */
  failure(digest: string, since: number): string | undefined {
    const e = this.fetchErrors.get(`sha256:${hexOf(digest)}`);
    return e && e.at >= since ? e.message : undefined;
  }

  /** Store failures of any of these layers since `since` (to explain a create that failed). */
  explain(layers: LayerRef[], since: number): string | undefined {
    for (const l of layers) {
      const f = this.failure(l.digest, since);
      if (f) return f;
    }
    return undefined;
  }

  /** One sandbox no longer uses the layer. */
  release(ref: LayerRef): void {
    const digest = `sha256:${hexOf(ref.digest)}`;
    const p = this.mountsByDigest.get(digest);
    if (!p) return;
    void p.then((m) => {
      m.users = Math.max(0, m.users - 1);
      if (m.users === 0 && !this.closed) {
        clearTimeout(m.idle);
        m.idle = setTimeout(() => void this.unmount(digest, p), this.o.idleMs);
        m.idle.unref();
      }
    });
  }

  private async unmount(digest: string, p: Promise<Mounted>): Promise<void> {
    const m = await p.catch(() => null);
    if (!m || m.users > 0 || this.mountsByDigest.get(digest) !== p) return;
    this.mountsByDigest.delete(digest);
    clearTimeout(m.idle);
    const done = (async () => {
      const u = await run('umount', [m.target], { allowFail: true });
      if (u.code !== 0) await run('umount', ['-l', m.target], { allowFail: true });
      await rmdir(m.target).catch(() => {});
      await this.call({ op: 'release', digest }).catch(() => {});
    })();
    this.unmounting.set(digest, done);
    await done;
    if (this.unmounting.get(digest) === done) this.unmounting.delete(digest);
  }

  /** Unmounts every layer no sandbox uses (the cache asked for room). */
  async unmountIdle(): Promise<void> {
    const all = [...this.mountsByDigest];
    for (const [digest, p] of all) {
      const m = await p.catch(() => null);
      if (m && m.users === 0) await this.unmount(digest, p);
    }
  }

  async stats(): Promise<NodeLayerStats> {
    const cache = await this.call<LayerCacheStats>({ op: 'stats' });
    const mounted: NodeLayerStats['mounted'] = [];
    for (const [digest, p] of this.mountsByDigest) {
      const m = await p.catch(() => null);
      if (m) mounted.push({ digest, sandboxes: m.users, lazy: m.lazy });
    }
    return { ...cache, mode: this.o.mode, store: this.o.storeUrl, mounted };
  }

  /** Forgets a layer's cached bytes on this node (unmounting it if no sandbox uses it). */
  async drop(digest: string): Promise<boolean> {
    const d = `sha256:${hexOf(digest)}`;
    const p = this.mountsByDigest.get(d);
    if (p !== undefined) await this.unmount(d, p);
    return this.call<boolean>({ op: 'drop', digest: d });
  }

  /** Unmounts every layer and stops the daemon; sandboxes must be gone. */
  async close(): Promise<void> {
    this.closed = true;
    for (const [digest, p] of [...this.mountsByDigest]) {
      const m = await p.catch(() => null);
      if (m) {
        m.users = 0;
        await this.unmount(digest, p);
      }
    }
    const d = this.daemon;
    if (d && d.exitCode === null && d.signalCode === null) {
      const exited = new Promise<void>((r) => d.once('exit', () => r()));
      // Without it, the daemon takes the disconnect for the node's death and serves on a while.
      await this.call({ op: 'close' }).catch(() => {});
      d.disconnect();
      const t = setTimeout(() => d.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(t);
    }
  }
}
