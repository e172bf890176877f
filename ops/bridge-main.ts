/**
 * The bridge's composition root: a provider from PADDOCK_BRIDGE_PROVIDER, the policy from
 * PADDOCK_BRIDGE_*, a BridgeHost on NATS. `startBridge` runs it in this process (`paddock up`);
 * run as a script it is a bridge replica of its own (`node --import tsx ops/bridge-main.ts`),
 * stopped by SIGTERM (its machines stay for a successor to adopt).
 */
import { hostname } from 'node:os';
import { join } from 'node:path';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { policyFromEnv } from '../bridge/config.ts';
import { BridgeHost } from '../bridge/host.ts';
import type { Provider } from '../bridge/provider.ts';
import { LocalProvider } from '../bridge/providers/local/index.ts';
import { parseHosts, SshProvider } from '../bridge/providers/ssh/index.ts';
import { DEFAULT_HOME, natsServers } from '../protocol/discovery.ts';
import { nodeCommand } from './launch.ts';
import { createLogger } from './log.ts';
import { inspectorFor } from './telemetry.ts';

export function providerFromEnv(env: NodeJS.ProcessEnv = process.env, home = env.PADDOCK_HOME || DEFAULT_HOME): Provider {
  const name = env.PADDOCK_BRIDGE_PROVIDER;
  const nodeEnv = env.PADDOCK_BRIDGE_NODE_ENV ? (JSON.parse(env.PADDOCK_BRIDGE_NODE_ENV) as Record<string, string>) : {};
  if (name === 'local') {
    return new LocalProvider({
      stateDir: join(home, 'bridge', 'local'),
      command: () => nodeCommand({ dieWithParent: false }),
      env: { PADDOCK_FN: '0', ...nodeEnv },
      cpus: Number(env.PADDOCK_BRIDGE_CPUS || 1),
      memoryMiB: Number(env.PADDOCK_BRIDGE_MEMORY_MIB || 1024),
    });
  }
  if (name === 'ssh') {
    if (!env.PADDOCK_BRIDGE_SSH_HOSTS) throw new Error('PADDOCK_BRIDGE_SSH_HOSTS: the ssh provider needs its pool, user@host[:port],…');
    // A known_hosts file someone vouches for checks every key; without one, each host's key is
    // pinned on first use in a file of the bridge's own (never the user's ~/.ssh/known_hosts).
    const known = env.PADDOCK_BRIDGE_SSH_KNOWN_HOSTS;
    return new SshProvider({
      hosts: parseHosts(env.PADDOCK_BRIDGE_SSH_HOSTS),
      ...(env.PADDOCK_BRIDGE_SSH_KEY ? { identityFile: env.PADDOCK_BRIDGE_SSH_KEY } : {}),
      knownHostsFile: known || join(home, 'bridge', 'ssh', 'known_hosts'),
      hostKeyChecking: known ? 'yes' : 'accept-new',
      nodeCommand: env.PADDOCK_BRIDGE_SSH_NODE_CMD || 'paddock node',
      ...(env.PADDOCK_BRIDGE_SSH_DIR ? { dir: env.PADDOCK_BRIDGE_SSH_DIR } : {}),
      env: nodeEnv,
    });
  }
  throw new Error(`PADDOCK_BRIDGE_PROVIDER: unknown provider ${JSON.stringify(name)} (local, ssh)`);
}

export interface RunningBridge {
  host: BridgeHost;
  /** Stops the bridge; with `release`, gives its machines back first (a Paddock going down as a whole). */
  stop(o?: { release?: boolean }): Promise<void>;
}

export async function startBridge(o: { natsUrl: string; nc?: NatsConnection; log?: Logger; provider?: Provider; env?: NodeJS.ProcessEnv; owner?: string }): Promise<RunningBridge> {
  const env = o.env ?? process.env;
  const log = o.log ?? createLogger('paddock-bridge');
  const nc = o.nc ?? (await connect({ servers: natsServers(o.natsUrl), name: 'paddock-bridge', maxReconnectAttempts: -1 }));
  const inspect = inspectorFor(log);
  const host = new BridgeHost({
    nc,
    provider: o.provider ?? providerFromEnv(env),
    policy: policyFromEnv(env),
    log,
    natsUrl: o.natsUrl,
    owner: o.owner ?? `${hostname()}-${process.pid}`,
    ...(inspect ? { inspect } : {}),
    tag: env.PADDOCK_BRIDGE_TAG || 'default',
  });
  await host.start();
  return {
    host,
    stop: async (s = {}) => {
      await host.stop();
      if (s.release) await host.releaseAll();
      if (!o.nc) await nc.drain().catch(() => {});
    },
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const url = process.env.NATS_URL;
  if (!url) {
    process.stderr.write('NATS_URL is not set\n');
    process.exit(2);
  }
  const b = await startBridge({ natsUrl: url });
  process.stdout.write(`${JSON.stringify({ msg: 'bridge ready' })}\n`);
  const done = () => void b.stop().then(() => process.exit(0));
  process.on('SIGTERM', done);
  process.on('SIGINT', done);
}
