/**
 * The embedded layer store, served over HTTP by Paddock itself: nodes read layers from it by
 * range, `paddock image push|pull|ls|gc` talk to it. Its read paths are the store's on-disk layout,
 * so a node reads the same URLs from it as from any static file server or bucket front
 * (`rclone serve http`, a CDN):
 *
 *   GET|HEAD /blobs/sha256/<hex>.erofs     a layer (Range requests: one `bytes=a-b` range)
 *   GET|HEAD /blobs/sha256/<hex>.idx       its chunk index
 *   GET      /manifests/<name>.json        an image
 *   PUT      /blobs/sha256/<hex>.erofs     push a layer: refused (400) unless its bytes hash to <hex>;
 *                                         `?chunk=N` indexes it at N-byte chunks (default 16 KiB)
 *   PUT      /manifests/<name>.json        push an image: refused (400) unless every layer is stored
 *   DELETE   /manifests/<name>.json        forget an image
 *   GET      /manifests/                   {"images": [names]}
 *   GET      /blobs/                       {"blobs": [{digest, size, mtimeMs}]}
 *   POST     /gc?graceMs=N                 remove unreferenced blobs: {removed, freedBytes, kept}
 */
import { createReadStream, createWriteStream } from 'node:fs';
import { rm, stat } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pipeline } from 'node:stream/promises';
import { ProtocolError } from '../../protocol/index.ts';
import { checkManifest, type ImageStore } from './store.ts';

const BLOB = /^\/blobs\/sha256\/([0-9a-f]{64})\.(erofs|idx)$/;
const MANIFEST = /^\/manifests\/([a-z0-9][a-z0-9._-]{0,127}(?::[A-Za-z0-9._-]{1,128})?)\.json$/;
const MANIFEST_MAX = 1024 * 1024;
/** A gc's list of layers in use: 72 bytes a digest, for tens of thousands of layers. */
const GC_BODY_MAX = 8 * 1024 * 1024;
const DIGEST = /^sha256:[0-9a-f]{64}$/;

/** Parses a single `bytes=a-b` / `bytes=a-` / `bytes=-n` range; null when absent, 'bad' when unsatisfiable. */
export function parseRange(h: string | undefined, size: number): { start: number; end: number } | null | 'bad' {
  if (!h) return null;
  const m = /^bytes=(\d*)-(\d*)$/.exec(h.trim());
  if (!m || (m[1] === '' && m[2] === '')) return 'bad';
  let start: number;
  let end: number;
  if (m[1] === '') {
    const n = Number(m[2]);
    start = Math.max(0, size - n);
    end = size - 1;
  } else {
    start = Number(m[1]);
    end = m[2] === '' ? size - 1 : Math.min(Number(m[2]), size - 1);
  }
  if (start > end || start >= size) return 'bad';
  return { start, end };
}

export interface StoreServerStats {
  requests: number;
  bytesServed: number;
}

export class StoreServer {
  private server?: Server;
  readonly stats: StoreServerStats = { requests: 0, bytesServed: 0 };

  constructor(private readonly store: ImageStore) {}

