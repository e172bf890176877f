/**
 * What a node is made of, opened in order and closed in reverse: the NATS connection, the
 * `pdk_sandboxes` and `pdk_nodes` buckets, the command log, the images, the backends
 * `cfg.backends` names (runtime/backends.ts), handed to the node host (actors/node-host.ts), the
 * FnCall host and, optionally, a placement replica. No process-wide state: the node process
 * (node-main.ts) runs one, `paddock sim` (sim-fleet.ts) runs many in one process, each with its
 * own config, connection and logger.
 */
import { connect, type NatsConnection } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { FnHost } from '../actors/fncall-host.ts';
import type { Inspector } from '../actors/inspect.ts';
import { NodeHost } from '../actors/node-host.ts';
import { PlacementHost } from '../actors/placement-host.ts';
import { type ChronusConfig, loadChronusConfig } from '../chronus/config.ts';
import { Journal } from '../chronus/journal.ts';
import { natsServers } from '../protocol/discovery.ts';
import { Buckets, ensureBucket, type FewerReplicas, fewerReplicasWarning, Limits, positiveEnv, replicasFor } from '../protocol/index.ts';
import { BackendSet } from '../runtime/backends.ts';
import type { NodeConfig } from '../runtime/config.ts';
import { ContainerBackend } from '../runtime/container/index.ts';
import { FnService } from '../runtime/fncall/service.ts';
import { NodeImages } from '../runtime/images/node-images.ts';
import { MicrovmBackend } from '../runtime/microvm/index.ts';
import type { MemoryReading } from '../runtime/pressure.ts';
import { type NodeMetrics, startNodeMetrics } from './metrics.ts';
import { placementOptions } from './placement-process.ts';
import { inspectorFor } from './telemetry.ts';

export interface NodeProcessOptions {
  /** What backends read beyond `cfg` (PADDOCK_SIM_CPU, …): default process.env. */
  env?: NodeJS.ProcessEnv;
  /**
   * Images opened by the caller and shared by several nodes of one process (a simulated fleet):
   * the node uses them and leaves closing them to the caller. Default: the node opens its own.
   */
  images?: NodeImages;
  /**
   * Prometheus metrics on a port of the node's own (default on). Their registry is the process's
   * and each node subscribes to every sandbox event of the cluster to count its own: a fleet of
   * nodes in one process turns them off.
   */
  metrics?: boolean;
  /** The transition inspector (default: one logging to `log` when spans are exported or the log is at debug). */
  inspect?: Inspector;
  chronus?: ChronusConfig;
  /** Names the NATS connection (default `paddock-node-<id>`). */
  connectionName?: string;
  /** The host's memory gauge the pressure watch reads (default: /proc/meminfo and PSI, read per node). */
  readMemory?: () => Promise<MemoryReading>;
}

/** A node's parts, opened in order; `stop` closes what was opened, in reverse. */
export class NodeProcess {
  private nc?: NatsConnection;
  private store?: NatsConnection;
  private journal?: Journal;
  private images?: NodeImages;
  /** The images this node opened itself (and so closes). */
  private ownImages?: NodeImages;
  private backends?: BackendSet;
  private fn?: FnHost;
  private host?: NodeHost;
  private placement?: PlacementHost;
  private metrics?: NodeMetrics;

  constructor(
    private readonly cfg: NodeConfig,
    private readonly log: Logger,
    private readonly o: NodeProcessOptions = {},
  ) {}

  get id(): string {
    return this.cfg.nodeId;
  }

  get capacity() {
    return this.host?.capacity;
  }

  /** Sandboxes live on this node now (0 before start). */
  get sandboxes(): number {
    return this.host?.record().sandboxes ?? 0;
  }

