/**
 * Node configuration: embedded defaults, overridden by environment variables. One place lists
 * every knob; the README's configuration table is generated from the same names.
 */
import { cpus, hostname, totalmem } from 'node:os';
import { isAbsolute, join, normalize } from 'node:path';
import { DEFAULT_HOME } from '../protocol/discovery.ts';
import { positiveEnv } from '../protocol/env.ts';
import { type BackendKind, Backends } from '../protocol/index.ts';

export interface NodeConfig {
  /** Root of everything Paddock keeps on this host. */
  home: string;
  /** Shared image store (layers and manifests). */
  imagesDir: string;
  /** Layer images: where nodes read them from and how they keep them (runtime/images/). */
  layers: {
    /** Store to read from: `http://…` or `rclone:<remote>:<path>`; unset = serve imagesDir from this node. */
    store?: string;
    /** host:port the embedded store listens on. */
    listen: string;
    mode: 'lazy' | 'eager';
    cacheDir: string;
    cacheBytes: number;
    /** One store request may take this long before a lazy read fails with EIO. */
    timeoutMs: number;
    /** A layer no sandbox uses stays mounted this long. */
    idleMs: number;
    /** The kernel's read-ahead on lazily loaded layers, KiB; undefined: the kernel's default. */
    readaheadKiB?: number;
  };
  /** This node's own state: crun root, sandbox bundles, layer mounts. */
  nodeDir: string;
  /** Where the sandbox init is compiled, once per host (root-owned: it is every sandbox's pid 1). */
  binDir: string;
  nodeId: string;
  /** Sandbox backends this node offers (runtime/backends.ts opens them). */
  backends: BackendKind[];
  natsUrl?: string;
  /** Run a placement replica in this process too. */
  placement: boolean;
  /** How long the placement replica holds a create no node can admit while the bridge says capacity is coming, and how many at most. */
  waitForCapacity: { ms: number; maxWaiting: number };
  /** Placement: a node silent this long has its sandboxes marked `node_lost` (undefined: placement's default, 15 s). */
  nodeLostMs?: number;
  /** Placement: how long an ended sandbox's record stays in the directory (PADDOCK_ENDED_RETENTION_SEC). */
  endedRetentionMs: number;
  overcommit: { cpu: number; memory: number };
  maxSandboxes: number;
  /**
   * Admission of pids and writable layers (runtime/pids.ts): fixed numbers when set
   * (PADDOCK_NODE_PIDS, PADDOCK_NODE_DISK_MIB), else what the host has; `raisePidMax` lets the
   * node raise kernel.pid_max at start (PADDOCK_RAISE_PID_MAX=0: never).
   */
  capacity: { pids?: number; diskMiB?: number; raisePidMax: boolean };
  /** Default cap on stdout and on stderr of one exec. */
  maxOutputBytes: number;
  /** Output a streamed exec keeps for callers that reconnect (exec.resume). */
  streamBufferBytes: number;
  /** Output each background process keeps per stream for late readers, unless its start asks otherwise. */
  processBufferBytes: number;
  heartbeatMs: number;
  pressure: { minAvailableMiB: number; psiAvg10: number; minIdleMs: number; intervalMs: number };
  /**
   * Backend creates run at most this many at once; the rest queue. A `crun run` spends part of its
   * time asleep (its parent-child handshake, RCU grace periods as its mount namespaces go), so on
   * 2 cores 4 at once left CPU idle: at 2,000 live, 4 → 8 took creates/s from a median of ~111 to
   * ~125 (16: no better).
   */
  createConcurrency: number;
  /** FnCall (runtime/fncall/): warm pools and the node's invocation queue. */
  fn: FnConfig;
  logLevel: string;
}

export interface FnConfig {
  enabled: boolean;
  /** Warm members per runtime: a language (counted for its image's pool) or an image. */
  pool: Record<string, number>;
  /** Fill the warm pools when the node starts; else when its first invocation arrives. */
  prewarm: boolean;
  /** Invocations waiting for a member, per node, at most; past it they are refused with BUSY. */
  queue: number;
  /** Members per image at most, warm ones included. */
  maxMembers: number;
  /** What one program may write to /work, /tmp and /dev/shm together. */
  diskMiB: number;
  /** Processes and threads of one program at most. */
  pidsLimit: number;
  /** Where the runner binary is built, once per host (root-owned: it runs in every member). */
  runnerDir: string;
  /**
   * Build (or copy from the host's default store) the images the languages need, in the
   * background, when the node serves its own store and lacks them.
   */
  buildImages: boolean;
  /** Stores to copy those images from before building them (seconds instead of minutes). */
  imagesFrom: string[];
}