  /** Listens on `host:port` (port 0: any free port); resolves to the base URL. */
  async listen(host = '127.0.0.1', port = 0): Promise<string> {
    await this.store.init();
    const server = createServer((req, res) => {
      this.stats.requests++;
      this.handle(req, res).catch((err: unknown) => {
        const status = err instanceof ProtocolError && (err.code === 'INVALID_REQUEST' || err.code === 'INVALID_SPEC') ? 400 : 500;
        if (!res.headersSent) send(res, status, { error: (err as Error).message });
        else res.destroy();
      });
    });
    // Keep-alive connections from nodes are long-lived; do not let idle ones linger forever.
    server.keepAliveTimeout = 30_000;
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => resolve());
    });
    const a = server.address() as AddressInfo;
    return `http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`;
  }

  async close(): Promise<void> {
    const s = this.server;
    if (!s) return;
    this.server = undefined;
    s.closeAllConnections();
    await new Promise<void>((r) => s.close(() => r()));
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://x');
    const path = url.pathname;
    const method = req.method ?? 'GET';
    let m = BLOB.exec(path);
    if (m) {
      const [, hex, ext] = m as unknown as [string, string, string];
      if (method === 'GET' || method === 'HEAD') return this.serveFile(req, res, ext === 'erofs' ? this.store.blobPath(hex) : this.store.indexPath(hex));
      if (method === 'PUT' && ext === 'erofs') {
        const chunk = url.searchParams.has('chunk') ? Number(url.searchParams.get('chunk')) : undefined;
        if (chunk !== undefined && !(Number.isInteger(chunk) && chunk >= 4096 && chunk <= 16 * 1024 * 1024)) throw new ProtocolError('INVALID_REQUEST', 'chunk: an integer from 4096 to 16 MiB');
        const tmp = this.store.tmpPath('push');
        try {
          await pipeline(req, createWriteStream(tmp));
          const ref = await this.store.importBlob(tmp, hex, chunk);
          return send(res, 201, ref);
        } finally {
          await rm(tmp, { force: true });
        }
      }
      return send(res, 405, { error: `${method} not allowed on ${path}` });
    }
    m = MANIFEST.exec(path);
    if (m) {
      const name = m[1] as string;
      if (method === 'GET' || method === 'HEAD') return this.serveFile(req, res, this.store.manifestPath(name));
      if (method === 'DELETE') {
        await this.store.removeManifest(name);
        return send(res, 200, { removed: name });
      }
      if (method === 'PUT') {
        const body = await readBody(req, MANIFEST_MAX);
        let parsed: unknown;
        try {
          parsed = JSON.parse(body.toString('utf8'));
        } catch {
          throw new ProtocolError('INVALID_REQUEST', 'manifest: not JSON');
        }
        const manifest = checkManifest(parsed, name);
        if (manifest.name !== name) throw new ProtocolError('INVALID_REQUEST', `manifest name ${manifest.name} does not match the path ${name}`);
        return send(res, 201, await this.store.putManifest(manifest));
      }
      return send(res, 405, { error: `${method} not allowed on ${path}` });
    }
    if (path === '/manifests/' && method === 'GET') return send(res, 200, { images: (await this.store.list()).sort((a, b) => a.localeCompare(b)) });
    if (path === '/blobs/' && method === 'GET') return send(res, 200, { blobs: await this.store.listBlobs() });
    if (path === '/gc' && method === 'POST') {
      const grace = Number(url.searchParams.get('graceMs') ?? 3600_000);
      if (!Number.isFinite(grace) || grace < 0) throw new ProtocolError('INVALID_REQUEST', 'graceMs: a non-negative number');
      // {inUse: [digest…]}: layers running sandboxes read, kept whatever names them (an empty body: none).
      const raw = (await readBody(req, GC_BODY_MAX)).toString('utf8').trim();
      let inUse: string[] = [];
      if (raw) {
        let parsed: unknown;
        try {
          parsed = JSON.parse(raw);
        } catch {
          throw new ProtocolError('INVALID_REQUEST', 'gc: the body is not JSON');
        }
        const list = (parsed as { inUse?: unknown } | null)?.inUse ?? [];
        if (!Array.isArray(list) || !list.every((d) => typeof d === 'string' && DIGEST.test(d))) throw new ProtocolError('INVALID_REQUEST', 'gc: inUse must be a list of sha256:<64 hex> digests');
        inUse = list as string[];
      }
      return send(res, 200, await this.store.gc(grace, inUse));
    }
    return send(res, 404, { error: `no such path ${path}` });
  }

  private async serveFile(req: IncomingMessage, res: ServerResponse, file: string): Promise<void> {
    const s = await stat(file).catch(() => null);
    if (!s?.isFile()) return send(res, 404, { error: 'not found' });
    const r = parseRange(req.headers.range, s.size);
    if (r === 'bad') {
      res.writeHead(416, { 'content-range': `bytes */${s.size}` });
      res.end();
      return;
    }
    const start = r ? r.start : 0;
    const end = r ? r.end : s.size - 1;
    const headers: Record<string, string | number> = {
      'content-length': s.size === 0 ? 0 : end - start + 1,
      'accept-ranges': 'bytes',
      'content-type': file.endsWith('.json') ? 'application/json' : 'application/octet-stream',
    };
    if (r) headers['content-range'] = `bytes ${start}-${end}/${s.size}`;
    res.writeHead(r ? 206 : 200, headers);
    if (req.method === 'HEAD' || s.size === 0) {
      res.end();
      return;
    }
    this.stats.bytesServed += end - start + 1;
    await pipeline(createReadStream(file, { start, end }), res);
  }
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const b = Buffer.from(JSON.stringify(body));
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': b.length });
  res.end(b);
}

async function readBody(req: IncomingMessage, max: number): Promise<Buffer> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const c of req) {
    n += (c as Buffer).length;
    if (n > max) throw new ProtocolError('INVALID_REQUEST', `body larger than ${max} bytes`);
    parts.push(c as Buffer);
  }
  return Buffer.concat(parts);
}
