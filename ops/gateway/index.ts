/**
 * `startGateway`: the HTTP gateway on its own NATS connection. `paddock up` runs one on
 * PADDOCK_HTTP_HOST:PADDOCK_HTTP_PORT (default 127.0.0.1:7070, or a free port when that one is taken; port 0 picks a free one).
 */
import { Paddock } from '../../sdk/index.ts';
import { loadKeys } from './auth.ts';
import { buildGateway, type GatewayOptions } from './server.ts';

export type { GatewayOptions } from './server.ts';
export { buildGateway } from './server.ts';

export interface RunningGateway {
  /** `host:port` as it listens (what PADDOCK_HTTP prints). */
  address: string;
  url: string;
  close(): Promise<void>;
}

export interface StartGatewayOptions extends Partial<Omit<GatewayOptions, 'pdk'>> {
  natsUrl: string;
  host?: string;
  port?: number;
}

export const DEFAULT_HTTP_PORT = 7070;

export async function startGateway(o: StartGatewayOptions): Promise<RunningGateway> {
  const pdk = await Paddock.connect({ servers: o.natsUrl, name: 'paddock-gateway' });
  try {
    const { app } = buildGateway({ ...o, pdk, keys: o.keys ?? loadKeys() });
    const host = o.host ?? process.env.PADDOCK_HTTP_HOST ?? '127.0.0.1';
    const port = o.port ?? (process.env.PADDOCK_HTTP_PORT !== undefined ? Number(process.env.PADDOCK_HTTP_PORT) : DEFAULT_HTTP_PORT);
    // Two Paddocks on one host (two homes, or tests) cannot share the default port: the second
    // takes a free one, and says which.
    await app.listen({ host, port }).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'EADDRINUSE' || o.port !== undefined || process.env.PADDOCK_HTTP_PORT !== undefined) throw err;
      return app.listen({ host, port: 0 });
    });
    const a = app.server.address();
    const bound = typeof a === 'object' && a ? a : { address: host, port };
    const address = `${bound.address.includes(':') ? `[${bound.address}]` : bound.address}:${bound.port}`;
    return {
      address,
      url: `http://${address}`,
      close: async () => {
        // Open streams (events, long execs) would hold close() forever.
        app.server.closeAllConnections?.();
        await app.close();
        await pdk.close().catch(() => {});
      },
    };
  } catch (err) {
    await pdk.close().catch(() => {});
    throw err;
  }
}

/** For `paddock up`: starts the gateway unless PADDOCK_HTTP=0, and prints where it listens (a line of its own on stdout, for scripts). */
export async function startUpGateway(natsUrl: string, say: (s: string) => void): Promise<RunningGateway | undefined> {
  if (process.env.PADDOCK_HTTP === '0') return undefined;
  const gw = await startGateway({ natsUrl });
  say(`PADDOCK_HTTP ${gw.address}`);
  return gw;
}
