/**
 * The local image store: content-addressed EROFS layer blobs, their chunk indexes and image
 * manifests. An image is an ordered list of layers (bottom first) plus the process defaults its
 * sandboxes start with. Several nodes on one host share one store; writes are atomic renames, so
 * concurrent builders of the same layer both succeed and leave one blob.
 *
 * Layout (the same on disk, over HTTP and in an object-store bucket):
 *   blobs/sha256/<hex>.erofs   a layer
 *   blobs/sha256/<hex>.idx     its chunk index (chunks.ts)
 *   manifests/<name>.json      an image
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ProtocolError } from '../../protocol/index.ts';
import { run } from '../proc.ts';
import { DEFAULT_CHUNK, indexFile, sha256 } from './chunks.ts';

export interface LayerRef {
  /** `sha256:<hex>` of the blob's bytes. */
  digest: string;
  size: number;
  /** `sha256:<hex>` of the blob's chunk index: what lazy loading checks each chunk against. */
  index?: string;
  /** Chunk size of that index in bytes. */
  chunk?: number;
}

export interface ImageManifest {
  name: string;
  /** Bottom layer first. */
  layers: LayerRef[];
  env: string[];
  cwd: string;
  user: { uid: number; gid: number };
  /** The long-running init of a sandbox: any program of the image that waits forever. */
  init: string[];
  /** What `paddock image build` recorded as the image's default command (informational). */
  cmd?: string[];
  /** For images Paddock builds itself: the digest of the spec and builder that made it (build.ts recipeOf). */
  recipe?: string;
}

/**
 * A collection's sweep, for every kind of store: removes each blob that no manifest names, that
 * no running sandbox reads (`inUse`: digests the live nodes have mounted or attached), and that is
 * older than `graceMs`. Sandboxes read their layers lazily for as long as they live, and a layer
 * can lose its last manifest while they do (a fork's, a deleted snapshot's, an image removed with
 * `image rm`): taken then, the sandbox's next unread chunk is an I/O error.
 */
export async function sweepBlobs(
  store: { list(): Promise<string[]>; get(name: string): Promise<ImageManifest | null>; listBlobs(): Promise<BlobInfo[]> },
  graceMs: number,
  inUse: Iterable<string>,
  remove: (digest: string) => Promise<void>,
): Promise<{ removed: string[]; freedBytes: number; kept: number }> {
  const used = new Set<string>();
  for (const d of inUse) used.add(`sha256:${hexOf(d)}`);
  for (const name of await store.list()) {
    const m = await store.get(name).catch(() => null);
    for (const l of m?.layers ?? []) used.add(`sha256:${hexOf(l.digest)}`);
  }
  const removed: string[] = [];
  let freedBytes = 0;
  let kept = 0;
  const now = Date.now();
  for (const b of await store.listBlobs()) {
    if (used.has(b.digest) || now - b.mtimeMs < graceMs) {
      kept++;
      continue;
    }
    await remove(b.digest);
    removed.push(b.digest);
    freedBytes += b.size;
  }
  return { removed, freedBytes, kept };
}

export interface BlobInfo {
  digest: string;
  size: number;
  mtimeMs: number;
}

export const IMAGE_NAME = /^[a-z0-9][a-z0-9._-]{0,127}(:[A-Za-z0-9._-]{1,128})?$/;
const HEX = /^[0-9a-f]{64}$/;

export function hexOf(digest: string): string {
  const hex = digest.startsWith('sha256:') ? digest.slice(7) : digest;
  if (!HEX.test(hex)) throw new ProtocolError('INVALID_REQUEST', `bad digest ${digest}`);
  return hex;
}

export async function sha256File(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest('hex');
}

