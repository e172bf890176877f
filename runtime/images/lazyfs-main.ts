/**
 * The layer daemon, a child of the node process: it owns the node's layer cache and serves the
 * layers being loaded lazily as files of a FUSE mount, `<mountpoint>/<hex>.erofs`, whose bytes
 * are fetched from the store when the kernel first reads them.
 *
 * It is a process of its own because FUSE reads must never wait on the process that answers them:
 * the node reads sandbox files (through overlay and EROFS) on its own thread pool, and those reads
 * end up here. The node talks to it over the fork IPC channel (`LayerDaemonRequest`); when the
 * node goes away the channel closes and the daemon unmounts and exits.
 */
import { spawn } from 'node:child_process';
import { mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { LayerLoadMode } from '../../protocol/index.ts';
import { CacheFullError, type CacheLayerRef, LayerCache, STORE_URL_FILE } from './cache.ts';
import { mounts } from '../cgroups.ts';
import { FuseServer } from './fuse.ts';

export interface LayerDaemonConfig {
  mountpoint: string;
  cacheDir: string;
  budgetBytes: number;
  storeUrl: string;
  timeoutMs: number;
  attempts: number;
  /** The kernel's read-ahead on the lazy files, bytes (undefined: its own default). */
  readaheadBytes?: number;
  /** The node's directory: what the node mounted under it is detached when the node dies. */
  nodeDir: string;
}

export type LayerDaemonRequest =
  | { id: number; op: 'acquire'; ref: CacheLayerRef; mode: LayerLoadMode }
  | { id: number; op: 'release'; digest: string }
  | { id: number; op: 'drop'; digest: string }
  | { id: number; op: 'stats' }
  /** The node is stopping: the disconnect that follows ends the daemon at once. */
  | { id: number; op: 'close' };

export type LayerDaemonMessage =
  | { id: number; ok: true; result: unknown }
  | { id: number; ok: false; error: string; full?: boolean }
  | { event: 'ready' }
  | { event: 'pressure' }
  | { event: 'fetch-error'; digest: string; message: string }
  | { event: 'fatal'; message: string };

function send(m: LayerDaemonMessage): void {
  // Once the node is gone there is no one to tell, and a send then throws (an unhandled 'error').
  if (process.connected) process.send?.(m);
}

/** Orphaned, a read the store did not answer is tried again this often, this many times: the next node may be starting. */
const ORPHAN_RETRY_MS = 1000;
const ORPHAN_RETRIES = 30;

/** Mount points under `dir` in this process's mount namespace (the node's, which it shares), deepest first. */
function mountsUnder(dir: string): string[] {
  const under = mounts()
    .map((m) => m.target)
    .filter((t) => t === dir || t.startsWith(`${dir}/`));
  return [...new Set(under)].sort((a, b) => b.length - a.length);
}

async function umount(target: string): Promise<void> {
  await new Promise<void>((resolve) => {
    const c = spawn('umount', ['-l', target], { stdio: 'ignore' });
    c.on('close', () => resolve());
    c.on('error', () => resolve());
  });
}

async function main(): Promise<void> {
  const cfg = JSON.parse(process.argv[2] ?? '{}') as LayerDaemonConfig;
  let lastPressure = 0;
  const cache = new LayerCache({
    dir: cfg.cacheDir,
    budgetBytes: cfg.budgetBytes,
    storeUrl: cfg.storeUrl,
    timeoutMs: cfg.timeoutMs,
    attempts: cfg.attempts,
    onPressure: () => {
      // The node answers by unmounting idle layers; once a second is plenty.
      if (Date.now() - lastPressure < 1000) return;
      lastPressure = Date.now();
      send({ event: 'pressure' });
    },
    onFetchError: (digest, message) => send({ event: 'fetch-error', digest, message }),
  });
  await cache.init();
  await mkdir(cfg.mountpoint, { recursive: true });
  await umount(cfg.mountpoint);
  let orphaned = false;
  const fs = new FuseServer(
    cfg.mountpoint,
    {
      read: async (name, offset, length) => {
        for (let i = 0; ; i++) {
          try {
            return await cache.read(name.replace(/\.erofs$/, ''), offset, length);
          } catch (err) {
            // The node that served the embedded store died with it: the next one serves it at the
            // address it writes down. Until then the reader waits rather than get EIO.
            if (!orphaned || i >= ORPHAN_RETRIES) throw err;
            await new Promise((r) => setTimeout(r, ORPHAN_RETRY_MS));
            const url = (await readFile(join(cfg.nodeDir, STORE_URL_FILE), 'utf8').catch(() => '')).trim();
            if (url) cache.setStoreUrl(url);
          }
        }
      },
      // Orphaned, the last user of the mount let go: nothing is left to serve.
      onEnd: () => {
        if (orphaned) void shutdown();
      },
    },
    4,
    cfg.readaheadBytes,
  );
  await fs.mount();

  let closing = false;
  let closeAsked = false;
  const shutdown = async () => {
    if (closing) return;
    closing = true;
    await cache.close().catch(() => {});
    await umount(cfg.mountpoint);
    fs.close();
    // Not process.exit: at exit libuv joins its thread pool, and a reader blocked on /dev/fuse
    // never returns while a lazily unmounted layer is still open somewhere (a VMM, a container
    // of a node that died). The daemon then hung for good, and every read of its files with it.
    process.kill(process.pid, 'SIGKILL');
  };
  // The node asks (close) before it lets go. A channel that closes without that is a node that
  // died: what it started (VMMs, containers) runs on and reads layers through this filesystem
  // until the node's next start takes it up or removes it. So the daemon detaches every mount the
  // node made in its namespace (the layers, lxcfs, this one): then only those sandboxes and VMMs
  // hold this filesystem, and the kernel ends the connection (ENODEV) when the last of them is
  // gone. Stopping at once failed their reads (a VMM's pending read also held up the QMP `stop`
  // that saving it needs); stopping after a quiet spell failed a container's first read after it.
  process.on('disconnect', () => {
    if (closeAsked) return void shutdown();
    orphaned = true;
    void (async () => {
      for (const m of mountsUnder(cfg.nodeDir)) await umount(m);
      if (fs.ended) void shutdown();
    })();
  });
  process.on('SIGTERM', () => void shutdown());

  process.on('message', (msg: LayerDaemonRequest) => {
    const handle = async (): Promise<unknown> => {
      switch (msg.op) {
        case 'close':
          closeAsked = true;
          return null;
        case 'acquire': {
          const r = await cache.acquire(msg.ref, msg.mode);
          if (!r.local) fs.add({ name: `${r.hex}.erofs`, size: r.size });
          return { path: r.local ? cache.localPath(r.hex) : `${cfg.mountpoint}/${r.hex}.erofs`, local: r.local };
        }
        case 'release':
          cache.release(msg.digest);
          return null;
        case 'drop':
          return cache.drop(msg.digest);
        case 'stats':
          return cache.stats();
      }
    };
    handle().then(
      (result) => send({ id: msg.id, ok: true, result }),
      (err: unknown) => send({ id: msg.id, ok: false, error: (err as Error).message, full: err instanceof CacheFullError }),
    );
  });
  send({ event: 'ready' });
}

main().catch((err: unknown) => {
  send({ event: 'fatal', message: (err as Error).message });
  process.exit(1);
});
