/**
 * Paddock as a service on this host: `up`, `node`, `status`, `down`, `logs`. The running Paddock
 * is found through NATS (the node records name each node's home, hence its logs and the `paddock
 * up` that started it); only when no NATS answers do these fall back to $PADDOCK_HOME.
 */
import { spawn } from 'node:child_process';
import { closeSync, existsSync, openSync, readdirSync, readSync, statSync } from 'node:fs';
import { constants } from 'node:os';
import { join } from 'node:path';
import { jetstreamManager } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import { DEFAULT_HOME, logsDir } from '../../protocol/discovery.ts';
import { Buckets, type NodeRecord, replicasFor, Streams } from '../../protocol/index.ts';
import { connectionOf } from '../../sdk/client.ts';
import type { Paddock } from '../../sdk/index.ts';
import { nodeCommand } from '../launch.ts';
import { alive, readUpRecord, UpError, up } from '../up.ts';
import { type Args, positionals } from './args.ts';
import { age, connect, type GlobalFlags, json, note, out, positiveNumber, table, UsageError } from './common.ts';

export async function upCmd(a: Args): Promise<number> {
  positionals(a, 0, 0, 'up');
  try {
    return await up({ nats: a.values.nats, say: note, show: out });
  } catch (err) {
    if (err instanceof UpError) throw new UsageError(`up: ${err.message}`);
    throw err;
  }
}

/** A node in the foreground: signals are forwarded so it can kill its sandboxes before it exits. */
export async function nodeCmd(a: Args): Promise<number> {
  positionals(a, 0, 0, 'node');
  const natsUrl = a.values.nats ?? process.env.NATS_URL;
  if (!natsUrl) throw new UsageError('node: a node joins an existing NATS: set NATS_URL or pass --nats (or run `paddock up`)');
  const { cmd, args, env } = nodeCommand();
  const child = spawn(cmd, args, { stdio: 'inherit', env: { ...process.env, ...env, NATS_URL: natsUrl } });
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => child.kill(sig));
  return new Promise<number>((resolve, reject) => {
    child.on('error', reject);
    child.on('exit', (code, signal) => resolve(exitStatus(code, signal)));
  });
}

/** A placement replica without a node, in the foreground, until SIGINT/SIGTERM (then it drains). */
export async function placementCmd(a: Args): Promise<number> {
  positionals(a, 0, 0, 'placement');
  const natsUrl = a.values.nats ?? process.env.NATS_URL;
  if (!natsUrl) throw new UsageError('placement: a replica joins an existing NATS: set NATS_URL or pass --nats');
  const { createLogger } = await import('../log.ts');
  const { placementOptions, startPlacement } = await import('../placement-process.ts');
  const { loadConfig } = await import('../../runtime/config.ts');
  const log = createLogger('paddock-placement');
  const cfg = loadConfig();
  const p = await startPlacement({ natsUrl, log, wait: placementOptions(cfg) });
  log.info({ nats: natsUrl }, 'placement ready');
  return new Promise<number>((resolve) => {
    let stopping = false;
    const stop = () => {
      if (stopping) return;
      stopping = true;
      log.info('placement draining');
      void p.stop().then(() => {
        log.info('placement stopped');
        resolve(0);
      });
    };
    for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, stop);
  });
}

/** A child's end as a shell would report it: its code, or 128 + the signal that killed it. */
function exitStatus(code: number | null, signal: NodeJS.Signals | null): number {
  if (code !== null) return code;
  return signal ? 128 + (constants.signals[signal] ?? 0) : 1;
}

export function isLiveRecord(r: NodeRecord, now = Date.now()): boolean {
  return now - r.ts < 3 * r.heartbeatMs;
}

/** The running Paddock as NATS tells it, or why none could be reached. */
interface Found {
  pdk?: Paddock;
  error?: string;
  nodes: NodeRecord[];
}

async function find(g: GlobalFlags): Promise<Found> {
  let pdk: Paddock;
  try {
    pdk = await connect(g, positiveNumber('timeout', g.timeout, true) ?? 5000);
  } catch (err) {
    return { error: (err as Error).message, nodes: [] };
  }
  // The KV key listing can name a key twice when a heartbeat rewrites it mid-listing: one row per node.
  const byNode = new Map<string, NodeRecord>();
  for (const r of await pdk.nodes.list()) if (isLiveRecord(r) && (byNode.get(r.node)?.ts ?? -1) < r.ts) byNode.set(r.node, r);
  return { pdk, nodes: [...byNode.values()].sort((a, b) => a.node.localeCompare(b.node)) };
}

