/**
 * `paddock up` (and `npm start`): the process supervisor of a one-host Paddock. It starts an
 * embedded nats-server (or joins $NATS_URL) and one node, writes down where they are
 * ($PADDOCK_HOME/nats.url for clients, $PADDOCK_HOME/paddock.pid for `paddock down`), and on
 * SIGINT, SIGTERM or SIGHUP stops the node (which kills its sandboxes) and then nats-server.
 *
 * A child that dies on its own is restarted, not mourned: a nats-server on the same port with the
 * same JetStream store (the node keeps its sandboxes through the outage and reconnects), a node
 * with the same id and home (its start recovers what its predecessor left). Only a signal to this
 * process stops the rest; a child that keeps dying at once (RESTART_LIMIT within RESTART_WINDOW_MS)
 * is given up on.
 *
 * Both children run in process groups of their own: a terminal's Ctrl-C reaches only this process
 * (and whatever ran it, such as npm), so nats-server does not die before the node has recorded its
 * sandboxes' end through it. Both also die with this process, however it dies (pdeathsig).
 */
import { readFileSync } from 'node:fs';
import { mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { createConnection } from 'node:net';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { DEFAULT_HOME, logsDir, natsUrlFile, upPidFile } from '../protocol/discovery.ts';
import { sanitizeId } from '../runtime/config.ts';
import { ROOT } from '../runtime/source.ts';
import { type RunningBridge, startBridge } from './bridge-main.ts';
import { type RunningGateway, startUpGateway } from './gateway/index.ts';
import { type NodeProcess, startNode } from './local.ts';
import { type EmbeddedNats, natsStoreDir, startNats, storeFullProbe } from './nats.ts';

/** What $PADDOCK_HOME/paddock.pid says about the `paddock up` serving that home. */
export interface UpRecord {
  pid: number;
  home: string;
  nats: string;
  /** nats-server's pid when `up` started it (not when it joined one). */
  natsPid?: number;
  node: string;
  nodePid?: number;
  /** The HTTP gateway's host:port, when this `up` runs one (PADDOCK_HTTP=0 turns it off). */
  http?: string;
  logs: string;
  startedAt: number;
}

/** The live `paddock up` of `home`, if any (a pid file whose process is gone is stale). */
export function readUpRecord(home: string): UpRecord | undefined {
  let r: UpRecord;
  try {
    r = JSON.parse(readFileSync(upPidFile(home), 'utf8')) as UpRecord;
  } catch {
    return undefined;
  }
  return typeof r.pid === 'number' && alive(r.pid) ? r : undefined;
}

export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Whether something accepts connections at a nats:// URL: tells a live Paddock from a stale URL file. */
export function reachable(url: string, timeoutMs = 1000): Promise<boolean> {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return Promise.resolve(false);
  }
  return new Promise((resolve) => {
    const sock = createConnection({ host: u.hostname, port: Number(u.port || 4222) });
    const done = (ok: boolean) => {
      sock.destroy();
      resolve(ok);
    };
    sock.setTimeout(timeoutMs, () => done(false));
    sock.once('connect', () => done(true));
    sock.once('error', () => done(false));
  });
}

/** Write then rename: a reader never sees half a file. */
async function writeAtomic(file: string, text: string): Promise<void> {
  await writeFile(`${file}.tmp`, text);
  await rename(`${file}.tmp`, file);
}

/** Removes `file` if it still says `text` (a later `up` of the same home may have replaced it). */
async function removeIfOurs(file: string, test: (s: string) => boolean): Promise<void> {
  const now = await readFile(file, 'utf8').catch(() => '');
  if (now && test(now)) await rm(file, { force: true });
}

export class UpError extends Error {}

/** Restarts of one child allowed within RESTART_WINDOW_MS before `up` gives up and stops. */
/** How often `up` looks at its nats-server's store disk (a statfs; JetStream is asked only after the disk was full). */
const STORE_WATCH_MS = 2000;
/** How long a nats-server restarted after a full disk gets to stop by itself. */
const NATS_STOP_GRACE_MS = 5000;
const RESTART_LIMIT = 5;
const RESTART_WINDOW_MS = 60_000;