/** `python=2,c=1` → { python: 2, c: 1 }. */
export function parsePool(v: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const part of v.split(',').map((s) => s.trim()).filter(Boolean)) {
    const m = /^([a-z0-9][a-z0-9._-]*)=(\d+)$/.exec(part);
    if (!m) throw new Error(`PADDOCK_FN_POOL=${v}: expected runtime=count pairs, e.g. python=2,c=1`);
    out[m[1] as string] = Number(m[2]);
  }
  return out;
}

export const ENV_DOC: Record<string, string> = {
  NATS_URL: 'NATS to join, one server or a comma-separated list of a cluster\'s (nats://a:4222,nats://b:4222); unset = start an embedded nats-server (npm start / paddock up)',
  PADDOCK_REPLICAS: 'JetStream replicas of Paddock\'s buckets (default 3 on a NATS cluster of three or more servers, else 1); an existing bucket with fewer is reported in the log',
  PADDOCK_HOME: 'state directory (default /var/lib/paddock)',
  PADDOCK_BIN_DIR: 'where the sandbox init (pid 1 of every sandbox) is compiled once per host (default /var/cache/paddock/bin)',
  PADDOCK_IMAGES_DIR: 'image store (default $PADDOCK_HOME/images)',
  PADDOCK_STORE_URL: 'layer store nodes read from: http://host:port or rclone:<remote>:<path> (default: serve PADDOCK_IMAGES_DIR from the node)',
  PADDOCK_STORE_LISTEN: 'host:port of the embedded layer store (default 127.0.0.1:0, a free port; announced in the node record)',
  PADDOCK_LAYER_MODE: 'lazy (fetch layer bytes on first read) | eager (download whole layers before mounting) (default lazy)',
  PADDOCK_LAYER_CACHE_DIR: 'node-local layer cache (default $PADDOCK_HOME/nodes/<node>/layer-cache)',
  PADDOCK_LAYER_CACHE_BYTES: 'layer cache budget; unused layers are evicted past it (default 10737418240)',
  PADDOCK_STORE_TIMEOUT_MS: 'one store request times out after this; a lazy read gives EIO after 2 tries (default 5000)',
  PADDOCK_LAYER_IDLE_MS: 'a layer no sandbox uses is unmounted after this (default 60000)',
  PADDOCK_LAYER_READAHEAD_KB: "the kernel's read-ahead on lazily loaded layers, KiB (default: the kernel's, 128)",
  PADDOCK_NODE_ID: 'node id (default: the host name)',
  PADDOCK_BACKENDS: 'sandbox backends this node offers, comma-separated: container, microvm, fullvm, sim (default container)',
  PADDOCK_MICROVM_ACCEL: 'microvm backend: kvm or tcg (default: KVM when /dev/kvm exists and a guest boots under it, else TCG)',
  PADDOCK_MICROVM_SPARES: 'microvm backend: QEMU processes kept started, template state loaded, per template for the next create (default 1)',
  PADDOCK_MICROVM_BALLOON: 'microvm and fullvm backends: 0 turns off virtio-balloon free-page reporting (default on: pages a guest frees go back to the host)',
  PADDOCK_VMM_OVERHEAD_MIB: 'microvm and fullvm backends: MiB a VMM\'s cgroup may hold above its guest\'s RAM (default 192)',
  PADDOCK_FULLVM_ACCEL: 'fullvm backend: kvm or tcg (default: as PADDOCK_MICROVM_ACCEL)',
  PADDOCK_FULLVM_SPARES: 'fullvm backend: QEMU processes kept started per desktop template (default 1)',
  PADDOCK_FULLVM_VIEW: "fullvm backend: host:port of the live views' web server (noVNC and the RFB WebSocket; default 127.0.0.1 on a free port)",
  PADDOCK_SNAPSHOT_BUDGET_MIB: "disk the node's VM snapshots may take together, MiB (default 8192)",
  PADDOCK_SIM_CPU: 'sim backend: virtual CPU capacity of the node (default 64)',
  PADDOCK_SIM_MEMORY_MIB: 'sim backend: virtual memory capacity in MiB (default 262144)',
  PADDOCK_SIM_SANDBOXES: 'sim backend: simulated sandboxes per node at most (default 10000)',
  PADDOCK_SIM_DISK_MIB: 'sim backend: virtual disk for writable layers in MiB, counted at admission (default: PADDOCK_SIM_SANDBOXES × 512)',
  PADDOCK_SIM_LATENCY_MS: 'sim backend: how long each verb takes, e.g. create=15,exec=1,hibernate=20 (default: none)',
  PADDOCK_PLACEMENT: '1 = this node also runs a placement replica (default 1)',
  PADDOCK_WAIT_FOR_CAPACITY_MS: 'placement: how long a create waits for capacity the bridge promises (default 30000; 0: never waits)',
  PADDOCK_MAX_WAITING_CREATES: 'placement: creates one replica holds waiting for capacity at most (default 10000)',
  PADDOCK_ENDED_RETENTION_SEC: 'placement: how long the directory keeps the record of a sandbox that has ended (stopped or failed), for sandboxes.get and listings with all (default 86400, a day)',
  PADDOCK_NODE_LOST_MS: "placement: a node silent this long (and ten of its heartbeats) has its sandboxes marked node_lost (default 15000); a node restarted after that does not take them up",
  PADDOCK_CPU_OVERCOMMIT: 'CPU capacity = cores × this (default 16)',
  PADDOCK_MEMORY_OVERCOMMIT: 'memory capacity = RAM × this (default 1.5)',
  PADDOCK_MAX_SANDBOXES: 'sandboxes per node at most (default 4096)',
  PADDOCK_MAX_OUTPUT_BYTES: 'default cap on stdout and on stderr of one exec (default 1048576)',
  PADDOCK_PROCESS_BUFFER_BYTES: 'output each background process or terminal keeps per stream for readers who come late (default 1048576); older output is dropped and counted',
  PADDOCK_STREAM_BUFFER_BYTES: 'recent output each streamed exec keeps for a caller that reconnects (default 524288); older output it missed comes back as a gap event',
  PADDOCK_CREATE_CONCURRENCY: 'backend creates at once; the rest queue (default 8)',
  PADDOCK_HEARTBEAT_MS: 'node heartbeat period in pdk_nodes (default 2000)',
  PADDOCK_FN: '1 = serve FnCall invocations (pdk.v1.fn.invoke) on this node (default 1)',
  PADDOCK_FN_POOL: 'warm FnCall members per runtime, language or image (default python=2,c=1, filled at the first invocation; set it to fill them at start)',
  PADDOCK_FN_QUEUE: 'FnCall invocations waiting for a member, per node; past it: BUSY (default 64)',
  PADDOCK_FN_MAX_MEMBERS: 'FnCall members per image at most (default: the number of cores, at least 2)',
  PADDOCK_FN_DISK_MIB: 'what one FnCall program may write to /work, /tmp and /dev/shm (default 256)',
  PADDOCK_FN_PIDS: 'processes and threads of one FnCall program at most (default 128)',
  PADDOCK_FN_BUILD: '1 = a node serving its own store builds the python and gcc images FnCall needs in the background when missing (copied from PADDOCK_FN_IMAGES_FROM when that has them) (default 1)',
  PADDOCK_FN_IMAGES_FROM: 'image store directories (comma-separated) the background FnCall image build copies from when they have the images (default /var/lib/paddock/images)',
  PADDOCK_FN_RUNNER_DIR: 'where the FnCall runner is compiled once per host (default /var/cache/paddock/fncall)',
  PADDOCK_PRESSURE_MIN_AVAILABLE_MIB: 'memory pressure when MemAvailable is under this (default 5% of RAM)',
  PADDOCK_PRESSURE_PSI_AVG10: 'memory pressure when PSI memory some avg10 is over this percent (default 25)',
  PADDOCK_PRESSURE_MIN_IDLE_SEC: 'under pressure, hibernate best-effort sandboxes idle at least this long (default 30)',
  PADDOCK_DNS_UPSTREAM: 'host[:port] the DNS filter asks for allowed names (default: the first nameserver of /etc/resolv.conf)',
  PADDOCK_PIN_CPUS: '0 turns CPU pinning off (nproc then shows the node CPUs; the CFS quota still holds)',
  PADDOCK_LXCFS: '0 starts no lxcfs (sandboxes then see the host /proc/meminfo)',
  PADDOCK_FILES_WRITE_MIBPS: 'files.write bandwidth per sandbox after a 16 MiB burst (default 32)',
  PADDOCK_EXEC_OUTPUT_MIBPS: 'output bandwidth of a sandbox\'s commands (exec, streams, processes) after a 16 MiB burst (default 16); past it the command waits on its pipe',
  PADDOCK_NODE_OUTPUT_MIBPS: 'output bandwidth of all commands on the node after a 32 MiB burst (default 16)',
  PADDOCK_TRACES: 'console | otlp: export OpenTelemetry spans (OTLP endpoint from OTEL_EXPORTER_OTLP_ENDPOINT)',
  PADDOCK_LOG_LEVEL: 'pino level (default info)',
  PADDOCK_CPU_PROFILE: 'directory: SIGUSR2 starts a V8 CPU profile of the node, a second SIGUSR2 writes it there',
};

