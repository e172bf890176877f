/**
 * A Paddock on this host: an embedded nats-server and node processes, each node in its own
 * mount namespace (see launch.ts). Used by `paddock up`, the tests and the benchmarks.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { Writable } from 'node:stream';
import { logsDir } from '../protocol/discovery.ts';
import { nodeCommand } from './launch.ts';
import { rotatingLog } from './logfile.ts';
import { type EmbeddedNats, natsStoreDir, startNats } from './nats.ts';

export interface NodeProcess {
  id: string;
  proc: ChildProcess;
  /** Where the node's JSON log goes (unless `inheritLogs`): `$home/logs/node-<id>.log`, rotated. */
  logFile?: string;
  /** SIGTERM, wait for a clean exit (sandboxes killed); SIGKILL after `graceMs`. */
  stop(graceMs?: number): Promise<void>;
  exited: Promise<number>;
}

export interface StartNodeOptions {
  natsUrl: string;
  home: string;
  id: string;
  imagesDir?: string;
  env?: Record<string, string>;
  /** Write the node's log to the terminal instead of a file. */
  inheritLogs?: boolean;
  readyTimeoutMs?: number;
  /** Each line the node logs after it is ready (the supervisor shows some of them). */
  onLine?: (line: string) => void;
}

export async function startNode(o: StartNodeOptions): Promise<NodeProcess> {
  await mkdir(o.home, { recursive: true });
  const { cmd, args, env } = nodeCommand();
  // detached: a Ctrl-C in the terminal must not reach crun or mount halfway through a destroy;
  // stop() sends the node SIGTERM and it winds down in order.
  const proc = spawn(cmd, args, {
    detached: true,
    stdio: ['ignore', 'pipe', o.inheritLogs ? 'inherit' : 'pipe'],
    env: {
      ...process.env,
      ...env,
      NATS_URL: o.natsUrl,
      PADDOCK_HOME: o.home,
      PADDOCK_NODE_ID: o.id,
      ...(o.imagesDir ? { PADDOCK_IMAGES_DIR: o.imagesDir } : {}),
      ...o.env,
    },
  });
  let log: Writable | undefined;
  const logFile = o.inheritLogs ? undefined : join(logsDir(o.home), `node-${o.id}.log`);
  if (logFile) {
    log = rotatingLog(logFile);
    proc.stderr?.pipe(log, { end: false });
  }
  const exited = new Promise<number>((r) => proc.on('exit', (c, s) => r(c ?? (s ? 128 : 1))));
  // What the node started and that outlives a node killed with SIGKILL, by design (its layer
  // server, lxcfs: its sandboxes run on for the next node to take up), holds the write ends of
  // these pipes: read on, they kept the caller (a test worker, `paddock up`) alive with nothing
  // left to wait for. What the node itself wrote has arrived by the time they go.
  void exited.then(() =>
    setTimeout(() => {
      proc.stdout?.destroy();
      proc.stderr?.destroy();
    }, 2000).unref(),
  );
  let tail = '';
  const readiness = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`node ${o.id} not ready after ${o.readyTimeoutMs ?? 120_000} ms: ${tail.slice(-2000)}`)), o.readyTimeoutMs ?? 120_000);
    let ready = false;
    let partial = '';
    proc.stdout?.on('data', (d: Buffer) => {
      if (log) log.write(d);
      else process.stdout.write(d);
      if (ready && o.onLine) {
        const lines = (partial + d.toString()).split('\n');
        partial = lines.pop() ?? '';
        for (const l of lines) o.onLine(l);
      }
      if (!ready) {
        tail = (tail + d.toString()).slice(-8000);
        if (tail.includes('"msg":"node ready"')) {
          ready = true;
          clearTimeout(timer);
          resolve();
        }
      }
    });
    void exited.then((c) => {
      if (!ready) {
        clearTimeout(timer);
        reject(new Error(`node ${o.id} exited with ${c} before it was ready: ${tail.slice(-2000)}`));
      }
    });
  });
  try {
    await readiness;
  } catch (e) {
    // A node that never got ready must not outlive the caller: its pipes would keep a test
    // worker (or `paddock up`) alive with nothing left to wait for.
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGTERM');
      const hard = setTimeout(() => proc.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(hard);
    }
    log?.end();
    throw e;
  }
  return {
    id: o.id,
    proc,
    logFile,
    exited,
    stop: async (graceMs = 30_000) => {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), graceMs);
      await exited;
      clearTimeout(t);
      log?.end();
    },
  };
}

export interface LocalCluster {
  nats: EmbeddedNats;
  url: string;
  nodes: NodeProcess[];
  /** Stops nats-server (if it still runs) and starts it again on the same port with the same store. */
  restartNats(): Promise<EmbeddedNats>;
  stop(): Promise<void>;
}

/** nats-server + `nodes` node processes under `home` (node ids `<prefix>1`, `<prefix>2`, …). */
export async function startLocalCluster(o: { home: string; nodes?: number; prefix?: string; imagesDir?: string; env?: Record<string, string>; inheritLogs?: boolean }): Promise<LocalCluster> {
  const natsOpts = { dataDir: join(o.home, 'nats'), logFile: join(logsDir(o.home), 'nats-server.log') };
  const nats = await startNats(natsOpts);
  const nodes: NodeProcess[] = [];
  try {
    const n = o.nodes ?? 1;
    // One at a time: the first builds the shared busybox layer, the rest find it.
    for (let i = 1; i <= n; i++) {
      // Tests and benchmarks make the FnCall images they need themselves, once, in a shared store.
      const env = { PADDOCK_FN_BUILD: process.env.PADDOCK_FN_BUILD ?? '0', PADDOCK_NATS_STORE: natsStoreDir(natsOpts.dataDir), ...o.env };
      nodes.push(await startNode({ natsUrl: nats.url, home: o.home, id: `${o.prefix ?? 'node'}${i}`, imagesDir: o.imagesDir, env, inheritLogs: o.inheritLogs }));
    }
  } catch (e) {
    await Promise.all(nodes.map((x) => x.stop()));
    await nats.stop();
    throw e;
  }
  const cluster: LocalCluster = {
    nats,
    url: nats.url,
    nodes,
    restartNats: async () => {
      await cluster.nats.stop();
      // The old listener may linger for a moment after its process is gone.
      for (let attempt = 0; ; attempt++) {
        try {
          cluster.nats = await startNats({ ...natsOpts, port: nats.port });
          return cluster.nats;
        } catch (e) {
          if (attempt >= 20) throw e;
          await new Promise((r) => setTimeout(r, 250));
        }
      }
    },
    stop: async () => {
      await Promise.all(nodes.map((x) => x.stop()));
      await cluster.nats.stop();
    },
  };
  return cluster;
}