  async start(): Promise<void> {
    const { cfg, log } = this;
    if (!cfg.natsUrl) throw new Error('the node needs NATS_URL');
    const env = this.o.env ?? process.env;
    // noAsyncTraces: by default every request (each directory write is one) captures a stack trace
    // for its possible timeout error — ~10% of the node's main thread in a group pause of 3,200.
    // Every server of a NATS_URL list; reconnecting for ever, every half second: a node that loses
    // NATS keeps its sandboxes running and serves again the moment NATS is back (watchConnection).
    const opts = { servers: natsServers(cfg.natsUrl), maxReconnectAttempts: -1, reconnectTimeWait: 500, noAsyncTraces: true };
    const name = this.o.connectionName ?? `paddock-node-${cfg.nodeId}`;
    const nc = await connect({ ...opts, name });
    this.nc = nc;
    void this.watchConnection(nc);
    // JetStream (the buckets, the command log) over a connection of its own. nats-server 2.9
    // handles a publish to a stream on the publishing connection's read loop: with its store's
    // disk full, a write there blocked, and every message the node sent after it on that
    // connection (the replies to exec, the stream chunks) with it (seen in test/full-disk).
    // Apart, a stuck store costs the records and the log, not the sandboxes' answers.
    const store = await connect({ ...opts, name: `${name}-store` });
    this.store = store;
    void this.watchStore(store);
    const replicas = replicasFor(nc.info);
    const fewer = (f: FewerReplicas) => log.warn({ ...f }, fewerReplicasWarning(f));
    const directory = await ensureBucket(store, Buckets.sandboxes, { history: 1, replicas }, fewer);
    const nodes = await ensureBucket(store, Buckets.nodes, { history: 1, replicas }, fewer);
    const snapshots = await ensureBucket(store, Buckets.snapshots, { history: 1, replicas }, fewer);
    const maxPayload = nc.info?.max_payload ?? 1024 * 1024;
    this.journal = await Journal.open(store, { nodeId: cfg.nodeId, log: log.child({ part: 'chronus' }), config: this.o.chronus ?? loadChronusConfig(env), maxPayload });
    this.journal.startSweeper();

    if (this.o.images) this.images = this.o.images;
    else {
      this.images = new NodeImages(cfg, log.child({ part: 'images' }));
      this.ownImages = this.images;
      await this.images.start();
    }

    this.backends = await BackendSet.open(cfg.backends, { cfg, images: this.images, log, env });
    // An init that dies (killed from inside, or by the OOM killer) fails its sandbox at once.
    const opened = this.backends.get('container')?.backend;
    if (opened instanceof ContainerBackend) opened.onCrash = (id, why) => this.host?.crashed(id, why);
    // A microVM whose VMM dies or whose agent breaks its protocol fails its sandbox the same way.
    const vms = this.backends.get('microvm')?.backend;
    if (vms instanceof MicrovmBackend) vms.onCrash = (id, why) => this.host?.crashed(id, why);
    const leftovers = await this.backends.recover();
    if (Object.keys(leftovers).length > 0) log.warn({ sandboxes: leftovers }, 'removed leftovers of a previous run');

    // FnCall runs in hardened containers: it needs the container backend, not a sandbox kind of its own.
    const container = this.backends.get('container')?.backend;
    if (cfg.fn.enabled && container instanceof ContainerBackend) {
      const service = new FnService({ maxPayload, backend: container, images: this.images, cfg: cfg.fn, nodeId: cfg.nodeId, nodeDir: cfg.nodeDir, log: log.child({ part: 'fncall' }) });
      const fn = new FnHost(nc, service, log.child({ part: 'fncall' }));
      // A node that cannot serve FnCall (no C compiler for its runner) still serves sandboxes.
      await fn.start().then(
        () => (this.fn = fn),
        (err: unknown) => log.error({ err }, 'FnCall is not available on this node'),
      );
      // With a store of its own, the node makes what FnCall needs; a shared store is filled by whoever runs it.
      if (this.fn && cfg.fn.buildImages && !cfg.layers.store) service.buildImages({ imagesDir: cfg.imagesDir, copyFrom: cfg.fn.imagesFrom });
    }

    const inspect = this.o.inspect ?? inspectorFor(log);
    const snapshotBudgetMiB = positiveEnv(env, 'PADDOCK_SNAPSHOT_BUDGET_MIB', Limits.snapshotBudgetMiB.default);
    const host = new NodeHost({ nc, directory, nodes, snapshots, snapshotBudgetMiB, backends: this.backends, images: this.images, journal: this.journal, fn: this.fn, cfg, log, inspect, ...(this.o.readMemory ? { readMemory: this.o.readMemory } : {}) });
    this.host = host;
    await host.start();
    if (cfg.placement) {
      this.placement = new PlacementHost(nc, nodes, log.child({ part: 'placement' }), inspect, placementOptions(cfg), { id: cfg.nodeId, refusalFor: (spec) => host.refusalFor(spec) }, store);
      await this.placement.start();
    }
    if (this.o.metrics !== false) this.metrics = await startNodeMetrics({ nc, nodes, nodeId: cfg.nodeId, nodeDir: cfg.nodeDir, log });
  }

  /**
   * Logs each loss of NATS once and, on reconnect, has the node re-publish its record and every
   * sandbox's true state: writes that failed while NATS was away would leave the directory wrong.
   */
  private async watchConnection(nc: NatsConnection): Promise<void> {
    const log = this.log;
    let lostAt = 0;
    for await (const s of nc.status()) {
      if (s.type === 'disconnect' && lostAt === 0) {
        lostAt = Date.now();
        log.warn({ server: s.server }, 'lost NATS: sandboxes keep running; reconnecting');
      } else if (s.type === 'reconnect') {
        log.warn({ server: s.server, outageMs: lostAt ? Date.now() - lostAt : undefined }, 'NATS is back: re-publishing the node record and sandbox states');
        lostAt = 0;
      }
    }
  }

  /** The records go over the JetStream connection: they are re-published when that one is back. */
  private async watchStore(store: NatsConnection): Promise<void> {
    for await (const s of store.status()) {
      if (s.type === 'reconnect') await this.host?.reconnected().catch((err: unknown) => this.log.warn({ err }, 're-publishing after reconnect failed'));
    }
  }

  /** Stops serving; kills every sandbox (nothing is left behind). */
  async stop(): Promise<void> {
    const log = this.log;
    await this.metrics?.close();
    this.placement?.stop();
    await this.host?.stop();
    // Steps cut short by the kills above still get their results into the log.
    await this.journal?.close();
    await this.fn?.stop().catch((err: unknown) => log.warn({ err }, 'FnCall stop failed'));
    await this.backends?.close().catch((err: unknown) => log.warn({ err }, 'closing backends failed'));
    await this.ownImages?.close();
    await this.nc?.drain().catch(() => {});
    await this.store?.drain().catch(() => {});
  }
}
