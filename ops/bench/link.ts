/**
 * A shaped network link for benchmarks: two network namespaces of our own, joined by a veth pair
 * whose store-side end is shaped with the kernel's `tbf` queueing discipline (`netem` is not built
 * into this kernel, so there is no added delay or loss). The layer store runs in one namespace, the
 * node and everything that talks to it in the other; the only addresses are the two ends of one
 * private /30 inside those namespaces, and neither namespace has a route anywhere else.
 *
 * The veth ends are created inside the namespaces (`ip link add … netns`), so no interface ever
 * appears in the host's namespace. Namespaces are named `pdklink-<pid>-<n>-{s,c}` after the process
 * that made them: a later run removes those whose process is gone (a run killed with SIGKILL could
 * not clean up after itself).
 */
import { run } from '../../runtime/proc.ts';

export const LINK_RATES = ['1gbit', '10gbit', 'none'] as const;
export type LinkRate = (typeof LINK_RATES)[number];

const PREFIX = 'pdklink-';
const NAME = /^pdklink-(\d+)-(\d+)-([sc])$/;
/** Link-local would do as well; any private /30 is fine, since nothing routes in or out. */
const STORE_ADDR = '10.77.0.1';
const CLIENT_ADDR = '10.77.0.2';
const STORE_DEV = 'pdk-store';
const CLIENT_DEV = 'pdk-client';

export function parseLinkRate(v: string | undefined): LinkRate {
  if ((LINK_RATES as readonly string[]).includes(v ?? '')) return v as LinkRate;
  throw new Error(`--link: one of ${LINK_RATES.join(', ')}, got ${v ?? 'nothing'}`);
}

/** Bits per second of a tbf rate such as `1gbit`. */
export function rateBits(rate: Exclude<LinkRate, 'none'>): number {
  return rate === '10gbit' ? 10e9 : 1e9;
}

export interface Link {
  rate: Exclude<LinkRate, 'none'>;
  storeNs: string;
  clientNs: string;
  storeAddr: string;
  clientAddr: string;
  clientDev: string;
  /** `argv` run in namespace `side`'s network (only: the mount namespace stays the caller's). */
  enter(side: 'store' | 'client', argv: string[]): string[];
  /** Bytes the client end has received so far (store → client: what shaping limits). */
  rxBytes(): Promise<number>;
  /** Kills what still runs in the two namespaces, removes the veth pair and the namespaces. */
  close(): Promise<void>;
}

async function netnsNames(): Promise<string[]> {
  const r = await run('ip', ['netns', 'list'], { allowFail: true });
  return r.stdout
    .split('\n')
    .map((l) => l.trim().split(/\s+/)[0] ?? '')
    .filter((n) => n.startsWith(PREFIX));
}

/** Our namespaces alive now (for tests and reports). */
export async function linkNamespaces(): Promise<string[]> {
  return netnsNames();
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Processes in namespace `ns`: only ever ours (the store server, the benchmark's node and its
 * sandboxes' helpers), since the namespace is.
 */
async function killIn(ns: string): Promise<void> {
  for (let round = 0; round < 20; round++) {
    const r = await run('ip', ['netns', 'pids', ns], { allowFail: true });
    const pids = r.stdout
      .split('\n')
      .map((x) => Number.parseInt(x, 10))
      .filter((p) => p > 1 && p !== process.pid);
    if (pids.length === 0) return;
    for (const p of pids) {
      try {
        process.kill(p, round === 0 ? 'SIGTERM' : 'SIGKILL');
      } catch {
        // already gone
      }
    }
    await new Promise((res) => setTimeout(res, round === 0 ? 500 : 100));
  }
}

async function removeNs(names: string[]): Promise<void> {
  for (const ns of names) await killIn(ns);
  for (const ns of names) {
    // Deleting one end deletes the pair; the namespace itself goes when its last user does.
    await run('ip', ['-n', ns, 'link', 'del', ns.endsWith('-s') ? STORE_DEV : CLIENT_DEV], { allowFail: true });
    await run('ip', ['netns', 'del', ns], { allowFail: true });
  }
}

/** Removes link namespaces left by runs whose process is gone; returns their names. */
export async function removeStaleLinks(): Promise<string[]> {
  const stale = (await netnsNames()).filter((n) => {
    const m = NAME.exec(n);
    return m !== null && !alive(Number(m[1]));
  });
  await removeNs(stale);
  return stale;
}

/** Bytes received so far by the client end of the link in namespace `clientNs`. */
export async function clientRxBytes(clientNs: string): Promise<number> {
  const r = await run('ip', ['-n', clientNs, '-s', '-j', 'link', 'show', 'dev', CLIENT_DEV]);
  const j = JSON.parse(r.stdout) as Array<{ stats64?: { rx?: { bytes?: number } } }>;
  return j[0]?.stats64?.rx?.bytes ?? 0;
}

let made = 0;

/** Makes the namespace pair and the shaped veth between them. */
export async function createLink(rate: Exclude<LinkRate, 'none'>): Promise<Link> {
  const id = `${PREFIX}${process.pid}-${made++}`;
  const storeNs = `${id}-s`;
  const clientNs = `${id}-c`;
  const ip = (...a: string[]) => run('ip', a);
  const link: Link = {
    rate,
    storeNs,
    clientNs,
    storeAddr: STORE_ADDR,
    clientAddr: CLIENT_ADDR,
    clientDev: CLIENT_DEV,
    enter: (side, argv) => ['nsenter', `--net=/run/netns/${side === 'store' ? storeNs : clientNs}`, '--', ...argv],
    rxBytes: () => clientRxBytes(clientNs),
    close: () => removeNs([storeNs, clientNs]),
  };
  try {
    await ip('netns', 'add', storeNs);
    await ip('netns', 'add', clientNs);
    await ip('link', 'add', 'name', STORE_DEV, 'netns', storeNs, 'type', 'veth', 'peer', 'name', CLIENT_DEV, 'netns', clientNs);
    for (const [ns, dev, addr] of [
      [storeNs, STORE_DEV, STORE_ADDR],
      [clientNs, CLIENT_DEV, CLIENT_ADDR],
    ] as const) {
      await ip('-n', ns, 'addr', 'add', `${addr}/30`, 'dev', dev);
      await ip('-n', ns, 'link', 'set', dev, 'up');
      // The node, its NATS and the benchmark's client talk over loopback in the client namespace.
      await ip('-n', ns, 'link', 'set', 'lo', 'up');
    }
    // tbf needs a bucket of at least one timer tick of traffic, or it cannot reach its rate: 4 ms
    // worth (500 KB at 1 Gbit/s) passes veth's 64 KiB GSO packets and still caps bursts tightly.
    const burst = Math.max(64 * 1024, Math.round((rateBits(rate) / 8) * 0.004));
    await run('tc', ['-n', storeNs, 'qdisc', 'add', 'dev', STORE_DEV, 'root', 'tbf', 'rate', rate, 'burst', String(burst), 'latency', '50ms']);
  } catch (err) {
    await link.close();
    throw err;
  }
  return link;
}

/** Bytes served by a bench store (store-main.ts), for `--link none` where there is no veth to count. */
export async function servedBytes(statsUrl: string): Promise<number> {
  const { httpRequest } = await import('../../runtime/images/http.ts');
  const r = await httpRequest(statsUrl, { timeoutMs: 10_000 });
  return (JSON.parse(r.body.toString()) as { bytesServed: number }).bytesServed;
}
