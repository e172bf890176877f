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