/** Whether another restart is allowed, given the times of the previous ones (pruned in place). */
function mayRestart(times: number[]): boolean {
  const now = Date.now();
  while (times.length > 0 && now - (times[0] as number) > RESTART_WINDOW_MS) times.shift();
  if (times.length >= RESTART_LIMIT) return false;
  times.push(now);
  return true;
}

/**
 * Runs until a signal (or the death of a child) ends it; resolves to the exit status. `say` gets
 * what a person at the terminal reads; `show` the banner.
 */
export async function up(o: { nats?: string; say: (s: string) => void; show: (s: string) => void }): Promise<number> {
  const home = process.env.PADDOCK_HOME || DEFAULT_HOME;
  const urlFile = natsUrlFile(home);
  const pidFile = upPidFile(home);
  const logs = logsDir(home);
  const joinUrl = o.nats ?? process.env.NATS_URL;
  const nodeId = sanitizeId(process.env.PADDOCK_NODE_ID || hostname());

  const running = readUpRecord(home);
  if (running) throw new UpError(`Paddock is already up for ${home} (pid ${running.pid}, NATS ${running.nats}); 'paddock down' stops it`);

  let nats: EmbeddedNats | undefined;
  /** The embedded nats-server's store (the node checks its disk when JetStream stops answering). */
  let natsStore: string | undefined;
  let storeWatch: NodeJS.Timeout | undefined;
  let node: NodeProcess | undefined;
  let gateway: RunningGateway | undefined;
  let starting: Promise<NodeProcess> | undefined;
  let bridge: RunningBridge | undefined;
  let wroteUrl: string | undefined;
  let wrotePid = false;
  let stopping = false;
  let finish: (code: number) => void = () => {};
  const finished = new Promise<number>((r) => {
    finish = r;
  });

  const teardown = async () => {
    clearInterval(storeWatch);
    // startNode hands out no process until the node is ready: wait for it, then stop it, so a
    // stop during the first start (busybox layer build) leaves no node behind.
    if (!node && starting !== undefined) node = await starting.catch(() => undefined);
    await gateway?.close().catch(() => {});
    await bridge?.stop({ release: true });
    await node?.stop();
    await nats?.stop();
    if (wroteUrl !== undefined) await removeIfOurs(urlFile, (s) => s.trim() === wroteUrl);
    if (wrotePid) await removeIfOurs(pidFile, (s) => s.includes(`"pid":${process.pid},`));
  };
  const shutdown = (why: string, code: number) => {
    if (stopping) return;
    stopping = true;
    o.say(`${why}: stopping (the node kills its sandboxes)…`);
    teardown().then(
      () => {
        o.say('stopped');
        finish(code);
      },
      (err: unknown) => {
        o.say(`stop failed: ${(err as Error).message}`);
        finish(1);
      },
    );
  };
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => shutdown(sig, 0));

  const startedAt = Date.now();
  let natsUrl: string | undefined;
  // One writer for the record: whatever started or restarted (NATS, the node), it says what runs
  // now, the gateway included.
  const writeRecord = () => {
    const r: UpRecord = { pid: process.pid, home, nats: natsUrl ?? joinUrl ?? '', node: nodeId, logs, startedAt };
    if (nats?.proc.pid) r.natsPid = nats.proc.pid;
    if (node?.proc.pid) r.nodePid = node.proc.pid;
    if (gateway) r.http = gateway.address;
    return writeAtomic(pidFile, `${JSON.stringify(r)}\n`);
  };
  try {
    await mkdir(home, { recursive: true });
    // Written first, so that `paddock down` can stop a start that is still under way.
    await writeRecord();
    wrotePid = true;
    if (joinUrl) {
      natsUrl = joinUrl;
      o.say(`joining NATS at ${natsUrl}`);
    } else {
      const previous = (await readFile(urlFile, 'utf8').catch(() => '')).trim();
      if (previous && (await reachable(previous))) {
        throw new UpError(`a NATS is already serving at ${previous} (${urlFile}); stop it first, or set PADDOCK_HOME or NATS_URL`);
      }
      o.say(`starting nats-server (data in ${join(home, 'nats')}, log in ${join(logs, 'nats-server.log')})`);
      const natsOpts = { dataDir: join(home, 'nats'), logFile: join(logs, 'nats-server.log') };
      nats = await startNats(natsOpts);
      natsUrl = nats.url;
      natsStore = natsStoreDir(natsOpts.dataDir);
      const natsRestarts: number[] = [];
      // Same port and store: clients and the node reconnect to the URL they know and find the
      // buckets and the command log as they were. The sandboxes never notice.
      const watchNats = (n: EmbeddedNats) =>
        n.proc.once('exit', (c, s) => {
          if (stopping) return;
          const why = `nats-server exited (${s ?? c}); see ${natsOpts.logFile}`;
          if (!mayRestart(natsRestarts)) return shutdown(`${why}, ${RESTART_LIMIT} times within ${RESTART_WINDOW_MS / 1000} s`, 1);
          o.say(`${why}: restarting it on port ${n.port} (the sandboxes keep running)`);
          void restartNats(n.port);
        });
      const restartNats = async (port: number) => {
        for (let attempt = 0; !stopping; attempt++) {
          try {
            const next = await startNats({ ...natsOpts, port });
            if (stopping) return void (await next.stop());
            nats = next;
            watchNats(next);
            await writeRecord();
            o.say(`nats-server is back at ${next.url}`);
            return;
          } catch (err) {
            // The old process may still hold the port for a moment.
            if (attempt >= 20 || !mayRestart(natsRestarts)) return shutdown(`nats-server could not be restarted: ${(err as Error).message}`, 1);
            await new Promise((r) => setTimeout(r, 250));
          }
        }
      };
      watchNats(nats);
      // nats-server 2.9 whose store filled its disk answers no JetStream call again, even once
      // space is freed, until it is restarted (test/full-disk.test.ts); and asking JetStream does
      // not tell (account info still answers while a stream's writes are stuck). So once its disk,
      // seen full, has room again, nats-server is restarted, once (the watch above does it: same
      // port, same store): a second of control-plane outage, which nodes and clients ride out.
      const storeDir = natsStore as string;
      let sawFull = false;
      storeWatch = setInterval(() => {
        if (stopping || !nats) return;
        if (storeFullProbe(storeDir)()) {
          sawFull = true;
          return;
        }
        if (!sawFull || !nats.proc.pid) return;
        sawFull = false;
        o.say(`nats-server's store had filled its disk (${storeDir}), which has room again: restarting nats-server, whose JetStream stops writing after a full disk (the sandboxes keep running)`);
        // A nats-server stuck so does not finish a SIGTERM's shutdown (seen: still up a minute
        // later): SIGKILL after a few seconds. JetStream reads its store back after a crash.
        const proc = nats.proc;
        proc.kill('SIGTERM');
        setTimeout(() => {
          if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
        }, NATS_STOP_GRACE_MS).unref();
      }, STORE_WATCH_MS);
      storeWatch.unref();
      await writeAtomic(urlFile, `${natsUrl}\n`);
      wroteUrl = natsUrl;
    }
    if (stopping) return await finished;
    await writeRecord();
    o.say(`starting node ${nodeId} (it builds the busybox base layer when missing; log in ${join(logs, `node-${nodeId}.log`)})`);
    const nodeOpts = { natsUrl, home, id: nodeId, inheritLogs: false, onLine: (l: string) => progressLine(l, o.say), ...(natsStore ? { env: { PADDOCK_NATS_STORE: natsStore } } : {}) };
    starting = startNode(nodeOpts);
    node = await starting;
    const nodeRestarts: number[] = [];
    // A node that dies (SIGKILL, OOM killer) is started again under the same id: its start removes
    // what its predecessor's sandboxes left and marks their records failed, so nothing runs on
    // unseen and `ps` lists no ghosts. NATS stays up meanwhile.
    const watchNode = (nd: NodeProcess) =>
      void nd.exited.then(async (c) => {
        if (stopping) return;
        const why = `node ${nd.id} exited with code ${c}; see ${nd.logFile ?? 'its log'}`;
        if (!mayRestart(nodeRestarts)) return shutdown(`${why}, ${RESTART_LIMIT} times within ${RESTART_WINDOW_MS / 1000} s`, 1);
        o.say(`${why}: restarting it`);
        starting = startNode(nodeOpts);
        node = undefined;
        try {
          const next = await starting;
          node = next;
          if (stopping) return;
          watchNode(next);
          await writeRecord();
          o.say(`node ${next.id} is back`);
        } catch (err) {
          shutdown(`node ${nd.id} could not be restarted: ${(err as Error).message}`, 1);
        }
      });
    watchNode(node);
    if (stopping) return await finished;
    gateway = await startUpGateway(natsUrl, o.show);
    // The bridge runs only when a provider is configured (bridge/config.ts).
    if (process.env.PADDOCK_BRIDGE_PROVIDER) bridge = await startBridge({ natsUrl });
    await writeRecord();
    o.show(banner({ root: ROOT, natsUrl, embedded: nats !== undefined, home, nodeId, logs, urlFile, placement: process.env.PADDOCK_PLACEMENT !== '0', ...(gateway ? { http: gateway.address } : {}) }));
    return await finished;
  } catch (err) {
    // A shutdown already under way owns the teardown and the exit.
    if (stopping) return await finished;
    stopping = true;
    await teardown().catch(() => {});
    throw err;
  }
}

