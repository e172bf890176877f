/**
 * The node-local layer cache: one sparse file per layer, filled chunk by chunk from the store as
 * the kernel reads them (lazy), or whole before mounting (eager). Bounded in bytes: when a new
 * chunk or blob would pass the budget, layers no sandbox uses are evicted, least recently used
 * first; when every cached byte belongs to a layer in use, the chunk is served without being kept.
 *
 * Every byte is checked before the kernel sees it: a fetched chunk against the layer's chunk index
 * (itself checked against the digest in the image manifest), a whole blob against its digest.
 *
 * Files per layer in `dir`: <hex>.erofs (the bytes; sparse while partial), <hex>.map (one byte
 * per chunk: 1 = on disk), <hex>.idx (the chunk index).
 */
import { createHash } from 'node:crypto';
import { type FileHandle, mkdir, open, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { Agent } from 'node:http';
import { join } from 'node:path';
import type { LayerCacheStats, LayerCounters, LayerLoadMode, LayerStats } from '../../protocol/index.ts';
import { chunkCount, DEFAULT_CHUNK, verifyChunk } from './chunks.ts';
import { Errno, FuseError } from './fuse.ts';
import { httpDownload, httpRequest } from './http.ts';

export interface CacheLayerRef {
  digest: string;
  size: number;
  index?: string;
  chunk?: number;
}


interface Layer {
  hex: string;
  size: number;
  chunk: number;
  index: Buffer | null;
  present: Uint8Array;
  /** Chunks read back from disk and checked in this process's life (a crash may have torn a write). */
  checked: Uint8Array;
  cachedBytes: number;
  complete: boolean;
  fh: FileHandle | null;
  inflight: Map<number, Promise<Buffer>>;
  whole?: Promise<void>;
  users: number;
  lastUsed: number;
  mapDirty: boolean;
  c: LayerCounters;
  /** 4 KiB pages of the blob the kernel has asked for in this process's life, and their bytes. */
  readPages: Uint8Array;
  readBytes: number;
}

const PAGE = 4096;

/**
 * What the kernel asked for, next to what was fetched: the counters' gap is the chunk size's and
 * read-ahead's overhead. (Not yet a field of the protocol's LayerStats: read it as an extra one.)
 */
export interface LayerReadStats {
  readBytes: number;
}

const zero = (): LayerCounters => ({ fetchedBytes: 0, fetches: 0, hits: 0, misses: 0, shared: 0, errors: 0, corrupt: 0 });

/** The file in the node's directory its store's address is written to (node-images.ts), for a layer daemon a killed predecessor left. */
export const STORE_URL_FILE = 'store.url';

export interface LayerCacheOptions {
  dir: string;
  budgetBytes: number;
  /** HTTP base URL of the store's layout (server.ts). */
  storeUrl: string;
  /** One store request may take this long; a lazy read gives EIO after `attempts` of them. */
  timeoutMs: number;
  attempts?: number;
  onPressure?: () => void;
  onFetchError?: (digest: string, message: string) => void;
}

export class CacheFullError extends Error {}

export class LayerCache {
  private readonly layers = new Map<string, Layer>();
  private readonly agent = new Agent({ keepAlive: true, maxSockets: 16 });
  private cachedBytes = 0;
  private evictions = 0;
  private evictedBytes = 0;
  private uncachedChunks = 0;
  private mapTimer?: NodeJS.Timeout;

  constructor(private readonly o: LayerCacheOptions) {}

  /** Reads from another store address from now on (a restarted node serves its embedded store on a new port). */
  setStoreUrl(url: string): void {
    this.o.storeUrl = url;
  }

  /** Picks up what a previous run of this node left in the cache directory. */
  async init(): Promise<void> {
    await mkdir(this.o.dir, { recursive: true });
    for (const f of await readdir(this.o.dir)) {
      if (f.endsWith('.part')) await rm(join(this.o.dir, f), { force: true });
      if (!f.endsWith('.map')) continue;
      const hex = f.slice(0, -4);
      try {
        const map = await readFile(join(this.o.dir, f));
        const meta = JSON.parse(await readFile(join(this.o.dir, `${hex}.meta`), 'utf8')) as { size: number; chunk: number };
        const index = await readFile(join(this.o.dir, `${hex}.idx`)).catch(() => null);
        if (map.length !== chunkCount(meta.size, meta.chunk)) throw new Error('map size');
        const l = this.blank(hex, meta.size, meta.chunk, index);
        l.present.set(map);
        for (let i = 0; i < map.length; i++) if (map[i]) l.cachedBytes += this.chunkLen(l, i);
        l.complete = l.cachedBytes === l.size;
        l.lastUsed = (await stat(join(this.o.dir, f))).mtimeMs;
        this.cachedBytes += l.cachedBytes;
        this.layers.set(hex, l);
      } catch {
        await this.removeFiles(hex);
      }
    }
  }

  private blank(hex: string, size: number, chunk: number, index: Buffer | null): Layer {
    const n = chunkCount(size, chunk);
    return { hex, size, chunk, index, present: new Uint8Array(n), checked: new Uint8Array(n), cachedBytes: 0, complete: false, fh: null, inflight: new Map(), users: 0, lastUsed: Date.now(), mapDirty: false, c: zero(), readPages: new Uint8Array(Math.ceil(size / PAGE)), readBytes: 0 };
  }

  private chunkLen(l: Layer, i: number): number {
    return Math.min(l.chunk, l.size - i * l.chunk);
  }

  localPath(hex: string): string {
    return join(this.o.dir, `${hex}.erofs`);
  }

  private layerFor(ref: CacheLayerRef): Layer {
    const hex = ref.digest.replace(/^sha256:/, '');
    let l = this.layers.get(hex);
    if (!l) {
      l = this.blank(hex, ref.size, ref.chunk ?? DEFAULT_CHUNK, null);
      this.layers.set(hex, l);
    }
    return l;
  }

  /**
   * Takes a layer into use and returns the file to mount: the local copy when the cache holds the
   * whole blob, else (lazy) the name under which FUSE serves it, after fetching and checking its
   * index. Eager mode downloads and checks the whole blob first.
   */
  async acquire(ref: CacheLayerRef, mode: LayerLoadMode): Promise<{ local: boolean; hex: string; size: number }> {
    const l = this.layerFor(ref);
    l.users++;
    l.lastUsed = Date.now();
    try {
      if (l.complete) {
        l.c.hits++;
        return { local: true, hex: l.hex, size: l.size };
      }
      // Without a chunk index nothing can be checked before the kernel reads it: load it whole.
      if (mode === 'eager' || !ref.index) {
        l.whole ??= this.downloadWhole(l).finally(() => {
          l.whole = undefined;
        });
        await l.whole;
        return { local: true, hex: l.hex, size: l.size };
      }
      await this.loadIndex(l, ref.index);
      await this.ensureFile(l);
      return { local: false, hex: l.hex, size: l.size };
    } catch (e) {
      l.users--;
      throw e;
    }
  }

  release(digest: string): void {
    const l = this.layers.get(digest.replace(/^sha256:/, ''));
    if (!l) return;
    l.users = Math.max(0, l.users - 1);
    l.lastUsed = Date.now();
    void this.flushMap(l);
  }

  private url(hex: string, ext: 'erofs' | 'idx'): string {
    return `${this.o.storeUrl.replace(/\/+$/, '')}/blobs/sha256/${hex}.${ext}`;
  }

  private async loadIndex(l: Layer, want: string): Promise<void> {
    if (l.index) return;
    const wantHex = want.replace(/^sha256:/, '');
    const local = await readFile(join(this.o.dir, `${l.hex}.idx`)).catch(() => null);
    let idx: Buffer | null = local && createHash('sha256').update(local).digest('hex') === wantHex ? local : null;
    if (!idx) {
      const r = await this.withRetry(l, () => httpRequest(this.url(l.hex, 'idx'), { timeoutMs: this.o.timeoutMs, agent: this.agent, maxBytes: 64 * 1024 * 1024 }));
      if (r.status !== 200) throw new Error(`layer sha256:${l.hex}: the store answered HTTP ${r.status} for its index`);
      l.c.fetchedBytes += r.body.length;
      if (createHash('sha256').update(r.body).digest('hex') !== wantHex) {
        l.c.corrupt++;
        throw new Error(`layer sha256:${l.hex}: its chunk index from the store does not match the manifest (sha256:${wantHex}); refusing to mount it`);
      }
      idx = r.body;
    }
    if (idx.length !== chunkCount(l.size, l.chunk) * 32) throw new Error(`layer sha256:${l.hex}: chunk index has ${idx.length} bytes, expected ${chunkCount(l.size, l.chunk) * 32}`);
    l.index = idx;
    await writeFile(join(this.o.dir, `${l.hex}.idx`), idx);
    await writeFile(join(this.o.dir, `${l.hex}.meta`), JSON.stringify({ size: l.size, chunk: l.chunk }));
  }

  private async ensureFile(l: Layer): Promise<FileHandle> {
    if (l.fh) return l.fh;
    const path = this.localPath(l.hex);
    const fh = await open(path, 'a+').then(async (h) => {
      await h.close();
      return open(path, 'r+');
    });
    await fh.truncate(l.size);
    l.fh = fh;
    return fh;
  }

  /** A FUSE read: the bytes [offset, offset+length) of a layer, fetching missing chunks. */
  async read(hex: string, offset: number, length: number): Promise<Buffer> {
    const l = this.layers.get(hex);
    if (!l) throw new FuseError(Errno.ENOENT, `no layer ${hex}`);
    l.lastUsed = Date.now();
    for (let p = Math.floor(offset / PAGE), end = Math.ceil(Math.min(offset + length, l.size) / PAGE); p < end; p++) {
      if (l.readPages[p]) continue;
      l.readPages[p] = 1;
      l.readBytes += Math.min(PAGE, l.size - p * PAGE);
    }
    const first = Math.floor(offset / l.chunk);
    const last = Math.floor((offset + length - 1) / l.chunk);
    // Missing chunks next to each other come in one range request: a kernel read of 128 KiB is
    // eight 16 KiB chunks, and a request each made the loader's throughput its request rate.
    const mine = new Map<number, Promise<Buffer>>();
    for (let i = first; i <= last; ) {
      if (l.present[i] || l.inflight.has(i)) {
        i++;
        continue;
      }
      let j = i;
      while (j + 1 <= last && !l.present[j + 1] && !l.inflight.has(j + 1)) j++;
      this.startRun(l, i, j);
      for (let k = i; k <= j; k++) mine.set(k, l.inflight.get(k) as Promise<Buffer>);
      i = j + 1;
    }
    const parts = await Promise.all(Array.from({ length: last - first + 1 }, (_, k) => mine.get(first + k) ?? this.chunkData(l, first + k)));
    const all = parts.length === 1 ? (parts[0] as Buffer) : Buffer.concat(parts);
    const from = offset - first * l.chunk;
    return all.subarray(from, from + length);
  }

  private async chunkData(l: Layer, i: number): Promise<Buffer> {
    if (l.present[i]) {
      const len = this.chunkLen(l, i);
      const fh = await this.ensureFile(l);
      const buf = Buffer.allocUnsafe(len);
      const { bytesRead } = await fh.read(buf, 0, len, i * l.chunk);
      if (bytesRead === len && (l.checked[i] || (l.index && verifyChunk(l.index, i, buf)))) {
        l.checked[i] = 1;
        l.c.hits++;
        return buf;
      }
      // Torn by a crash, or changed under us: forget it and fetch it again.
      l.present[i] = 0;
      l.cachedBytes -= len;
      this.cachedBytes -= len;
    }
    const pending = l.inflight.get(i);
    if (pending !== undefined) {
      l.c.shared++;
      return pending;
    }
    this.startRun(l, i, i);
    return l.inflight.get(i) as Promise<Buffer>;
  }

  /** Fetches chunks a..b (none present, none in flight) in one request; each is in flight until it is in. */
  private startRun(l: Layer, a: number, b: number): void {
    l.c.misses += b - a + 1;
    const run = this.fetchRun(l, a, b);
    for (let i = a; i <= b; i++) {
      const k = i;
      l.inflight.set(
        k,
        run.then((bufs) => bufs[k - a] as Buffer).finally(() => l.inflight.delete(k)),
      );
    }
    // Each chunk's promise carries the failure to its reader; this one only must not go unhandled.
    run.catch(() => {});
  }

  private async fetchRun(l: Layer, a: number, b: number): Promise<Buffer[]> {
    const index = l.index;
    if (!index) throw new FuseError(Errno.EIO, `layer sha256:${l.hex} has no index`);
    const start = a * l.chunk;
    const len = Math.min(l.size, (b + 1) * l.chunk) - start;
    let r: Awaited<ReturnType<typeof httpRequest>>;
    try {
      r = await this.withRetry(l, () => httpRequest(this.url(l.hex, 'erofs'), { timeoutMs: this.o.timeoutMs, agent: this.agent, headers: { range: `bytes=${start}-${start + len - 1}` }, maxBytes: len + 1 }));
    } catch (err) {
      l.c.errors++;
      this.o.onFetchError?.(`sha256:${l.hex}`, (err as Error).message);
      throw new FuseError(Errno.EIO, (err as Error).message);
    }
    l.c.fetchedBytes += r.body.length;
    if (r.status !== 206 && !(r.status === 200 && start === 0 && len === l.size)) {
      l.c.errors++;
      const msg = `layer sha256:${l.hex}: the store answered HTTP ${r.status} to a range request`;
      this.o.onFetchError?.(`sha256:${l.hex}`, msg);
      throw new FuseError(Errno.EIO, msg);
    }
    const bufs: Buffer[] = [];
    for (let i = a; i <= b; i++) {
      const from = (i - a) * l.chunk;
      const buf = r.body.subarray(from, from + this.chunkLen(l, i));
      if (r.body.length !== len || !verifyChunk(index, i, buf)) {
        l.c.corrupt++;
        const msg = `layer sha256:${l.hex}: chunk ${i} from the store does not match its digest`;
        this.o.onFetchError?.(`sha256:${l.hex}`, msg);
        throw new FuseError(Errno.EIO, msg);
      }
      bufs.push(buf);
    }
    if (this.makeRoom(len, l)) {
      const fh = await this.ensureFile(l);
      await fh.write(r.body, 0, len, start);
      for (let i = a; i <= b; i++) {
        if (l.present[i]) continue;
        const n = this.chunkLen(l, i);
        l.present[i] = 1;
        l.checked[i] = 1;
        l.cachedBytes += n;
        this.cachedBytes += n;
      }
      l.complete = l.cachedBytes === l.size;
      this.markDirty(l);
    } else {
      this.uncachedChunks += b - a + 1;
    }
    return bufs;
  }

  private async withRetry<T>(l: Layer, f: () => Promise<T>): Promise<T> {
    const attempts = this.o.attempts ?? 2;
    let last: unknown;
    for (let a = 0; a < attempts; a++) {
      try {
        l.c.fetches++;
        return await f();
      } catch (err) {
        last = err;
        if (a + 1 < attempts) await new Promise((r) => setTimeout(r, 100 * (a + 1)));
      }
    }
    throw new Error(`layer sha256:${l.hex}: store ${this.o.storeUrl} unreachable: ${(last as Error).message}`);
  }

  private async downloadWhole(l: Layer): Promise<void> {
    const need = l.size - l.cachedBytes;
    if (!this.makeRoom(need, l)) {
      throw new CacheFullError(`layer cache full: layer sha256:${l.hex} needs ${l.size} bytes; budget ${this.o.budgetBytes}, ${this.cachedBytes} cached and in use`);
    }
    const part = join(this.o.dir, `${l.hex}.erofs.part`);
    l.c.fetches++;
    let n: number;
    try {
      n = await httpDownload(this.url(l.hex, 'erofs'), part, { idleMs: this.o.timeoutMs, agent: this.agent, onData: (k) => (l.c.fetchedBytes += k) });
    } catch (err) {
      l.c.errors++;
      await rm(part, { force: true });
      throw new Error(`layer sha256:${l.hex}: download from ${this.o.storeUrl} failed: ${(err as Error).message}`);
    }
    const { indexFile } = await import('./chunks.ts');
    const { hex, index } = await indexFile(part, l.chunk);
    if (hex !== l.hex || n !== l.size) {
      l.c.corrupt++;
      await rm(part, { force: true });
      throw new Error(`layer sha256:${l.hex}: the blob from the store hashes to sha256:${hex} (${n} bytes); refusing to mount it`);
    }
    if (l.fh) {
      await l.fh.close();
      l.fh = null;
    }
    await rename(part, this.localPath(l.hex));
    this.cachedBytes += l.size - l.cachedBytes;
    l.cachedBytes = l.size;
    l.present.fill(1);
    l.checked.fill(1);
    l.complete = true;
    l.index = index;
    await writeFile(join(this.o.dir, `${l.hex}.idx`), index);
    await writeFile(join(this.o.dir, `${l.hex}.meta`), JSON.stringify({ size: l.size, chunk: l.chunk }));
    l.mapDirty = true;
    await this.flushMap(l);
  }

  /** Frees room for `bytes` by evicting unused layers (LRU); false if it cannot. */
  private makeRoom(bytes: number, self: Layer): boolean {
    while (this.cachedBytes + bytes > this.o.budgetBytes) {
      let victim: Layer | undefined;
      for (const l of this.layers.values()) {
        if (l === self || l.users > 0 || l.cachedBytes === 0 || l.inflight.size > 0 || l.whole !== undefined) continue;
        if (!victim || l.lastUsed < victim.lastUsed) victim = l;
      }
      if (!victim) {
        this.o.onPressure?.();
        return false;
      }
      this.evict(victim);
    }
    return true;
  }

  private evict(l: Layer): void {
    this.evictions++;
    this.evictedBytes += l.cachedBytes;
    this.cachedBytes -= l.cachedBytes;
    l.cachedBytes = 0;
    l.present.fill(0);
    l.checked.fill(0);
    l.complete = false;
    const fh = l.fh;
    l.fh = null;
    l.mapDirty = false;
    void (async () => {
      await fh?.close().catch(() => {});
      await this.removeFiles(l.hex, true);
    })();
  }

  private async removeFiles(hex: string, keepIndex = false): Promise<void> {
    const exts = keepIndex ? ['erofs', 'map'] : ['erofs', 'map', 'idx', 'meta'];
    await Promise.all(exts.map((e) => rm(join(this.o.dir, `${hex}.${e}`), { force: true })));
  }

  private markDirty(l: Layer): void {
    l.mapDirty = true;
    this.mapTimer ??= setTimeout(() => {
      this.mapTimer = undefined;
      void this.flushAll();
    }, 500);
  }

  private async flushMap(l: Layer): Promise<void> {
    if (!l.mapDirty) return;
    l.mapDirty = false;
    const tmp = join(this.o.dir, `${l.hex}.map.tmp`);
    await writeFile(tmp, l.present);
    await rename(tmp, join(this.o.dir, `${l.hex}.map`));
  }

  async flushAll(): Promise<void> {
    for (const l of this.layers.values()) await this.flushMap(l).catch(() => {});
  }

  /** Forgets a layer's cached bytes (it must not be in use). */
  async drop(digest: string): Promise<boolean> {
    const l = this.layers.get(digest.replace(/^sha256:/, ''));
    if (!l || l.users > 0) return false;
    this.evict(l);
    this.layers.delete(l.hex);
    await this.removeFiles(l.hex);
    return true;
  }

  stats(): LayerCacheStats & LayerReadStats {
    const layers: Array<LayerStats & LayerReadStats> = [...this.layers.values()].map((l) => ({ digest: `sha256:${l.hex}`, size: l.size, cachedBytes: l.cachedBytes, complete: l.complete, users: l.users, ...l.c, readBytes: l.readBytes }));
    const sum = (k: keyof LayerCounters) => layers.reduce((s, l) => s + l[k], 0);
    return {
      dir: this.o.dir,
      budgetBytes: this.o.budgetBytes,
      cachedBytes: this.cachedBytes,
      evictions: this.evictions,
      evictedBytes: this.evictedBytes,
      uncachedChunks: this.uncachedChunks,
      fetchedBytes: sum('fetchedBytes'),
      hits: sum('hits'),
      misses: sum('misses'),
      readBytes: layers.reduce((s, l) => s + l.readBytes, 0),
      layers,
    };
  }

  async close(): Promise<void> {
    clearTimeout(this.mapTimer);
    await this.flushAll();
    for (const l of this.layers.values()) await l.fh?.close().catch(() => {});
    this.agent.destroy();
  }
}
