/**
 * Layer stores a node or the CLI can talk to, behind one interface:
 *   - a directory on this host (the store's own layout, store.ts),
 *   - Paddock's embedded store over HTTP (server.ts), `http://host:port`,
 *   - any object store rclone reaches (S3, GCS, Azure, WebDAV, …), `rclone:<remote>:<path>` (rclone.ts).
 * All three hold the same layout, so `paddock image push` from one to another is a copy.
 */
import { rm } from 'node:fs/promises';
import { Agent } from 'node:http';
import { ProtocolError } from '../../protocol/index.ts';
import { type HttpResponse, httpDownload, httpRequest } from './http.ts';
import type { GcResult, LayerStore } from './layer-store.ts';
import { RcloneLayerStore } from './rclone.ts';
import { type BlobInfo, checkManifest, hexOf, type ImageManifest, ImageStore, type LayerRef } from './store.ts';

/** A store that is a directory on this host. */
export class LocalLayerStore implements LayerStore {
  readonly store: ImageStore;
  constructor(readonly location: string) {
    this.store = new ImageStore(location);
  }
  async list() {
    return (await this.store.list()).sort((a, b) => a.localeCompare(b));
  }
  get(name: string) {
    return this.store.get(name);
  }
  async put(m: ImageManifest) {
    await this.store.init();
    return this.store.putManifest(m);
  }
  remove(name: string) {
    return this.store.removeManifest(name);
  }
  listBlobs() {
    return this.store.listBlobs();
  }
  statBlob(digest: string) {
    return this.store.statBlob(digest);
  }
  async pushBlob(ref: LayerRef, file: string): Promise<void> {
    await this.store.init();
    const { copyFile } = await import('node:fs/promises');
    const tmp = this.store.tmpPath('push');
    await copyFile(file, tmp);
    await this.store.importBlob(tmp, ref.digest, ref.chunk);
  }
  async download(digest: string, dest: string): Promise<void> {
    const { copyFile } = await import('node:fs/promises');
    await copyFile(this.store.blobPath(digest), dest);
  }
  gc(graceMs: number, inUse?: Iterable<string>) {
    return this.store.gc(graceMs, inUse);
  }
  async readUrl() {
    return null;
  }
  async close() {}
}

function storeError(what: string, r: HttpResponse): ProtocolError {
  let msg = r.body.toString('utf8').slice(0, 500);
  try {
    msg = (JSON.parse(msg) as { error?: string }).error ?? msg;
  } catch {
    // not JSON
  }
  return new ProtocolError(r.status >= 400 && r.status < 500 ? 'INVALID_REQUEST' : 'UNAVAILABLE', `${what}: HTTP ${r.status}: ${msg}`);
}

/** Paddock's embedded store (server.ts) over HTTP. */
export class HttpLayerStore implements LayerStore {
  private readonly agent = new Agent({ keepAlive: true, maxSockets: 8 });
  constructor(
    readonly location: string,
    private readonly timeoutMs = 30_000,
  ) {
    this.location = location.replace(/\/+$/, '');
  }

  private async call(path: string, o: { method?: string; body?: Buffer | NodeJS.ReadableStream; headers?: Record<string, string>; timeoutMs?: number } = {}): Promise<HttpResponse> {
    try {
      return await httpRequest(`${this.location}${path}`, { ...o, timeoutMs: o.timeoutMs ?? this.timeoutMs, agent: this.agent });
    } catch (err) {
      throw new ProtocolError('UNAVAILABLE', `layer store ${this.location}: ${(err as Error).message}`, { cause: err });
    }
  }

