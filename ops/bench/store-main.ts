/**
 * The image benchmark's layer store, run as a process of its own inside the store's network
 * namespace (link.ts): the embedded store server (server.ts) over a store directory, and beside it
 * a plain file server for what is shipped outside the store's layout (the tar.gz of part b).
 *
 *   store-main.ts <store dir> <files dir> <host>
 *
 * Prints one JSON line, {"store": url, "files": url}, once both listen; `<files>/stats` answers
 * {"requests", "bytesServed"} summed over both. Exits when its parent goes (stdin closes).
 */
import { createReadStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { basename, join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { StoreServer } from '../../runtime/images/server.ts';
import { ImageStore } from '../../runtime/images/store.ts';

async function main(): Promise<void> {
  const [dir, filesDir, host] = process.argv.slice(2) as [string, string, string];
  const store = new StoreServer(new ImageStore(dir));
  const storeUrl = await store.listen(host, 0);
  const files = { requests: 0, bytesServed: 0 };
  const server = createServer((req, res) => {
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    if (path === '/stats') {
      const b = JSON.stringify({ requests: store.stats.requests + files.requests, bytesServed: store.stats.bytesServed + files.bytesServed });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(b) });
      res.end(b);
      return;
    }
    files.requests++;
    const file = join(filesDir, basename(path));
    void stat(file).then(
      async (s) => {
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': s.size });
        files.bytesServed += s.size;
        await pipeline(createReadStream(file), res).catch(() => res.destroy());
      },
      () => {
        res.writeHead(404);
        res.end();
      },
    );
  });
  await new Promise<void>((resolve) => server.listen(0, host, () => resolve()));
  const a = server.address() as AddressInfo;
  process.stdout.write(`${JSON.stringify({ store: storeUrl, files: `http://${a.address}:${a.port}` })}\n`);
  process.stdin.resume();
  process.stdin.on('close', () => process.exit(0));
}

main().catch((err: unknown) => {
  process.stderr.write(`bench store: ${(err as Error).stack ?? err}\n`);
  process.exit(1);
});
