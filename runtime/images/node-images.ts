/**
 * Images as one node sees them: the store it reads manifests and layer bytes from, the layers it
 * has mounted, and the composition of a sandbox's rootfs from up to three images.
 *
 * With no PADDOCK_STORE_URL the node serves the host's image directory itself (server.ts) on
 * loopback and reads from that, so even a one-host Paddock reads its layers over the network path
 * a cluster uses. With `rclone:<remote>:<path>` it runs `rclone serve http` beside it and reads
 * layer ranges from that.
 */

import { rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { type NodeLayerStats, ProtocolError, type SandboxSpec } from '../../protocol/index.ts';
import type { NodeConfig } from '../config.ts';
import { ensureBusyboxImage } from './busybox.ts';
import { STORE_URL_FILE } from './cache.ts';
import { DEFAULT_CHUNK, indexFile, sha256 } from './chunks.ts';
import type { LayerStore } from './layer-store.ts';
import { LayerManager } from './layers.ts';
import { openStore } from './remote.ts';
import { StoreServer } from './server.ts';
import { type ImageManifest, ImageStore, type LayerRef } from './store.ts';

interface Log {
  warn(o: object, msg: string): void;
  info(o: object, msg: string): void;
}

/** The rootfs of a sandbox made of base, toolkit and workspace images, bottom first. */
export function compose(base: ImageManifest, toolkit?: ImageManifest, workspace?: ImageManifest): ImageManifest {
  const parts = [base, toolkit, workspace].filter((m): m is ImageManifest => m !== undefined);
  const seen = new Set<string>();
  const layers: LayerRef[] = [];
  for (const m of parts) {
    for (const l of m.layers) {
      // An image built on the same base lists it again: overlay needs it once, at the bottom.
      if (seen.has(l.digest)) continue;
      seen.add(l.digest);
      layers.push(l);
    }
  }
  const env = new Map<string, string>();
  for (const m of parts) for (const kv of m.env) env.set(kv.slice(0, kv.indexOf('=')), kv);
  const cwd = [...parts].reverse().find((m) => m.cwd !== '/')?.cwd ?? base.cwd;
  return { ...base, name: parts.map((m) => m.name).join('+'), layers, env: [...env.values()], cwd };
}

const MANIFEST_TTL_MS = 500;

export interface NodeImagesOptions {
  /**
   * Mount layers (the FUSE daemon, the layer cache): what a container or microVM node needs. A
   * node of simulated sandboxes only names images: without layers it reads manifests and names and
   * starts no daemon, so a process can hold a fleet of them on one store.
   */
  layers?: boolean;
}

export class NodeImages {
  private store!: LayerStore;
  private server?: StoreServer;
  layers!: LayerManager;
  /** The http:// base URL layers are read from (announced in the node record). */
  storeUrl = '';
  private names: { at: number; list: string[] } = { at: 0, list: [] };

  constructor(
    private readonly cfg: NodeConfig,
    private readonly log: Log,
    private readonly o: NodeImagesOptions = {},
  ) {}

  async start(): Promise<void> {
    const l = this.cfg.layers;
    if (!l.store) {
      const local = new ImageStore(this.cfg.imagesDir);
      await local.init();
      await ensureBusyboxImage(local);
      this.server = new StoreServer(local);
      const i = l.listen.lastIndexOf(':');
      this.storeUrl = await this.server.listen(l.listen.slice(0, i) || '127.0.0.1', Number(l.listen.slice(i + 1) || 0));
      this.store = openStore(this.storeUrl, { timeoutMs: l.timeoutMs });
    } else {
      this.store = openStore(l.store, { timeoutMs: l.timeoutMs });
      const url = await this.store.readUrl();
      if (!url) throw new Error(`PADDOCK_STORE_URL=${l.store}: not a store nodes can read layers from (http://… or rclone:…)`);
      this.storeUrl = url;
    }
    if (this.o.layers === false) {
      this.log.info({ store: this.storeUrl, embedded: !!this.server, layers: false }, 'layer store ready (names and manifests only)');
      return;
    }
    this.layers = new LayerManager({
      nodeDir: this.cfg.nodeDir,
      cacheDir: l.cacheDir,
      budgetBytes: l.cacheBytes,
      mode: l.mode,
      storeUrl: this.storeUrl,
      timeoutMs: l.timeoutMs,
      idleMs: l.idleMs,
      readaheadBytes: l.readaheadKiB === undefined ? undefined : l.readaheadKiB * 1024,
      log: this.log,
    });
    await this.layers.start();
    // For a layer daemon a killed predecessor left serving its sandboxes (lazyfs-main.ts).
    await writeFile(join(this.cfg.nodeDir, `${STORE_URL_FILE}.new`), this.storeUrl);
    await rename(join(this.cfg.nodeDir, `${STORE_URL_FILE}.new`), join(this.cfg.nodeDir, STORE_URL_FILE));
    this.log.info({ store: this.storeUrl, embedded: !!this.server, mode: l.mode, cacheBytes: l.cacheBytes }, 'layer store ready');
  }

  /** Image names the store holds (refreshed at most every second: heartbeats ask often). */
  async list(): Promise<string[]> {
    if (this.o.layers === false) return this.catalogList();
    if (Date.now() - this.names.at > 1000) this.names = { at: Date.now(), list: await this.store.list() };
    return this.names.list;
  }

  private refreshing?: Promise<string[]>;

  /**
   * A catalog shared by a fleet of simulated nodes answers from what it last read and refreshes
   * in the background, one read at a time: every create checks its image, and a busy fleet
   * process, whose own event loop serves the store, once sent hundreds of reads at each expiry
   * and timed its nodes' heartbeats out behind them (placement then saw no live node).
   */
  private catalogList(): Promise<string[]> {
    const stale = Date.now() - this.names.at > 1000;
    if (stale && !this.refreshing) {
      this.refreshing = this.store.list().then(
        (list) => {
          this.names = { at: Date.now(), list };
          this.refreshing = undefined;
          return list;
        },
        (err: unknown) => {
          this.refreshing = undefined;
          if (this.names.at === 0) throw err;
          this.log.warn({ err }, 'image catalog not refreshed: the last list stands');
          return this.names.list;
        },
      );
    }
    // Only a catalog that has never been read waits for the store.
    const first = this.names.at === 0 ? this.refreshing : undefined;
    return first ?? Promise.resolve(this.names.list);
  }

  /**
   * A manifest read in the last MANIFEST_TTL_MS, or the read in flight: a burst of creates of one
   * image asks the store once (each read is an HTTP round trip, ~1 ms of the node's CPU). Kept well
   * under the second a pushed image takes to reach the nodes' heartbeats anyway; misses are not kept.
   */
  private readonly manifests = new Map<string, { at: number; m: Promise<ImageManifest | null> }>();

  private getManifest(name: string): Promise<ImageManifest | null> {
    const hit = this.manifests.get(name);
    if (hit && Date.now() - hit.at < MANIFEST_TTL_MS) return hit.m;
    const m = this.store.get(name);
    this.manifests.set(name, { at: Date.now(), m });
    const forget = () => {
      if (this.manifests.get(name)?.m === m) this.manifests.delete(name);
    };
    void m.then((found) => (found ? undefined : forget()), forget);
    if (this.manifests.size > 1024) this.manifests.clear();
    return m;
  }

  private async need(field: 'image' | 'toolkit' | 'workspace', name: string): Promise<ImageManifest> {
    let m: ImageManifest | null;
    try {
      m = await this.getManifest(name);
    } catch (err) {
      throw new ProtocolError('BACKEND_FAILED', `${field}: the layer store ${this.store.location} cannot be read: ${(err as Error).message}`, { cause: err });
    }
    if (!m) throw new ProtocolError('INVALID_SPEC', `${field}: unknown image '${name}' (known: ${(await this.list().catch(() => [])).join(', ')})`, { detail: { field } });
    return m;
  }

  /** The manifest a sandbox runs: its base image with its toolkit and workspace layered on top. */
  async forSpec(spec: SandboxSpec): Promise<ImageManifest> {
    const [base, toolkit, workspace] = await Promise.all([
      this.need('image', spec.image),
      spec.toolkit === undefined ? undefined : this.need('toolkit', spec.toolkit),
      spec.workspace === undefined ? undefined : this.need('workspace', spec.workspace),
    ]);
    return compose(base, toolkit, workspace);
  }

  /** The store as snapshots of sandboxes' files use it: blobs pushed, images put, read and removed. */
  get snapshotImages(): { pushLayer(file: string): Promise<LayerRef>; get(name: string): Promise<ImageManifest | null>; put(m: ImageManifest): Promise<ImageManifest>; remove(name: string): Promise<void> } {
    return {
      pushLayer: async (file) => {
        const { hex, size, index } = await indexFile(file, DEFAULT_CHUNK);
        const ref: LayerRef = { digest: `sha256:${hex}`, size, index: `sha256:${sha256(index)}`, chunk: DEFAULT_CHUNK };
        const idx = `${file}.idx`;
        await writeFile(idx, index);
        try {
          await this.store.pushBlob(ref, file, idx);
        } finally {
          await rm(idx, { force: true });
        }
        return ref;
      },
      // Not through the manifest cache: a snapshot's image is new, and a miss is not kept anyway.
      get: (name) => this.store.get(name),
      put: (m) => this.store.put(m),
      remove: (name) => this.store.remove(name),
    };
  }

  stats(): Promise<NodeLayerStats> {
    if (!this.layers) {
      const l = this.cfg.layers;
      return Promise.resolve({ dir: l.cacheDir, budgetBytes: 0, cachedBytes: 0, evictions: 0, evictedBytes: 0, uncachedChunks: 0, fetchedBytes: 0, hits: 0, misses: 0, layers: [], mode: l.mode, store: this.storeUrl, mounted: [] });
    }
    return this.layers.stats();
  }

  async close(): Promise<void> {
    await this.layers?.close().catch((err: unknown) => this.log.warn({ err }, 'closing layers failed'));
    await this.store?.close();
    await this.server?.close();
  }
}