/** Checks a manifest read from anywhere (a file, the network) before anything uses it. */
export function checkManifest(m: unknown, name?: string): ImageManifest {
  const bad = (why: string): never => {
    throw new ProtocolError('INVALID_SPEC', `image manifest${name ? ` ${name}` : ''}: ${why}`);
  };
  if (typeof m !== 'object' || m === null) bad('not an object');
  const x = m as Record<string, unknown>;
  if (typeof x.name !== 'string' || !IMAGE_NAME.test(x.name)) bad(`bad name ${JSON.stringify(x.name)}`);
  if (!Array.isArray(x.layers) || x.layers.length === 0 || x.layers.length > 64) bad('layers: 1 to 64 layers');
  for (const l of x.layers as unknown[]) {
    const r = l as Record<string, unknown>;
    if (typeof r?.digest !== 'string' || !HEX.test(r.digest.replace(/^sha256:/, ''))) bad('layer digest');
    if (typeof r.size !== 'number' || !Number.isInteger(r.size) || r.size <= 0) bad('layer size');
    if (r.index !== undefined && (typeof r.index !== 'string' || !HEX.test(r.index.replace(/^sha256:/, '')))) bad('layer index');
    if (r.chunk !== undefined && (typeof r.chunk !== 'number' || !Number.isInteger(r.chunk) || r.chunk < 4096 || r.chunk > 16 * 1024 * 1024)) bad('layer chunk');
  }
  if (!Array.isArray(x.env) || !x.env.every((e) => typeof e === 'string' && e.includes('='))) bad('env: KEY=VALUE strings');
  if (typeof x.cwd !== 'string' || !x.cwd.startsWith('/')) bad('cwd: an absolute path');
  const u = x.user as Record<string, unknown> | undefined;
  if (!u || !Number.isInteger(u.uid) || !Number.isInteger(u.gid)) bad('user: {uid, gid}');
  if (!Array.isArray(x.init) || x.init.length === 0 || !x.init.every((a) => typeof a === 'string')) bad('init: a non-empty command');
  if (x.recipe !== undefined && (typeof x.recipe !== 'string' || !HEX.test(x.recipe))) bad('recipe: a sha256 hex digest');
  return m as ImageManifest;
}

const NULL_UUID = '00000000-0000-0000-0000-000000000000';

export class ImageStore {
  /** Layers this process turned into blobs with mkfs.erofs (the O(m) update test counts them). */
  builds = 0;

  constructor(readonly root: string) {}

  private get blobsDir() {
    return join(this.root, 'blobs', 'sha256');
  }
  private get manifestsDir() {
    return join(this.root, 'manifests');
  }

  async init(): Promise<void> {
    await mkdir(this.blobsDir, { recursive: true });
    await mkdir(this.manifestsDir, { recursive: true });
    await mkdir(join(this.root, 'tmp'), { recursive: true });
  }

  blobPath(digest: string): string {
    return join(this.blobsDir, `${hexOf(digest)}.erofs`);
  }

  indexPath(digest: string): string {
    return join(this.blobsDir, `${hexOf(digest)}.idx`);
  }

  manifestPath(name: string): string {
    if (!IMAGE_NAME.test(name)) throw new ProtocolError('INVALID_SPEC', `bad image name ${name}`);
    return join(this.manifestsDir, `${name}.json`);
  }

  /** A scratch path inside the store's filesystem, so that finished files can be renamed in. */
  tmpPath(prefix: string): string {
    return join(this.root, 'tmp', `${prefix}-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`);
  }

  /** Turns a directory into an EROFS layer blob (and its chunk index); returns its reference. */
  async buildLayer(dir: string): Promise<LayerRef> {
    const tmp = this.tmpPath('layer');
    try {
      // The blob must be a function of the tree's content (same tree, same digest): -T0 fixes
      // every timestamp, --all-root the owners, and -U the filesystem UUID, which mkfs.erofs
      // otherwise draws at random (bytes 1029–1044 of the superblock). The null UUID, because
      // overlayfs uses lower layers' UUIDs only to decode file handles (index, nfs_export: off
      // here): null means none, where layers sharing one non-null UUID are flagged as duplicates.
      await run('mkfs.erofs', ['--quiet', '-T0', '--all-root', `-U${NULL_UUID}`, tmp, dir], { timeoutMs: 600_000 });
      this.builds++;
      return await this.importBlob(tmp);
    } finally {
      await rm(tmp, { force: true });
    }
  }

  /**
   * Moves a finished blob file into the store, with its index. With `expect`, a blob whose bytes do
   * not hash to it is refused (and removed).
   */
  async importBlob(file: string, expect?: string, chunk = DEFAULT_CHUNK): Promise<LayerRef> {
    const { hex, size, index } = await indexFile(file, chunk);
    if (expect !== undefined && hexOf(expect) !== hex) {
      await rm(file, { force: true });
      throw new ProtocolError('INVALID_REQUEST', `blob digest mismatch: expected ${expect}, got sha256:${hex}`);
    }
    const idxTmp = this.tmpPath('idx');
    await writeFile(idxTmp, index);
    await rename(idxTmp, this.indexPath(hex));
    await rename(file, this.blobPath(hex));
    return { digest: `sha256:${hex}`, size, index: `sha256:${sha256(index)}`, chunk };
  }