const numEnv = positiveEnv;

function readaheadEnv(v: string | undefined): number | undefined {
  if (v === undefined || v === '') return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new Error(`PADDOCK_LAYER_READAHEAD_KB=${v}: must be a whole number of KiB (0: none)`);
  return n;
}

function layerMode(v: string | undefined): 'lazy' | 'eager' {
  if (v === undefined || v === '' || v === 'lazy') return 'lazy';
  if (v === 'eager') return 'eager';
  throw new Error(`PADDOCK_LAYER_MODE=${v}: must be lazy or eager`);
}

function backendKinds(v: string | undefined): BackendKind[] {
  const kinds = (v || 'container').split(',').map((s) => s.trim()).filter(Boolean);
  for (const k of kinds) {
    if (!(Backends as readonly string[]).includes(k)) throw new Error(`PADDOCK_BACKENDS=${v}: unknown backend '${k}' (known: ${Backends.join(', ')})`);
  }
  if (kinds.length === 0) throw new Error(`PADDOCK_BACKENDS=${v}: name at least one backend`);
  return [...new Set(kinds)] as BackendKind[];
}

export function sanitizeId(s: string): string {
  const id = s.replace(/[^A-Za-z0-9_-]/g, '-').slice(0, 64);
  return id || 'node';
}

