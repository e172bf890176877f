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
import { mkdir } from 'node:fs/promises';
import type { LayerLoadMode } from '../../protocol/index.ts';
import { CacheFullError, type CacheLayerRef, LayerCache } from './cache.ts';
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
  process.send?.(m);
}

/** After the node died: how long without a read before the daemon stops, and how long at most. */
const ORPHAN_IDLE_MS = 30_000;
const ORPHAN_MAX_MS = 600_000;

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
  let lastRead = Date.now();
  const fs = new FuseServer(cfg.mountpoint, {
    read: (name, offset, length) => {
      lastRead = Date.now();
      return cache.read(name.replace(/\.erofs$/, ''), offset, length);
    },
  }, 4, cfg.readaheadBytes);
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
  // died: what it started (VMMs, containers) still reads layers through this filesystem until
  // the node's next start saves or removes them. Those reads are served until none has come for
  // ORPHAN_IDLE_MS (ORPHAN_MAX_MS at most); stopping at once failed them (a VMM's pending read
  // also held up the QMP `stop` that saving it needs).
  process.on('disconnect', () => {
    if (closeAsked) return void shutdown();
    const since = Date.now();
    const t = setInterval(() => {
      const now = Date.now();
      if (now - lastRead >= ORPHAN_IDLE_MS || now - since >= ORPHAN_MAX_MS) {
        clearInterval(t);
        void shutdown();
      }
    }, 1000);
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