  /** A layer reference with its index filled in (computing the index for blobs stored before indexes existed). */
  async indexed(ref: LayerRef): Promise<LayerRef> {
    if (ref.index && ref.chunk) return ref;
    const idx = await readFile(this.indexPath(ref.digest)).catch(() => null);
    if (idx && idx.length === Math.ceil(ref.size / DEFAULT_CHUNK) * 32) return { ...ref, index: `sha256:${sha256(idx)}`, chunk: DEFAULT_CHUNK };
    const { hex, index } = await indexFile(this.blobPath(ref.digest));
    if (`sha256:${hex}` !== ref.digest) throw new ProtocolError('BACKEND_FAILED', `blob ${ref.digest} in ${this.root} is corrupt (its bytes hash to sha256:${hex})`);
    const tmp = this.tmpPath('idx');
    await writeFile(tmp, index);
    await rename(tmp, this.indexPath(ref.digest));
    return { ...ref, index: `sha256:${sha256(index)}`, chunk: DEFAULT_CHUNK };
  }

  async statBlob(digest: string): Promise<BlobInfo | null> {
    const s = await stat(this.blobPath(digest)).catch(() => null);
    return s ? { digest: `sha256:${hexOf(digest)}`, size: s.size, mtimeMs: s.mtimeMs } : null;
  }

  async listBlobs(): Promise<BlobInfo[]> {
    const out: BlobInfo[] = [];
    for (const f of await readdir(this.blobsDir).catch(() => [] as string[])) {
      if (!f.endsWith('.erofs')) continue;
      const s = await stat(join(this.blobsDir, f)).catch(() => null);
      if (s) out.push({ digest: `sha256:${f.slice(0, -6)}`, size: s.size, mtimeMs: s.mtimeMs });
    }
    return out;
  }

  async removeBlob(digest: string): Promise<void> {
    await rm(this.indexPath(digest), { force: true });
    await rm(this.blobPath(digest), { force: true });
  }

  async putManifest(m: ImageManifest): Promise<ImageManifest> {
    if (!IMAGE_NAME.test(m.name)) throw new ProtocolError('INVALID_SPEC', `bad image name ${m.name}`);
    const layers: LayerRef[] = [];
    for (const l of m.layers) {
      if (!(await this.statBlob(l.digest))) throw new ProtocolError('INVALID_SPEC', `image ${m.name}: layer ${l.digest} is not in the store`);
      layers.push(await this.indexed(l));
    }
    const full = checkManifest({ ...m, layers });
    const tmp = this.tmpPath('manifest');
    await writeFile(tmp, JSON.stringify(full, null, 2));
    await rename(tmp, this.manifestPath(m.name));
    return full;
  }

  /** Forgets an image (its blobs stay until garbage-collected). */
  async removeManifest(name: string): Promise<void> {
    if (!IMAGE_NAME.test(name)) return;
    await rm(this.manifestPath(name), { force: true });
  }

  async get(name: string): Promise<ImageManifest | null> {
    if (!IMAGE_NAME.test(name)) return null;
    try {
      return JSON.parse(await readFile(this.manifestPath(name), 'utf8')) as ImageManifest;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
      throw e;
    }
  }

  async list(): Promise<string[]> {
    const names = await readdir(this.manifestsDir).catch(() => [] as string[]);
    return names.filter((n) => n.endsWith('.json')).map((n) => n.slice(0, -5));
  }

  /**
   * Removes blobs no manifest names and no running sandbox reads (`inUse`, see sweepBlobs).
   * Blobs younger than `graceMs` stay: a push uploads blobs before its manifest, and a collection
   * running in between must not take them.
   */
  async gc(graceMs = 3600_000, inUse: Iterable<string> = []): Promise<{ removed: string[]; freedBytes: number; kept: number }> {
    const now = Date.now();
    const r = await sweepBlobs(this, graceMs, inUse, (digest) => this.removeBlob(digest));
    // Scratch files of builds that died.
    for (const f of await readdir(join(this.root, 'tmp')).catch(() => [] as string[])) {
      const p = join(this.root, 'tmp', f);
      const s = await stat(p).catch(() => null);
      if (s && now - s.mtimeMs > Math.max(graceMs, 3600_000)) await rm(p, { recursive: true, force: true });
    }
    return r;
  }
}