  async list() {
    const r = await this.call('/manifests/');
    if (r.status !== 200) throw storeError('list images', r);
    return (JSON.parse(r.body.toString()) as { images: string[] }).images;
  }
  async get(name: string) {
    const r = await this.call(`/manifests/${encodeURIComponent(name)}.json`);
    if (r.status === 404) return null;
    if (r.status !== 200) throw storeError(`get image ${name}`, r);
    return checkManifest(JSON.parse(r.body.toString()), name);
  }
  async put(m: ImageManifest) {
    const r = await this.call(`/manifests/${encodeURIComponent(m.name)}.json`, { method: 'PUT', body: Buffer.from(JSON.stringify(m)), headers: { 'content-type': 'application/json' } });
    if (r.status !== 201) throw storeError(`push image ${m.name}`, r);
    return JSON.parse(r.body.toString()) as ImageManifest;
  }
  async remove(name: string) {
    const r = await this.call(`/manifests/${encodeURIComponent(name)}.json`, { method: 'DELETE' });
    if (r.status !== 200) throw storeError(`remove image ${name}`, r);
  }
  async listBlobs() {
    const r = await this.call('/blobs/');
    if (r.status !== 200) throw storeError('list blobs', r);
    return (JSON.parse(r.body.toString()) as { blobs: BlobInfo[] }).blobs;
  }
  async statBlob(digest: string) {
    const r = await this.call(`/blobs/sha256/${hexOf(digest)}.erofs`, { method: 'HEAD' });
    if (r.status === 404) return null;
    if (r.status !== 200) throw storeError(`stat ${digest}`, r);
    return { digest: `sha256:${hexOf(digest)}`, size: Number(r.headers['content-length']), mtimeMs: 0 };
  }
  async pushBlob(ref: LayerRef, file: string): Promise<void> {
    const { createReadStream } = await import('node:fs');
    const { stat } = await import('node:fs/promises');
    const { size } = await stat(file);
    // The store indexes the blob itself: at the chunk size the manifest names, or its index would not match.
    const r = await this.call(`/blobs/sha256/${hexOf(ref.digest)}.erofs${ref.chunk ? `?chunk=${ref.chunk}` : ''}`, {
      method: 'PUT',
      body: createReadStream(file),
      headers: { 'content-type': 'application/octet-stream', 'content-length': String(size) },
      timeoutMs: Math.max(this.timeoutMs, 600_000),
    });
    if (r.status !== 201) throw storeError(`push ${ref.digest}`, r);
  }
  async download(digest: string, dest: string): Promise<void> {
    try {
      await httpDownload(`${this.location}/blobs/sha256/${hexOf(digest)}.erofs`, dest, { idleMs: this.timeoutMs, agent: this.agent });
    } catch (err) {
      await rm(dest, { force: true });
      throw new ProtocolError('UNAVAILABLE', `layer store ${this.location}: ${(err as Error).message}`, { cause: err });
    }
  }
  async gc(graceMs: number, inUse: Iterable<string> = []) {
    const body = Buffer.from(JSON.stringify({ inUse: [...inUse] }));
    const r = await this.call(`/gc?graceMs=${graceMs}`, { method: 'POST', timeoutMs: 600_000, body, headers: { 'content-type': 'application/json' } });
    if (r.status !== 200) throw storeError('gc', r);
    return JSON.parse(r.body.toString()) as GcResult;
  }
  async readUrl() {
    return this.location;
  }
  async close() {
    this.agent.destroy();
  }
}

/** Opens a store by location: `http(s)://…`, `rclone:<remote>:<path>`, or a directory. */
export function openStore(location: string, o: { timeoutMs?: number } = {}): LayerStore {
  if (/^https?:\/\//.test(location)) return new HttpLayerStore(location, o.timeoutMs);
  if (location.startsWith('rclone:')) {
    return new RcloneLayerStore(location.slice('rclone:'.length));
  }
  return new LocalLayerStore(location);
}

/** Copies an image (manifest and the layers the target lacks) from one store to another. */
export async function copyImage(name: string, from: LayerStore, to: LayerStore, onLayer?: (ref: LayerRef, copied: boolean) => void): Promise<ImageManifest> {
  const m = await from.get(name);
  if (!m) throw new ProtocolError('NOT_FOUND', `no image ${name} in ${from.location}`);
  for (const l of m.layers) {
    if (await to.statBlob(l.digest)) {
      onLayer?.(l, false);
      continue;
    }
    if (from instanceof LocalLayerStore) {
      const ref = await from.store.indexed(l);
      await to.pushBlob(ref, from.store.blobPath(l.digest), from.store.indexPath(l.digest));
    } else if (to instanceof LocalLayerStore) {
      await to.store.init();
      const tmp = to.store.tmpPath('pull');
      try {
        await from.download(l.digest, tmp);
        // importBlob refuses bytes that do not hash to the digest the manifest names.
        await to.store.importBlob(tmp, l.digest, l.chunk);
      } finally {
        await rm(tmp, { force: true });
      }
    } else {
      throw new ProtocolError('INVALID_REQUEST', 'copy between two remote stores: pull to a directory first');
    }
    onLayer?.(l, true);
  }
  return to.put(m);
}
