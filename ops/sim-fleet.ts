/**
 * A fleet of simulated nodes in one process (`paddock sim`): N node supervisors that offer only the
 * simulated backend, each with its own NATS connection, node id, config and logger, and
 * everything above the backend the production code (ops/node-process.ts): admission, sandbox
 * actors, the directory, events, group verbs, the command log, and a placement replica in the
 * first few.
 *
 * What a container node needs and a simulated one does not, is left out or shared: no mount
 * namespace (there is nothing to mount), one image catalog for the whole process (names and
 * manifests, no layer daemon: a simulated sandbox names an image and never reads it), no FnCall
 * (it needs containers), no per-node metrics server (the registry is process-wide, and each would
 * subscribe to every sandbox event of the cluster to count its own).
 */
import type { Logger } from 'pino';
import { Semaphore } from '../runtime/limit.ts';
import { loadConfig, type NodeConfig } from '../runtime/config.ts';
import { NodeImages } from '../runtime/images/node-images.ts';
import { type MemoryReading, readMemory } from '../runtime/pressure.ts';
import { NodeProcess } from './node-process.ts';

/** The reference system's node: ~190 cores and 1.5 TiB of memory. */
export const SIM_NODE_DEFAULTS = { cpu: 190, memoryMiB: 1536 * 1024, sandboxes: 3200 };

export interface SimFleetOptions {
  /** NATS to join: one URL or a comma-separated list of a cluster's. */
  natsUrl: string;
  /** Nodes in this process. */
  nodes: number;
  /** Index of the first node: ids are `<prefix><first>`, `<prefix><first+1>`, … (several processes make one fleet). */
  first?: number;
  prefix?: string;
  /** Per node, before overcommit (PADDOCK_CPU_OVERCOMMIT, PADDOCK_MEMORY_OVERCOMMIT of `env` apply). */
  cpu?: number;
  memoryMiB?: number;
  /** Sandboxes per node at most. */
  sandboxesPerNode?: number;
  /** Placement replicas in this process, in its first nodes (default 1). */
  placement?: number;
  /** Base environment of every node's config (PADDOCK_HOME, PADDOCK_HEARTBEAT_MS, …); default process.env. */
  env?: NodeJS.ProcessEnv;
  log: Logger;
  /** Nodes started at once (each opens a connection, buckets and a stream on start). */
  startConcurrency?: number;
}

/** The config of node `i` of a fleet, as loadConfig makes it from a per-node environment. */
export function simNodeEnv(o: SimFleetOptions, i: number): NodeJS.ProcessEnv {
  const base = o.env ?? process.env;
  const probe = loadConfig({ ...base, PADDOCK_BACKENDS: 'sim' });
  const first = o.first ?? 0;
  // The sim backend offers what it is told: the overcommit a real node applies is applied here.
  const cpu = (o.cpu ?? SIM_NODE_DEFAULTS.cpu) * probe.overcommit.cpu;
  const memoryMiB = Math.floor((o.memoryMiB ?? SIM_NODE_DEFAULTS.memoryMiB) * probe.overcommit.memory);
  return {
    ...base,
    NATS_URL: o.natsUrl,
    PADDOCK_NODE_ID: `${o.prefix ?? 'sim-'}${first + i}`,
    PADDOCK_BACKENDS: 'sim',
    PADDOCK_FN: '0',
    PADDOCK_PLACEMENT: i < (o.placement ?? 1) ? '1' : '0',
    PADDOCK_SIM_CPU: String(cpu),
    PADDOCK_SIM_MEMORY_MIB: String(memoryMiB),
    PADDOCK_SIM_SANDBOXES: String(o.sandboxesPerNode ?? SIM_NODE_DEFAULTS.sandboxes),
  };
}

/**
 * One reading of the host's memory for every node of the process, at most every half second: the
 * pressure watch of each node reads it every second, and 40 nodes were 80 file reads a second of
 * the same two files.
 */
function sharedMemoryGauge(): () => Promise<MemoryReading> {
  let last: { at: number; reading: Promise<MemoryReading> } | undefined;
  return () => {
    if (!last || Date.now() - last.at > 500) last = { at: Date.now(), reading: readMemory() };
    return last.reading;
  };
}

export class SimFleet {
  readonly nodes: NodeProcess[] = [];
  private images?: NodeImages;
  private stopping?: Promise<void>;

  constructor(private readonly o: SimFleetOptions) {
    if (!Number.isInteger(o.nodes) || o.nodes < 1) throw new Error(`a fleet has at least one node, not ${o.nodes}`);
  }

  /** Node ids of this process, in order. */
  get ids(): string[] {
    return this.nodes.map((n) => n.id);
  }

  /** Sandboxes live on this process's nodes. */
  get sandboxes(): number {
    return this.nodes.reduce((s, n) => s + n.sandboxes, 0);
  }

  async start(): Promise<void> {
    const { log } = this.o;
    const envs = Array.from({ length: this.o.nodes }, (_, i) => simNodeEnv(this.o, i));
    const cfgs: NodeConfig[] = envs.map((e) => loadConfig(e));
    const first = cfgs[0] as NodeConfig;
    // One catalog for the process, served once (or read from PADDOCK_STORE_URL): 160 store servers
    // and 160 layer daemons would be 160 HTTP servers and 160 child processes doing nothing.
    this.images = new NodeImages(first, log.child({ part: 'images' }), { layers: false });
    await this.images.start();
    const gauge = sharedMemoryGauge();
    const startNode = async (i: number) => {
      const cfg = cfgs[i] as NodeConfig;
      const node = new NodeProcess(cfg, log.child({ node: cfg.nodeId }), { env: envs[i], images: this.images, metrics: false, readMemory: gauge });
      this.nodes.push(node);
      await node.start();
    };
    // The first alone: on a fresh cluster it creates the buckets and the command log's stream, and
    // a few nodes creating the same replicated stream at once time out waiting for its leader.
    const results = await Promise.allSettled([startNode(0)]);
    const limit = new Semaphore(this.o.startConcurrency ?? 8);
    if (results[0]?.status === 'fulfilled') results.push(...(await Promise.allSettled(cfgs.slice(1).map((_, i) => limit.run(() => startNode(i + 1))))));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) {
      await this.stop();
      throw failed.reason;
    }
    this.nodes.sort((a, b) => cfgs.findIndex((c) => c.nodeId === a.id) - cfgs.findIndex((c) => c.nodeId === b.id));
  }

  /** Stops every node (each kills its sandboxes and removes its record), then the catalog. */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      await Promise.allSettled(this.nodes.map((n) => n.stop().catch((err: unknown) => this.o.log.error({ err, node: n.id }, 'node stop failed'))));
      await this.images?.close();
    })();
    return this.stopping;
  }
}
