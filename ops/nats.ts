/**
 * The embedded nats-server: started with JetStream on a free loopback port when no NATS_URL is
 * given (npm start, tests, benchmarks). Debian's nats-server; the port comes from --ports_file_dir.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { statfsSync } from 'node:fs';
import { mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import { type AddressInfo, createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { jetstreamManager } from '@nats-io/jetstream';
import { connect } from '@nats-io/transport-node';
import { rotatingLog } from './logfile.ts';

export interface EmbeddedNats {
  url: string;
  port: number;
  /** The monitoring endpoint (`/varz`, `/jsz`, …) when started with `httpPort`. */
  monitorUrl?: string;
  proc: ChildProcess;
  stop(): Promise<void>;
}

/** Below this much free space on its disk, an unanswered JetStream call is taken for a full store. */
const STORE_FULL_BYTES = 1024 * 1024;

/**
 * What the node hands natsFailure (setStoreProbe) when its nats-server is the embedded one: why
 * the store at `dir` is full (its free space), or nothing. A statfs costs microseconds and runs
 * only when a JetStream call has already failed.
 */
export function storeFullProbe(dir: string): () => string | undefined {
  return () => {
    try {
      const s = statfsSync(dir);
      const free = s.bavail * s.bsize;
      return free < STORE_FULL_BYTES ? `${dir} has ${Math.floor(free / 1024)} KiB free of ${Math.round((s.blocks * s.bsize) / 1024 / 1024)} MiB` : undefined;
    } catch {
      return undefined;
    }
  };
}

/** The store directory of an embedded nats-server whose data is in `dataDir` (its -sd). */
export const natsStoreDir = (dataDir: string) => join(dataDir, 'jetstream');

/** Exec results carry up to 1 MiB of stdout and of stderr in one reply: allow 8 MiB messages. */
export const MAX_PAYLOAD = 8 * 1024 * 1024;

export interface StartNatsOptions {
  dataDir: string;
  port?: number;
  /** nats-server's own log (rotated); without it only the last 4 KB are kept, for errors. */
  logFile?: string;
  /** Serve nats-server's monitoring endpoints on this loopback port (benchmarks read /varz and /jsz). */
  httpPort?: number;
  /** Membership of a cluster (startNatsCluster): this server's name, the cluster's, its route port and its peers' routes. */
  cluster?: { serverName: string; name: string; port: number; routes: string[] };
}

/**
 * Go returns freed heap to the kernel with MADV_DONTNEED by default, and nats-server, relaying a
 * stream, touched those pages again at once: 107–158 page faults per MiB relayed, at ~13 µs each
 * on this kind of VM. With madvdontneed=0 Go uses MADV_FREE, and the kernel takes such pages only
 * under memory pressure: 2–17 faults per MiB, and nats-server's CPU per MiB 6.8–7.6 → 5.2–5.9 ms.
 * A GODEBUG that already says madvdontneed wins.
 */
export function natsEnv(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const g = env.GODEBUG;
  if (g?.includes('madvdontneed')) return env;
  return { ...env, GODEBUG: g ? `${g},madvdontneed=0` : 'madvdontneed=0' };
}

