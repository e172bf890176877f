/** How a client finds an embedded Paddock started on this host without NATS_URL. */
import { join } from 'node:path';

export const DEFAULT_HOME = '/var/lib/paddock';

/** File holding the URL of the embedded nats-server that `paddock up` started. */
export function natsUrlFile(home: string = process.env.PADDOCK_HOME || DEFAULT_HOME): string {
  return join(home, 'nats.url');
}

/** File naming the `paddock up` process serving `home` (JSON, see ops/up.ts): what `paddock down` stops. */
export function upPidFile(home: string = process.env.PADDOCK_HOME || DEFAULT_HOME): string {
  return join(home, 'paddock.pid');
}

/** Where `paddock up` keeps the node's and nats-server's logs. */
export function logsDir(home: string = process.env.PADDOCK_HOME || DEFAULT_HOME): string {
  return join(home, 'logs');
}

/**
 * NATS_URL (or `--nats`, or `servers`) as the list of servers it names: `nats://a:4222,nats://b:4222`
 * is two servers, tried in turn, not one URL whose host is `a:4222,nats`.
 */
export function natsServers(urls: string | readonly string[]): string[] {
  const list = (typeof urls === 'string' ? [urls] : urls).flatMap((u) => u.split(',')).map((u) => u.trim());
  return list.filter((u) => u.length > 0);
}