/**
 * Where the node builds its C programs: a real directory. Under /proc, /sys or /dev, Node's
 * recursive mkdir never settles (it spins a CPU), and the node would never become ready.
 */
function binDir(dir: string): string {
  if (!isAbsolute(dir)) throw new Error(`PADDOCK_BIN_DIR=${dir}: must be an absolute path`);
  if (/^\/(proc|sys|dev)(\/|$)/.test(normalize(dir))) throw new Error(`PADDOCK_BIN_DIR=${dir}: must not be under /proc, /sys or /dev`);
  return dir;
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): NodeConfig {
  const home = env.PADDOCK_HOME || DEFAULT_HOME;
  const nodeId = sanitizeId(env.PADDOCK_NODE_ID || hostname());
  return {
    home,
    imagesDir: env.PADDOCK_IMAGES_DIR || join(home, 'images'),
    layers: {
      store: env.PADDOCK_STORE_URL || undefined,
      listen: env.PADDOCK_STORE_LISTEN || '127.0.0.1:0',
      mode: layerMode(env.PADDOCK_LAYER_MODE),
      cacheDir: env.PADDOCK_LAYER_CACHE_DIR || join(home, 'nodes', nodeId, 'layer-cache'),
      cacheBytes: numEnv(env, 'PADDOCK_LAYER_CACHE_BYTES', 10 * 1024 ** 3),
      timeoutMs: numEnv(env, 'PADDOCK_STORE_TIMEOUT_MS', 5000),
      idleMs: numEnv(env, 'PADDOCK_LAYER_IDLE_MS', 60_000),
      readaheadKiB: readaheadEnv(env.PADDOCK_LAYER_READAHEAD_KB),
    },
    nodeDir: join(home, 'nodes', nodeId),
    binDir: binDir(env.PADDOCK_BIN_DIR || '/var/cache/paddock/bin'),
    nodeId,
    backends: backendKinds(env.PADDOCK_BACKENDS),
    natsUrl: env.NATS_URL || undefined,
    placement: (env.PADDOCK_PLACEMENT ?? '1') !== '0',
    waitForCapacity: { ms: env.PADDOCK_WAIT_FOR_CAPACITY_MS === '0' ? 0 : numEnv(env, 'PADDOCK_WAIT_FOR_CAPACITY_MS', 30_000), maxWaiting: numEnv(env, 'PADDOCK_MAX_WAITING_CREATES', 10_000) },
    ...(env.PADDOCK_NODE_LOST_MS ? { nodeLostMs: positiveEnv(env, 'PADDOCK_NODE_LOST_MS', 15_000) } : {}),
    endedRetentionMs: 1000 * positiveEnv(env, 'PADDOCK_ENDED_RETENTION_SEC', 86_400),
    overcommit: { cpu: numEnv(env, 'PADDOCK_CPU_OVERCOMMIT', 16), memory: numEnv(env, 'PADDOCK_MEMORY_OVERCOMMIT', 1.5) },
    maxSandboxes: numEnv(env, 'PADDOCK_MAX_SANDBOXES', 4096),
    capacity: {
      ...(env.PADDOCK_NODE_PIDS ? { pids: numEnv(env, 'PADDOCK_NODE_PIDS', 0) } : {}),
      ...(env.PADDOCK_NODE_DISK_MIB ? { diskMiB: numEnv(env, 'PADDOCK_NODE_DISK_MIB', 0) } : {}),
      raisePidMax: (env.PADDOCK_RAISE_PID_MAX ?? '1') !== '0',
    },
    maxOutputBytes: numEnv(env, 'PADDOCK_MAX_OUTPUT_BYTES', 1024 * 1024),
    streamBufferBytes: numEnv(env, 'PADDOCK_STREAM_BUFFER_BYTES', 512 * 1024),
    processBufferBytes: numEnv(env, 'PADDOCK_PROCESS_BUFFER_BYTES', 1024 * 1024),
    heartbeatMs: numEnv(env, 'PADDOCK_HEARTBEAT_MS', 2000),
    createConcurrency: numEnv(env, 'PADDOCK_CREATE_CONCURRENCY', 8),
    fn: {
      enabled: (env.PADDOCK_FN ?? '1') !== '0',
      pool: parsePool(env.PADDOCK_FN_POOL || 'python=2,c=1'),
      prewarm: (env.PADDOCK_FN_POOL ?? '') !== '',
      queue: positiveEnv(env, 'PADDOCK_FN_QUEUE', 64),
      maxMembers: positiveEnv(env, 'PADDOCK_FN_MAX_MEMBERS', Math.max(2, cpus().length)),
      diskMiB: positiveEnv(env, 'PADDOCK_FN_DISK_MIB', 256),
      pidsLimit: positiveEnv(env, 'PADDOCK_FN_PIDS', 128),
      runnerDir: env.PADDOCK_FN_RUNNER_DIR || '/var/cache/paddock/fncall',
      buildImages: (env.PADDOCK_FN_BUILD ?? '1') !== '0',
      imagesFrom: (env.PADDOCK_FN_IMAGES_FROM ?? join(DEFAULT_HOME, 'images')).split(',').filter(Boolean),
    },
    pressure: {
      minAvailableMiB: positiveEnv(env, 'PADDOCK_PRESSURE_MIN_AVAILABLE_MIB', Math.floor(totalmem() / 1024 / 1024 / 20)),
      psiAvg10: positiveEnv(env, 'PADDOCK_PRESSURE_PSI_AVG10', 25),
      minIdleMs: positiveEnv(env, 'PADDOCK_PRESSURE_MIN_IDLE_SEC', 30) * 1000,
      intervalMs: positiveEnv(env, 'PADDOCK_PRESSURE_INTERVAL_MS', 1000),
    },
    logLevel: env.PADDOCK_LOG_LEVEL || 'info',
  };
}