export async function startNats(opts: StartNatsOptions): Promise<EmbeddedNats> {
  await mkdir(opts.dataDir, { recursive: true });
  const portsDir = join(opts.dataDir, 'ports');
  await mkdir(portsDir, { recursive: true });
  const conf = join(opts.dataDir, 'nats.conf');
  const c = opts.cluster;
  // JetStream in a cluster needs a stable server name (its Raft identity, kept in the data
  // directory) and routes to every peer; a peer not up yet is retried by nats-server itself.
  const clusterConf = c
    ? `server_name: ${JSON.stringify(c.serverName)}\ncluster {\n  name: ${JSON.stringify(c.name)}\n  listen: "127.0.0.1:${c.port}"\n  routes: [${c.routes.map((r) => JSON.stringify(r)).join(', ')}]\n}\n`
    : '';
  await writeFile(conf, `max_payload: ${MAX_PAYLOAD}\nmax_pending: ${4 * MAX_PAYLOAD}\n${clusterConf}`);
  // Dies with whoever started it, even by SIGKILL (a killed test worker or `paddock up`): an
  // embedded nats-server has no one else to serve.
  // detached: a terminal's Ctrl-C goes to its whole process group; nats-server must outlive it
  // until the node has recorded its sandboxes' end, so only its starter stops it.
  const proc = spawn('setpriv', ['--pdeathsig', 'TERM', '--', 'nats-server', '-c', conf, '-a', '127.0.0.1', '-p', String(opts.port ?? -1), '-js', '-sd', natsStoreDir(opts.dataDir), '--ports_file_dir', portsDir, ...(opts.httpPort ? ['-m', String(opts.httpPort)] : [])], {
    stdio: ['ignore', 'ignore', 'pipe'],
    detached: true,
    env: natsEnv(process.env),
  });
  const log = opts.logFile ? rotatingLog(opts.logFile) : undefined;
  let stderr = '';
  proc.stderr?.on('data', (d: Buffer) => {
    log?.write(d);
    stderr = (stderr + d.toString()).slice(-4000);
  });
  proc.once('exit', () => log?.end());
  const exited = new Promise<number>((r) => proc.on('exit', (c) => r(c ?? 1)));
  // Seconds, not milliseconds, on a loaded machine: JetStream reads its store before it listens.
  const deadline = Date.now() + 30_000;
  try {
    for (;;) {
      if (proc.exitCode !== null) throw new Error(`nats-server exited: ${stderr.trim()}`);
      const file = (await readdir(portsDir).catch(() => [] as string[])).find((f) => f.includes(`_${proc.pid}.ports`));
      if (file) {
        // Read while nats-server may still be writing it: a half-written file is tried again. (It
        // once threw out of here and left the server running, holding a test worker open.)
        let ports: { nats?: string[] } = {};
        try {
          ports = JSON.parse(await readFile(join(portsDir, file), 'utf8'));
        } catch {}
        const url = ports.nats?.[0];
        if (url) {
          const port = Number(new URL(url).port);
          return {
            url: `nats://127.0.0.1:${port}`,
            port,
            ...(opts.httpPort ? { monitorUrl: `http://127.0.0.1:${opts.httpPort}` } : {}),
            proc,
            // Resolves once the process is gone (its port free for a restart on the same one).
            stop: async () => {
              if (proc.exitCode === null && proc.signalCode === null) {
                proc.kill('SIGTERM');
                await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
                if (proc.exitCode === null && proc.signalCode === null) {
                  proc.kill('SIGKILL');
                  await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
                }
              }
            },
          };
        }
      }
      if (Date.now() > deadline) {
        proc.kill('SIGKILL');
        throw new Error(`nats-server did not start: ${stderr.trim()}`);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
  } catch (e) {
    // Whatever went wrong while waiting, the server must not outlive the start that failed.
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
    throw e;
  }
}

export interface NatsCluster {
  /** Every server's client URL, comma-joined: what NATS_URL takes. */
  url: string;
  urls: string[];
  servers: EmbeddedNats[];
  /** SIGKILL server `i` (a crash: no lame-duck, no flush). */
  kill(i: number): Promise<void>;
  /** Starts server `i` again on its ports and data directory; resolves once it serves clients. */
  restart(i: number): Promise<EmbeddedNats>;
  stop(): Promise<void>;
}

/** Free loopback TCP ports, chosen by the kernel: routes must name their peers' ports up front. */
export async function freePorts(n: number): Promise<number[]> {
  const servers = await Promise.all(
    Array.from(
      { length: n },
      () =>
        new Promise<Server>((resolve, reject) => {
          const s = createServer();
          s.once('error', reject);
          s.listen(0, '127.0.0.1', () => resolve(s));
        }),
    ),
  );
  const ports = servers.map((s) => (s.address() as AddressInfo).port);
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
  return ports;
}

/**
 * `n` nats-servers with JetStream, routed to each other on loopback: each its own data directory
 * (`<dataDir>/s<i>`), client and route ports fixed at the start so that a server killed and
 * restarted comes back where its clients and peers look for it. Resolves once JetStream's meta
 * group has a leader (a bucket created before that fails with "JetStream cluster not available").
 */
export async function startNatsCluster(opts: { dataDir: string; servers: number; name?: string; logDir?: string; ports?: number[]; monitor?: boolean }): Promise<NatsCluster> {
  const n = opts.servers;
  if (!Number.isInteger(n) || n < 1 || n > 9) throw new Error(`a cluster has 1 to 9 servers, not ${n}`);
  const ports = opts.ports ?? (await freePorts(2 * n));
  // Monitoring ports after the client and route ones, so a caller's `ports` keep their meaning.
  const monitorPorts = opts.monitor ? await freePorts(n) : [];
  const name = opts.name ?? 'paddock';
  const routePort = (i: number) => ports[n + i] as number;
  const optsOf = (i: number): StartNatsOptions => ({
    dataDir: join(opts.dataDir, `s${i}`),
    port: ports[i] as number,
    ...(opts.monitor ? { httpPort: monitorPorts[i] as number } : {}),
    ...(opts.logDir ? { logFile: join(opts.logDir, `nats-s${i}.log`) } : {}),
    cluster: {
      serverName: `${name}-s${i}`,
      name,
      port: routePort(i),
      routes: Array.from({ length: n }, (_, k) => k)
        .filter((k) => k !== i)
        .map((k) => `nats://127.0.0.1:${routePort(k)}`),
    },
  });
  const servers: EmbeddedNats[] = [];
  try {
    for (let i = 0; i < n; i++) servers.push(await startNats(optsOf(i)));
    await jetStreamReady(servers.map((s) => s.url));
  } catch (e) {
    await Promise.all(servers.map((s) => s.stop()));
    throw e;
  }
  const urls = servers.map((s) => s.url);
  return {
    url: urls.join(','),
    urls,
    servers,
    kill: async (i) => {
      const s = servers[i];
      if (!s || s.proc.exitCode !== null || s.proc.signalCode !== null) return;
      const gone = new Promise((r) => s.proc.once('exit', r));
      s.proc.kill('SIGKILL');
      await gone;
    },
    restart: async (i) => {
      await servers[i]?.stop();
      const s = await startNats(optsOf(i));
      servers[i] = s;
      return s;
    },
    stop: async () => {
      await Promise.all(servers.map((s) => s.stop()));
    },
  };
}

/** Waits until JetStream answers through `urls` (the cluster has elected its meta leader). */
async function jetStreamReady(urls: string[], timeoutMs = 60_000): Promise<void> {
  const nc = await connect({ servers: urls, maxReconnectAttempts: -1, reconnectTimeWait: 200 });
  const deadline = Date.now() + timeoutMs;
  try {
    for (;;) {
      try {
        await (await jetstreamManager(nc, { timeout: 2000 })).getAccountInfo();
        return;
      } catch (err) {
        if (Date.now() > deadline) throw new Error(`the NATS cluster's JetStream did not become ready in ${timeoutMs} ms: ${(err as Error).message}`);
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  } finally {
    await nc.close().catch(() => {});
  }
}