/** The node's own progress lines that a person starting Paddock wants to see (FnCall images). */
function progressLine(line: string, say: (s: string) => void): void {
  if (!line.includes('"progress":true')) return;
  try {
    const r = JSON.parse(line) as { msg?: string };
    if (r.msg) say(r.msg);
  } catch {
    // A line that is not a log record is nothing to show.
  }
}

function banner(b: { root: string; natsUrl: string; embedded: boolean; home: string; nodeId: string; logs: string; urlFile: string; placement: boolean; http?: string }): string {
  const homeEnv = b.home === DEFAULT_HOME ? '' : `PADDOCK_HOME=${b.home} `;
  return `Paddock is up.
  NATS:  ${b.natsUrl}${b.embedded ? ` (embedded nats-server; URL written to ${b.urlFile})` : ' (joined)'}
  node:  ${b.nodeId}${b.placement ? ' (with a placement replica)' : ''}, home ${b.home}
  logs:  ${b.logs}/ (paddock logs [-f])
${b.http ? `  HTTP:  http://${b.http}/ (the dashboard; the API under /v1, described at /v1/openapi.json)\n` : ''}
From another shell (the CLI and the SDK find it through ${b.embedded ? `${b.urlFile}, or` : ''} NATS_URL):
  export NATS_URL=${b.natsUrl}
  paddock status
  paddock create --label job=demo          # prints a sandbox id
  paddock exec <id> -- sh -c 'echo hello from $(hostname)'
  paddock ps
  paddock rm <id>
(\`paddock\` is ops/bin/paddock in the clone: export PATH=${b.root}/ops/bin:$PATH, or \`npm link\`.)

Or from TypeScript:
  import { Paddock } from 'paddock';
  const pdk = await Paddock.connect({ servers: '${b.natsUrl}' });
  const sb = await pdk.sandboxes.create({ image: 'busybox', labels: { job: 'demo' } });
  console.log((await sb.exec(['echo', 'hello'])).stdout);
  await sb.kill();
  await pdk.close();

To stop: Ctrl-C here, or \`${homeEnv}paddock down\` from any shell (the node kills its sandboxes${b.embedded ? ', then nats-server stops' : ''}).`;
}
