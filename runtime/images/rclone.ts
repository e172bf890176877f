/**
 * A layer store in any object store rclone reaches — S3 and its kin, GCS, Azure Blob, WebDAV, SFTP —
 * named `rclone:<remote>:<path>` (a configured remote, or an on-the-fly one such as
 * `:s3,provider=AWS,env_auth=true:bucket/paddock`). It holds the store's layout (store.ts) as
 * objects. The CLI pushes, pulls, lists and collects through the `rclone` command; a node reads
 * layer ranges through `rclone serve http` on loopback, which turns HTTP Range requests into
 * ranged object reads, so the lazy loader speaks one protocol whatever the store.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { ProtocolError } from '../../protocol/index.ts';
import { run } from '../proc.ts';
import { httpRequest } from './http.ts';
import type { GcResult, LayerStore } from './layer-store.ts';
import { type BlobInfo, checkManifest, hexOf, IMAGE_NAME, type ImageManifest, type LayerRef, sweepBlobs } from './store.ts';

/** Bounded retries and timeouts: a store that stops answering must fail a command, not hang it. */
const FLAGS = ['--contimeout', '10s', '--timeout', '30s', '--low-level-retries', '2', '--retries', '1'];

interface LsEntry {
  Path: string;
  Name: string;
  Size: number;
  ModTime: string;
  IsDir: boolean;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export class RcloneLayerStore implements LayerStore {
  readonly location: string;
  private serveProc?: ChildProcess;
  private serveUrl?: Promise<string>;

  /** `remote` is rclone's own path syntax: `remote:bucket/prefix`. */
  constructor(private readonly remote: string) {
    this.remote = remote.replace(/\/+$/, '');
    this.location = `rclone:${this.remote}`;
  }

  private path(p: string): string {
    return `${this.remote}/${p}`;
  }

  private async rclone(args: string[], o: { input?: string; allowFail?: boolean; timeoutMs?: number } = {}) {
    try {
      return await run('rclone', [...args, ...FLAGS], { input: o.input, allowFail: o.allowFail, timeoutMs: o.timeoutMs ?? 120_000 });
    } catch (err) {
      throw new ProtocolError('UNAVAILABLE', `layer store ${this.location}: ${(err as Error).message}`, { cause: err });
    }
  }

  private async ls(dir: string): Promise<LsEntry[]> {
    const r = await this.rclone(['lsjson', '--files-only', this.path(dir)], { allowFail: true });
    if (r.code !== 0) {
      // A directory that does not exist yet is an empty store, not an error (object stores have no directories).
      if (/not found|doesn't exist|no such|directory not found/i.test(r.stderr)) return [];
      throw new ProtocolError('UNAVAILABLE', `layer store ${this.location}: rclone lsjson ${dir}: ${r.stderr.trim()}`);
    }
    return JSON.parse(r.stdout || '[]') as LsEntry[];
  }

  private async cat(p: string): Promise<string | null> {
    const r = await this.rclone(['cat', this.path(p)], { allowFail: true });
    if (r.code === 0) return r.stdout;
    if (/not found|doesn't exist|no such|object not found/i.test(r.stderr)) return null;
    throw new ProtocolError('UNAVAILABLE', `layer store ${this.location}: rclone cat ${p}: ${r.stderr.trim()}`);
  }

  async list(): Promise<string[]> {
    return (await this.ls('manifests'))
      .map((e) => e.Name)
      .filter((n) => n.endsWith('.json') && IMAGE_NAME.test(n.slice(0, -5)))
      .map((n) => n.slice(0, -5))
      .sort((a, b) => a.localeCompare(b));
  }

  async get(name: string): Promise<ImageManifest | null> {
    if (!IMAGE_NAME.test(name)) return null;
    const text = await this.cat(`manifests/${name}.json`);
    return text === null ? null : checkManifest(JSON.parse(text), name);
  }

  async put(m: ImageManifest): Promise<ImageManifest> {
    checkManifest(m);
    const have = new Set((await this.listBlobs()).map((b) => b.digest));
    for (const l of m.layers) {
      if (!have.has(`sha256:${hexOf(l.digest)}`)) throw new ProtocolError('INVALID_SPEC', `image ${m.name}: layer ${l.digest} is not in ${this.location}`);
      if (!l.index) throw new ProtocolError('INVALID_SPEC', `image ${m.name}: layer ${l.digest} has no chunk index`);
    }
    await this.rclone(['rcat', this.path(`manifests/${m.name}.json`)], { input: JSON.stringify(m, null, 2) });
    return m;
  }

  async remove(name: string): Promise<void> {
    if (!IMAGE_NAME.test(name)) return;
    await this.rclone(['deletefile', this.path(`manifests/${name}.json`)], { allowFail: true });
  }

  async listBlobs(): Promise<BlobInfo[]> {
    return (await this.ls('blobs/sha256'))
      .filter((e) => /^[0-9a-f]{64}\.erofs$/.test(e.Name))
      .map((e) => ({ digest: `sha256:${e.Name.slice(0, 64)}`, size: e.Size, mtimeMs: Date.parse(e.ModTime) }));
  }

  async statBlob(digest: string): Promise<BlobInfo | null> {
    const hex = hexOf(digest);
    return (await this.listBlobs()).find((b) => b.digest === `sha256:${hex}`) ?? null;
  }

  async pushBlob(ref: LayerRef, file: string, indexFile: string): Promise<void> {
    const hex = hexOf(ref.digest);
    // The index first: a blob visible without its index could not be loaded lazily.
    await this.rclone(['copyto', indexFile, this.path(`blobs/sha256/${hex}.idx`)]);
    await this.rclone(['copyto', file, this.path(`blobs/sha256/${hex}.erofs`)], { timeoutMs: 3600_000 });
  }

  async download(digest: string, dest: string): Promise<void> {
    await this.rclone(['copyto', this.path(`blobs/sha256/${hexOf(digest)}.erofs`), dest], { timeoutMs: 3600_000 });
  }

  gc(graceMs: number, inUse: Iterable<string> = []): Promise<GcResult> {
    return sweepBlobs(this, graceMs, inUse, async (digest) => {
      const hex = hexOf(digest);
      await this.rclone(['deletefile', this.path(`blobs/sha256/${hex}.erofs`)]);
      await this.rclone(['deletefile', this.path(`blobs/sha256/${hex}.idx`)], { allowFail: true });
    });
  }

  /** Starts `rclone serve http` on loopback (once) and resolves to its URL when it answers. */
  readUrl(): Promise<string> {
    this.serveUrl ??= (async () => {
      const port = await freePort();
      const url = `http://127.0.0.1:${port}`;
      const child = spawn('rclone', ['serve', 'http', this.remote, '--addr', `127.0.0.1:${port}`, '--read-only', '--dir-cache-time', '10s', ...FLAGS], { stdio: ['ignore', 'ignore', 'pipe'] });
      this.serveProc = child;
      let err = '';
      child.stderr?.on('data', (d: Buffer) => {
        err = (err + d.toString()).slice(-2000);
      });
      const deadline = Date.now() + 20_000;
      for (;;) {
        if (child.exitCode !== null) throw new ProtocolError('UNAVAILABLE', `rclone serve http ${this.remote} exited: ${err.trim()}`);
        const ok = await httpRequest(`${url}/`, { method: 'HEAD', timeoutMs: 1000 }).then(
          () => true,
          () => false,
        );
        if (ok) return url;
        if (Date.now() > deadline) {
          child.kill('SIGKILL');
          throw new ProtocolError('UNAVAILABLE', `rclone serve http ${this.remote} did not answer: ${err.trim()}`);
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    })();
    return this.serveUrl;
  }

  async close(): Promise<void> {
    const p = this.serveProc;
    if (p && p.exitCode === null && p.signalCode === null) {
      const exited = new Promise<void>((r) => p.once('exit', () => r()));
      p.kill('SIGTERM');
      const t = setTimeout(() => p.kill('SIGKILL'), 3000);
      await exited;
      clearTimeout(t);
    }
  }
}
