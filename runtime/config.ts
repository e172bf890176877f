/**
 * Node configuration: embedded defaults, overridden by environment variables. One place lists
 * every knob; the README's configuration table is generated from the same names.
 */
import { hostname, totalmem } from 'node:os';
import { join } from 'node:path';
import { DEFAULT_HOME } from '../protocol/discovery.ts';

export interface NodeConfig {
  /** Root of everything Paddock keeps on this host. */
  home: string;
  /** Shared image store (layers and manifests). */
  imagesDir: string;
  /** This node's own state: crun root, sandbox bundles, layer mounts. */
  nodeDir: string;
  nodeId: string;
  natsUrl?: string;
  /** Run a placement replica in this process too. */
  placement: boolean;
  overcommit: { cpu: number; memory: number };
  maxSandboxes: number;
  /** Default cap on stdout and on stderr of one exec. */
  maxOutputBytes: number;
  heartbeatMs: number;
  pressure: { minAvailableMiB: number; psiAvg10: number; minIdleMs: number; intervalMs: number };
  /** Backend creates run at most this many at once; the rest queue. */
  createConcurrency: number;
  logLevel: string;
}

export const ENV_DOC: Record<string, string> = {
  NATS_URL: 'NATS to join; unset = start an embedded nats-server (npm start / paddock up)',
  PADDOCK_HOME: 'state directory (default /var/lib/paddock)',
  PADDOCK_IMAGES_DIR: 'image store (default $PADDOCK_HOME/images)',
  PADDOCK_NODE_ID: 'node id (default: the host name)',
  PADDOCK_PLACEMENT: '1 = this node also runs a placement replica (default 1)',
  PADDOCK_CPU_OVERCOMMIT: 'CPU capacity = cores × this (default 16)',
  PADDOCK_MEMORY_OVERCOMMIT: 'memory capacity = RAM × this (default 1.5)',
  PADDOCK_MAX_SANDBOXES: 'sandboxes per node at most (default 4096)',
  PADDOCK_MAX_OUTPUT_BYTES: 'default cap on stdout and on stderr of one exec (default 1048576)',
  PADDOCK_CREATE_CONCURRENCY: 'backend creates at once; the rest queue (default 4)',
  PADDOCK_HEARTBEAT_MS: 'node heartbeat period in pdk_nodes (default 2000)',
  PADDOCK_PRESSURE_MIN_AVAILABLE_MIB: 'memory pressure when MemAvailable is under this (default 5% of RAM)',
  PADDOCK_PRESSURE_PSI_AVG10: 'memory pressure when PSI memory some avg10 is over this percent (default 25)',
  PADDOCK_PRESSURE_MIN_IDLE_SEC: 'under pressure, hibernate best-effort sandboxes idle at least this long (default 30)',
  PADDOCK_TRACES: 'console | otlp: export OpenTelemetry spans (OTLP endpoint from OTEL_EXPORTER_OTLP_ENDPOINT)',
  PADDOCK_LOG_LEVEL: 'pino level (default info)',
};

function numEnv(env: NodeJS.ProcessEnv, name: string, dflt: number): number {
  const v = env[name];
  if (v === undefined || v === '') return dflt;
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${name}=${v}: must be a positive number`);
  return n;
}

export function sanitizeId(s: string): string {
  const id = s.replace(/[^A-Za-z0-9_-]/g, '-').slice(0, 64);
  return id || 'node';
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): NodeConfig {
  const home = env.PADDOCK_HOME || DEFAULT_HOME;
  const nodeId = sanitizeId(env.PADDOCK_NODE_ID || hostname());
  return {
    home,
    imagesDir: env.PADDOCK_IMAGES_DIR || join(home, 'images'),
    nodeDir: join(home, 'nodes', nodeId),
    nodeId,
    natsUrl: env.NATS_URL || undefined,
    placement: (env.PADDOCK_PLACEMENT ?? '1') !== '0',
    overcommit: { cpu: numEnv(env, 'PADDOCK_CPU_OVERCOMMIT', 16), memory: numEnv(env, 'PADDOCK_MEMORY_OVERCOMMIT', 1.5) },
    maxSandboxes: numEnv(env, 'PADDOCK_MAX_SANDBOXES', 4096),
    maxOutputBytes: numEnv(env, 'PADDOCK_MAX_OUTPUT_BYTES', 1024 * 1024),
    heartbeatMs: numEnv(env, 'PADDOCK_HEARTBEAT_MS', 2000),
    createConcurrency: numEnv(env, 'PADDOCK_CREATE_CONCURRENCY', 4),
    pressure: {
      minAvailableMiB: numEnv(env, 'PADDOCK_PRESSURE_MIN_AVAILABLE_MIB', Math.floor(totalmem() / 1024 / 1024 / 20)),
      psiAvg10: numEnv(env, 'PADDOCK_PRESSURE_PSI_AVG10', 25),
      minIdleMs: numEnv(env, 'PADDOCK_PRESSURE_MIN_IDLE_SEC', 30) * 1000,
      intervalMs: numEnv(env, 'PADDOCK_PRESSURE_INTERVAL_MS', 1000),
    },
    logLevel: env.PADDOCK_LOG_LEVEL || 'info',
  };
}
