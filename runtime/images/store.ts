/**
 * The local image store: content-addressed EROFS layer blobs and image manifests. An image is an
 * ordered list of layers (bottom first) plus the process defaults its sandboxes start with.
 * Several nodes on one host share one store; writes are atomic renames, so concurrent builders
 * of the same layer both succeed and leave one blob.
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ProtocolError } from '../../protocol/index.ts';
import { run } from '../proc.ts';

export interface LayerRef {
  /** `sha256:<hex>` of the blob's bytes. */
  digest: string;
  size: number;
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
}

const NAME = /^[a-z0-9][a-z0-9._-]{0,127}(:[A-Za-z0-9._-]{1,128})?$/;

export async function sha256File(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(path)) h.update(chunk as Buffer);
  return h.digest('hex');
}

export class ImageStore {
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
    const hex = digest.startsWith('sha256:') ? digest.slice(7) : digest;
    if (!/^[0-9a-f]{64}$/.test(hex)) throw new ProtocolError('INVALID_REQUEST', `bad digest ${digest}`);
    return join(this.blobsDir, `${hex}.erofs`);
  }

  /** A scratch path inside the store's filesystem, so that finished files can be renamed in. */
  tmpPath(prefix: string): string {
    return join(this.root, 'tmp', `${prefix}-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`);
  }

  /** Turns a directory into an EROFS layer blob; returns its reference. */
  async buildLayer(dir: string): Promise<LayerRef> {
    const tmp = this.tmpPath('layer');
    try {
      // -T0 and --all-root make the blob a function of the tree's content: same tree, same digest.
      await run('mkfs.erofs', ['--quiet', '-T0', '--all-root', tmp, dir], { timeoutMs: 600_000 });
      const hex = await sha256File(tmp);
      const { size } = await stat(tmp);
      await rename(tmp, this.blobPath(hex));
      return { digest: `sha256:${hex}`, size };
    } finally {
      await rm(tmp, { force: true });
    }
  }

  async putManifest(m: ImageManifest): Promise<void> {
    if (!NAME.test(m.name)) throw new ProtocolError('INVALID_SPEC', `bad image name ${m.name}`);
    for (const l of m.layers) await stat(this.blobPath(l.digest));
    const tmp = this.tmpPath('manifest');
    await writeFile(tmp, JSON.stringify(m, null, 2));
    await rename(tmp, join(this.manifestsDir, `${m.name}.json`));
  }

  /** Forgets an image (its blobs stay until garbage-collected). */
  async removeManifest(name: string): Promise<void> {
    if (!NAME.test(name)) return;
    await rm(join(this.manifestsDir, `${name}.json`), { force: true });
  }

  async get(name: string): Promise<ImageManifest | null> {
    if (!NAME.test(name)) return null;
    try {
      return JSON.parse(await readFile(join(this.manifestsDir, `${name}.json`), 'utf8')) as ImageManifest;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
      throw e;
    }
  }

  async list(): Promise<string[]> {
    const names = await readdir(this.manifestsDir).catch(() => [] as string[]);
    return names.filter((n) => n.endsWith('.json')).map((n) => n.slice(0, -5));
  }
}