/**
 * The replicas of each of Paddock's JetStream streams that exist (none when JetStream cannot be
 * asked). A stream that did not answer is listed with why, not left out: right after a server of a
 * cluster dies, a stream electing its leader times out, and its absence read as "not there".
 */
async function streamReplicas(nc: NatsConnection): Promise<Array<{ stream: string; replicas?: number; error?: string }>> {
  try {
    const jsm = await jetstreamManager(nc, { timeout: 3000 });
    const names = [...Object.values(Buckets).map((b) => `KV_${b}`), ...Object.values(Streams)];
    const infos = await Promise.all(
      names.map((stream) =>
        jsm.streams.info(stream).then(
          (i) => ({ stream, replicas: i.config.num_replicas }),
          (e: Error) => (/not found/i.test(e.message) ? null : { stream, error: e.message }),
        ),
      ),
    );
    return infos.filter((i) => i !== null);
  } catch {
    return [];
  }
}

/** Homes of the live nodes; $PADDOCK_HOME (or the default) when NATS names none. */
function homesOf(f: Found): string[] {
  const homes = [...new Set(f.nodes.map((r) => r.home).filter((h): h is string => typeof h === 'string'))];
  return homes.length > 0 ? homes : [process.env.PADDOCK_HOME || DEFAULT_HOME];
}

