/**
 * The node process: its composition root and entry point. It opens what a node is made of — the
 * NATS connection, the `pdk_sandboxes` and `pdk_nodes` buckets, the command log, the images, the
 * backends PADDOCK_BACKENDS names (runtime/backends.ts) — and hands them to the node host
 * (actors/node-host.ts), the FnCall host and, optionally, a placement replica. Stopping closes them
 * in the reverse order.
 *
 * Run it through `nodeCommand()` (launch.ts); started any other way it relaunches itself there
 * and forwards signals.
 */
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { FnHost } from '../actors/fncall-host.ts';
import { transitionInspector } from '../actors/inspect.ts';
import { NodeHost } from '../actors/node-host.ts';
import { PlacementHost } from '../actors/placement-host.ts';
import { loadChronusConfig } from '../chronus/config.ts';
import { Journal } from '../chronus/journal.ts';
import { logsDir, natsServers } from '../protocol/discovery.ts';
import { Buckets, ensureBucket, type FewerReplicas, fewerReplicasWarning, replicasFor } from '../protocol/index.ts';
import { BackendSet } from '../runtime/backends.ts';
import { loadConfig, type NodeConfig } from '../runtime/config.ts';
import { ContainerBackend } from '../runtime/container/index.ts';
import { FnService } from '../runtime/fncall/service.ts';
import { NodeImages } from '../runtime/images/node-images.ts';
import { MicrovmBackend } from '../runtime/microvm/index.ts';
import { NS_MARK, nodeCommand } from './launch.ts';
import { createLogger } from './log.ts';
import { metricsSpanProcessor, type NodeMetrics, startNodeMetrics } from './metrics.ts';
import { profileOnSignal, setupTelemetry, shutdownTelemetry } from './telemetry.ts';

/** Killing 3,200 sandboxes takes ~30 s here: a running node gets ten times that to stop. */
const STOP_DEADLINE_MS = 300_000;
/** A node still starting has few sandboxes, if any. */
const STOP_DEADLINE_STARTING_MS = 15_000;

/** A node's parts, opened in order; `stop` closes what was opened, in reverse. */
class NodeProcess {
  private nc?: NatsConnection;
  private journal?: Journal;
  private images?: NodeImages;
  private backends?: BackendSet;
  private fn?: FnHost;
  private host?: NodeHost;
  private placement?: PlacementHost;
  private metrics?: NodeMetrics;

  constructor(
    private readonly cfg: NodeConfig,
    private readonly log: Logger,
  ) {}

  get capacity() {
    return this.host?.capacity;
  }

  async start(): Promise<void> {
    const { cfg, log } = this;
    if (!cfg.natsUrl) throw new Error('the node needs NATS_URL');
    // noAsyncTraces: by default every request (each directory write is one) captures a stack trace
    // for its possible timeout error — ~10% of the node's main thread in a group pause of 3,200.
    // Every server of a NATS_URL list; reconnecting for ever, every half second: a node that loses
    // NATS keeps its sandboxes running and serves again the moment NATS is back (watchConnection).
    const nc = await connect({ servers: natsServers(cfg.natsUrl), name: `paddock-node-${cfg.nodeId}`, maxReconnectAttempts: -1, reconnectTimeWait: 500, noAsyncTraces: true });
    this.nc = nc;
    void this.watchConnection(nc);
    const replicas = replicasFor(nc.info);
    const fewer = (f: FewerReplicas) => log.warn({ ...f }, fewerReplicasWarning(f));
    const directory = await ensureBucket(nc, Buckets.sandboxes, { history: 1, replicas }, fewer);
    const nodes = await ensureBucket(nc, Buckets.nodes, { history: 1, replicas }, fewer);
    const maxPayload = nc.info?.max_payload ?? 1024 * 1024;
    this.journal = await Journal.open(nc, { nodeId: cfg.nodeId, log: log.child({ part: 'chronus' }), config: loadChronusConfig(), maxPayload });
    this.journal.startSweeper();

    this.images = new NodeImages(cfg, log.child({ part: 'images' }));
    await this.images.start();

    this.backends = await BackendSet.open(cfg.backends, { cfg, images: this.images, log, env: process.env });
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

    const inspect = transitionInspector(log);
    const host = new NodeHost({ nc, directory, nodes, backends: this.backends, images: this.images, journal: this.journal, fn: this.fn, cfg, log, inspect });
    this.host = host;
    await host.start();
    if (cfg.placement) {
      this.placement = new PlacementHost(nc, nodes, log.child({ part: 'placement' }), inspect, cfg.waitForCapacity, { id: cfg.nodeId, refusalFor: (spec) => host.refusalFor(spec) });
      await this.placement.start();
    }
    this.metrics = await startNodeMetrics({ nc, nodes, nodeId: cfg.nodeId, nodeDir: cfg.nodeDir, log });
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
        await this.host?.reconnected().catch((err: unknown) => log.warn({ err }, 're-publishing after reconnect failed'));
      }
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
    await this.images?.close();
    await this.nc?.drain().catch(() => {});
  }
}

async function main(): Promise<void> {
  if (process.env[NS_MARK] !== '1') {
    const { cmd, args, env } = nodeCommand();
    const child = spawn(cmd, args, { stdio: 'inherit', env: { ...process.env, ...env } });
    for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => child.kill(sig));
    child.on('exit', (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
    return;
  }
  const cfg = loadConfig();
  const log = createLogger('paddock-node', cfg.logLevel).child({ node: cfg.nodeId });
  setupTelemetry('paddock-node', { tracesFile: join(logsDir(cfg.home), `traces-node-${cfg.nodeId}.jsonl`), instanceId: cfg.nodeId, processors: [metricsSpanProcessor()] });
  profileOnSignal(`node-${cfg.nodeId}`, log);
  const node = new NodeProcess(cfg, log);
  let stopping = false;
  // An object, not a `let`: the stop handler reads it after start has set it.
  const phase: { started: boolean } = { started: false };
  const stop = async (sig: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ sig }, 'node stopping');
    // A stop that hangs (a start stuck in a syscall, NATS gone for good) must still end the
    // process: what it leaves, the next start of this node cleans up (recovery).
    const deadline = phase.started ? STOP_DEADLINE_MS : STOP_DEADLINE_STARTING_MS;
    setTimeout(() => {
      log.error({ sig, deadlineMs: deadline }, 'node stop did not finish in time: exiting');
      process.exit(1);
    }, deadline).unref();
    await node.stop().catch((err: unknown) => log.error({ err }, 'stop failed'));
    await shutdownTelemetry();
    log.info('node stopped');
    process.exit(0);
  };
  process.on('SIGINT', () => void stop('SIGINT'));
  process.on('SIGTERM', () => void stop('SIGTERM'));
  try {
    await node.start();
  } catch (err) {
    log.fatal({ err }, 'node failed to start');
    await node.stop().catch(() => {});
    process.exit(1);
  }
  phase.started = true;
  log.info({ capacity: node.capacity, backends: cfg.backends, nats: cfg.natsUrl }, 'node ready');
}

await main();