export async function status(a: Args): Promise<number> {
  positionals(a, 0, 0, 'status [--json]');
  const f = await find(a.values);
  try {
    const infos = await Promise.all(f.nodes.map((r) => f.pdk?.nodes.info(r.node, { timeoutMs: 3000 }).catch(() => undefined)));
    const ups = homesOf(f).map((home) => ({ home, up: readUpRecord(home) }));
    if (a.values.json) {
      json({ nats: f.pdk ? { url: connectionOf(f.pdk).getServer(), server: connectionOf(f.pdk).info?.version, jetstream: connectionOf(f.pdk).info?.jetstream === true } : { error: f.error }, nodes: f.nodes.map((r, i) => ({ ...r, fnPools: (infos[i] as { fnPools?: unknown } | undefined)?.fnPools, fnImages: (infos[i] as { fnImages?: unknown } | undefined)?.fnImages })), up: ups, gateway: ups.flatMap((u) => (u.up?.http ? [{ url: `http://${u.up.http}/`, pid: u.up.pid, home: u.home }] : [])) });
      return f.pdk ? 0 : 1;
    }
    if (!f.pdk) {
      out(`NATS:       not reachable (${f.error})`);
      for (const u of ups) out(`up:         ${u.up ? `pid ${u.up.pid} for ${u.home}, starting or stuck (NATS ${u.up.nats || 'not yet started'})` : `not running for ${u.home}`}`);
      return 1;
    }
    const nc = connectionOf(f.pdk);
    out(`NATS:       ${nc.getServer()} (nats-server ${nc.info?.version ?? '?'}${nc.info?.jetstream ? ', JetStream' : ''}${nc.info?.cluster ? `; cluster ${nc.info.cluster} of ${nc.info.connect_urls?.length ?? '?'} servers` : ''})`);
    const streams = await streamReplicas(nc);
    const wanted = replicasFor(nc.info);
    if (streams.length > 0) out(`replicas:   ${streams.map((s) => `${s.stream} ${s.replicas ?? `? (no answer: ${s.error})`}`).join(', ')}${streams.some((s) => s.replicas !== undefined && s.replicas < wanted) ? ` — fewer than ${wanted}: see the node log's warning to raise them` : ''}`);
    const placement = f.nodes.filter((r) => r.placement !== false).map((r) => r.node);
    out(`placement:  ${placement.length} replica(s)${placement.length ? ` (in ${placement.join(', ')})` : ''}`);
    const gateways = ups.flatMap((u) => (u.up?.http ? [`http://${u.up.http}/ (in paddock up, pid ${u.up.pid})`] : []));
    out(`gateway:    ${gateways.length > 0 ? gateways.join(', ') : 'none started by paddock up on this host'}`);
    for (const u of ups) if (u.up) out(`up:         pid ${u.up.pid} since ${age(Date.now() - u.up.startedAt)} ago for ${u.home}; 'paddock down' stops it`);
    out(`logs:       ${homesOf(f).map((h) => `${logsDir(h)}/`).join(', ')} ('paddock logs [node] [-f]')`);
    out('');
    if (f.nodes.length === 0) {
      out('no live node');
      return 0;
    }
    const rows = f.nodes.map((r) => [
      r.node,
      r.state,
      `${r.sandboxes}`,
      `${round(r.allocated.cpu)}/${round(r.capacity.cpu)}`,
      `${r.allocated.memoryMiB}/${r.capacity.memoryMiB}Mi`,
      r.images.join(','),
      r.home ?? '-',
    ]);
    out(table(['NODE', 'STATE', 'SANDBOXES', 'CPU', 'MEMORY', 'IMAGES', 'HOME'], rows));
    out('');
    out('FnCall:');
    f.nodes.forEach((r, i) => {
      const info = infos[i] as { fnPools?: Record<string, { members: number; idle: number; warm: number }>; fnImages?: Record<string, FnImageState> } | undefined;
      if (!r.fn) {
        out(`  ${r.node}: off`);
        return;
      }
      const pools = Object.entries(info?.fnPools ?? {})
        .map(([img, p]) => `${img} ${p.members} member(s), ${p.idle} idle, ${p.warm} kept warm`)
        .join(', ');
      const images = Object.entries(info?.fnImages ?? {})
        .map(([img, s]) => `${img} ${fnImageText(s)}`)
        .join(', ');
      out(`  ${r.node}: languages ${r.fn.languages.join(', ') || 'none yet'}; running ${r.fn.running}, queued ${r.fn.queued}${pools ? `; pools: ${pools}` : ''}${images ? `; images: ${images}` : ''}`);
    });
    return 0;
  } finally {
    await f.pdk?.close().catch(() => {});
  }
}

/** How a node's FnCall image stands (node.info `fnImages`). */
export interface FnImageState {
  state: 'ready' | 'building' | 'failed';
  startedAt?: number;
  etaMs?: number;
  step?: string;
  error?: string;
}

function fnImageText(s: FnImageState): string {
  if (s.state === 'building') return `building${s.etaMs !== undefined ? ` (about ${Math.ceil(s.etaMs / 1000)} s left)` : ''}`;
  if (s.state === 'failed') return `failed: ${s.error ?? '?'}`;
  return 'ready';
}

function round(n: number): string {
  return String(Math.round(n * 100) / 100);
}

const DOWN_WAIT_MS = 330_000;

/** Stops what `paddock up` (npm start) started, from any shell: SIGTERM to it, then wait. */
export async function down(a: Args): Promise<number> {
  positionals(a, 0, 0, 'down');
  const f = await find(a.values);
  await f.pdk?.close().catch(() => {});
  const targets = homesOf(f)
    .map((home) => ({ home, up: readUpRecord(home) }))
    .filter((t) => t.up !== undefined);
  if (targets.length === 0) {
    const foreign = f.nodes.map((r) => `${r.node}${r.home ? ` (home ${r.home})` : ''}`);
    note(foreign.length > 0 ? `no 'paddock up' of this host serves the live nodes ${foreign.join(', ')}; stop them where they run` : 'Paddock is not running');
    return foreign.length > 0 ? 1 : 0;
  }
  let code = 0;
  for (const t of targets) {
    const pid = t.up?.pid as number;
    note(`stopping Paddock for ${t.home} (paddock up, pid ${pid}); the node kills its sandboxes…`);
    try {
      process.kill(pid, 'SIGTERM');
    } catch {
      continue;
    }
    const until = Date.now() + DOWN_WAIT_MS;
    while (alive(pid) && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
    if (alive(pid)) {
      note(`pid ${pid} is still stopping after ${DOWN_WAIT_MS / 1000} s; see ${logsDir(t.home)}/`);
      code = 1;
    } else note('stopped');
  }
  return code;
}

/** `logs [node|nats] [-f] [-n N] [--json]`: a node's log (or nats-server's), as a person reads it. */
export async function logs(a: Args): Promise<number> {
  const [which] = positionals(a, 0, 1, 'logs [node|nats] [-f] [-n LINES] [--json]');
  const f = await find(a.values);
  await f.pdk?.close().catch(() => {});
  let file: string;
  if (which === 'nats' || which === 'nats-server') {
    const homes = homesOf(f);
    if (homes.length > 1) throw new UsageError(`logs: nats-server of which home? (${homes.join(', ')})`);
    file = join(logsDir(homes[0] as string), 'nats-server.log');
  } else {
    const candidates: { node: string; file: string }[] = f.nodes.length
      ? f.nodes.filter((r) => r.home).map((r) => ({ node: r.node, file: join(logsDir(r.home as string), `node-${r.node}.log`) }))
      : logFilesIn(logsDir(homesOf(f)[0] as string));
    const pick = which === undefined ? candidates : candidates.filter((c) => c.node === which);
    if (pick.length !== 1) {
      const names = candidates.map((c) => c.node).join(', ') || 'none';
      throw new UsageError(which === undefined ? `logs: name a node (${names}) or 'nats'` : `logs: no log of node ${which} (nodes: ${names})`);
    }
    file = (pick[0] as { file: string }).file;
  }
  if (!existsSync(file)) throw new UsageError(`logs: ${file} does not exist (yet)`);
  const lines = positiveNumber('lines', a.values.lines, true);
  const show = a.values.json ? (l: string) => out(l) : (l: string) => out(pretty(l));
  let pos = printTail(file, lines, show);
  if (!a.values.follow) return 0;
  // Poll, not fs.watch: rotation renames the file, and the new one must be picked up by name.
  let ino = statSync(file).ino;
  let partial = '';
  for (;;) {
    await new Promise((r) => setTimeout(r, 250));
    let st: ReturnType<typeof statSync>;
    try {
      st = statSync(file);
    } catch {
      continue;
    }
    if (st.ino !== ino || st.size < pos) {
      ino = st.ino;
      pos = 0;
    }
    if (st.size === pos) continue;
    const buf = readRange(file, pos, st.size);
    pos = st.size;
    const text = partial + buf.toString();
    const parts = text.split('\n');
    partial = parts.pop() ?? '';
    for (const l of parts) show(l);
  }
}

function logFilesIn(dir: string): { node: string; file: string }[] {
  try {
    return readdirSync(dir)
      .map((n) => /^node-(.+)\.log$/.exec(n))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => ({ node: m[1] as string, file: join(dir, m[0]) }));
  } catch {
    return [];
  }
}

function readRange(file: string, from: number, to: number): Buffer {
  const fd = openSync(file, 'r');
  try {
    const buf = Buffer.alloc(to - from);
    let off = 0;
    while (off < buf.length) {
      const n = readSync(fd, buf, off, buf.length - off, from + off);
      if (n === 0) break;
      off += n;
    }
    return buf.subarray(0, off);
  } finally {
    closeSync(fd);
  }
}

/** Prints the last `n` lines (all without `n`); returns the offset read up to. */
function printTail(file: string, n: number | undefined, show: (l: string) => void): number {
  const size = statSync(file).size;
  const text = readRange(file, 0, size).toString();
  const end = text.lastIndexOf('\n') + 1;
  const lines = text.slice(0, end).split('\n');
  lines.pop();
  for (const l of n === undefined ? lines : lines.slice(-n)) show(l);
  return end;
}

const LEVELS: Record<number, string> = { 10: 'TRACE', 20: 'DEBUG', 30: 'INFO', 40: 'WARN', 50: 'ERROR', 60: 'FATAL' };
const SKIP = new Set(['level', 'time', 'pid', 'hostname', 'name', 'msg', 'node']);

/** A pino JSON line as `time LEVEL msg key=value…`; anything else as it is. */
export function pretty(line: string): string {
  if (!line.startsWith('{')) return line;
  let r: Record<string, unknown>;
  try {
    r = JSON.parse(line) as Record<string, unknown>;
  } catch {
    return line;
  }
  const time = typeof r.time === 'number' ? new Date(r.time).toISOString().slice(11, 23) : '';
  const level = (LEVELS[r.level as number] ?? String(r.level)).padEnd(5);
  const rest = Object.entries(r)
    .filter(([k]) => !SKIP.has(k))
    .map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`)
    .join(' ');
  return `${time} ${level} ${r.msg ?? ''}${rest ? `  ${rest}` : ''}`;
}
