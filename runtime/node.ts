/**
 * The node process: one supervisor actor that admits sandboxes against the node's capacity, one
 * sandbox actor per sandbox, a heartbeat in `pdk_nodes`, and (optionally) a placement replica.
 */
import { cpus, totalmem } from 'node:os';
import { type KV, Kvm } from '@nats-io/kv';
import { connect, type NatsConnection, type Subscription } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { type Actor, createActor } from 'xstate';
import { serve } from '../actors/bind.ts';
import { nodeMachine, refusal } from '../actors/node.ts';
import { PlacementHost } from '../actors/placement-host.ts';
import { SandboxHost } from '../actors/sandbox-host.ts';
import {
  Buckets,
  type CreateReply,
  decode,
  encode,
  isToken,
  Limits,
  newSandboxId,
  type NodeRecord,
  ProtocolError,
  type Resources,
  requireRecord,
  type SandboxInfo,
  subjects,
  validateSpec,
} from '../protocol/index.ts';
import type { Backend } from './backend.ts';
import type { NodeConfig } from './config.ts';
import { ContainerBackend } from './container/backend.ts';
import { ensureBusyboxImage } from './images/busybox.ts';
import { ImageStore } from './images/store.ts';
import { Semaphore } from './limit.ts';

export class PaddockNode {
  private nc!: NatsConnection;
  private directory!: KV;
  private nodesKv!: KV;
  private backend!: ContainerBackend;
  private images!: ImageStore;
  private readonly supervisor: Actor<typeof nodeMachine>;
  private readonly sandboxes = new Map<string, SandboxHost>();
  private readonly subs: Subscription[] = [];
  private placement?: PlacementHost;
  private heartbeat?: NodeJS.Timeout;
  private imageNames: string[] = [];
  private readonly creates: Semaphore;
  readonly capacity: Resources;

  constructor(
    readonly cfg: NodeConfig,
    private readonly log: Logger,
  ) {
    this.capacity = {
      cpu: Math.floor(cpus().length * cfg.overcommit.cpu * 100) / 100,
      memoryMiB: Math.floor((totalmem() / 1024 / 1024) * cfg.overcommit.memory),
      sandboxes: cfg.maxSandboxes,
    };
    this.creates = new Semaphore(cfg.createConcurrency);
    this.supervisor = createActor(nodeMachine, { input: { capacity: this.capacity } });
  }

  get id(): string {
    return this.cfg.nodeId;
  }

  async start(): Promise<void> {
    if (!this.cfg.natsUrl) throw new Error('the node needs NATS_URL');
    this.nc = await connect({ servers: this.cfg.natsUrl, name: `paddock-node-${this.id}`, maxReconnectAttempts: -1 });
    const kvm = new Kvm(this.nc);
    this.directory = await kvm.create(Buckets.sandboxes, { history: 1 });
    this.nodesKv = await kvm.create(Buckets.nodes, { history: 1 });

    this.images = new ImageStore(this.cfg.imagesDir);
    await this.images.init();
    await ensureBusyboxImage(this.images);
    this.imageNames = await this.images.list();

    this.backend = new ContainerBackend({ nodeDir: this.cfg.nodeDir, nodeId: this.id, images: this.images });
    const leftovers = await this.backend.recover();
    if (leftovers.length > 0) this.log.warn({ sandboxes: leftovers }, 'removed leftovers of a previous run');
    await this.markOrphans();

    this.supervisor.start();
    this.subs.push(serve(this.nc, subjects.node(this.id, 'create'), { log: this.log, name: 'node.create', maxBytes: Limits.createBytesMax }, (req) => this.create(req.body)));
    this.subs.push(serve(this.nc, subjects.node(this.id, 'info'), { log: this.log, name: 'node.info' }, async () => ({ ...this.record(), ids: [...this.sandboxes.keys()] })));

    await this.beat();
    this.heartbeat = setInterval(() => void this.beat(), this.cfg.heartbeatMs);
    if (this.cfg.placement) {
      this.placement = new PlacementHost(this.nc, this.nodesKv, this.log.child({ part: 'placement' }));
      await this.placement.start();
    }
  }

  /** Directory records this node left running when it died: they did not survive, say so. */
  private async markOrphans(): Promise<void> {
    const now = Date.now();
    for await (const key of await this.directory.keys()) {
      const e = await this.directory.get(key);
      if (e?.operation !== 'PUT') continue;
      const info = decode(e.value) as SandboxInfo;
      if (info.node !== this.id || info.state === 'stopped' || info.state === 'failed') continue;
      const ended: SandboxInfo = { ...info, state: 'failed', reason: 'node_restarted', endedAt: now, error: { code: 'BACKEND_FAILED', message: `node ${this.id} restarted; the sandbox was lost`, retryable: false } };
      await this.directory.put(key, encode(ended));
      this.nc.publish(subjects.event(key, 'failed'), encode(ended));
    }
  }

  private record(): NodeRecord {
    const ctx = this.supervisor.getSnapshot().context;
    return {
      node: this.id,
      backends: [this.backend.kind],
      images: this.imageNames,
      capacity: this.capacity,
      allocated: ctx.allocated,
      sandboxes: this.sandboxes.size,
      heartbeatMs: this.cfg.heartbeatMs,
      ts: Date.now(),
      state: this.supervisor.getSnapshot().value === 'serving' ? 'serving' : 'draining',
    };
  }

  private async beat(): Promise<void> {
    try {
      // Images built while the node runs become placeable at the next beat.
      this.imageNames = await this.images.list();
      await this.nodesKv.put(this.id, encode(this.record()));
    } catch (err) {
      this.log.warn({ err }, 'heartbeat failed');
    }
  }

  private backendFor(kind: string): Backend {
    if (kind !== this.backend.kind) throw new ProtocolError('INVALID_SPEC', `backend '${kind}' is not available on node ${this.id} (available: ${this.backend.kind})`);
    return this.backend;
  }

  private async create(body: unknown): Promise<CreateReply> {
    const b = requireRecord(body, 'create');
    const spec = validateSpec(b.spec ?? {});
    const backend = this.backendFor(spec.backend);
    const image = await this.images.get(spec.image);
    if (!image) throw new ProtocolError('INVALID_SPEC', `image: unknown image '${spec.image}' (known: ${this.imageNames.join(', ')})`, { detail: { field: 'image' } });
    if (b.id !== undefined && !isToken(b.id)) throw new ProtocolError('INVALID_REQUEST', 'id: must be 1-64 characters of [A-Za-z0-9_-]');
    const id = (b.id as string | undefined) ?? newSandboxId();
    if (this.sandboxes.has(id)) throw new ProtocolError('INVALID_REQUEST', `sandbox ${id} already exists`);

    const need: Resources = { cpu: spec.cpu, memoryMiB: spec.memoryMiB, sandboxes: 1 };
    const snap = this.supervisor.getSnapshot();
    if (snap.value !== 'serving') throw new ProtocolError('NO_CAPACITY', `node ${this.id} is draining`);
    if (!snap.can({ type: 'ADMIT', id, need })) {
      throw new ProtocolError('NO_CAPACITY', `node ${this.id} is full: ${refusal(snap.context, need) ?? 'refused'}`);
    }
    this.supervisor.send({ type: 'ADMIT', id, need });

    const host = new SandboxHost(
      {
        nc: this.nc,
        backend,
        directory: this.directory,
        nodeId: this.id,
        log: this.log,
        maxOutputBytes: this.cfg.maxOutputBytes,
        maxPayload: this.nc.info?.max_payload ?? 1024 * 1024,
        onFinal: (h) => {
          this.sandboxes.delete(h.id);
          this.supervisor.send({ type: 'RELEASE', id: h.id });
        },
      },
      id,
      spec,
      image,
    );
    this.sandboxes.set(id, host);
    // Creates beyond a few at once only slow each other down (2 cores share mount and crun work):
    // queueing them keeps the same throughput and gives early callers an early answer.
    const info = await this.creates.run(() => host.start());
    if (info.state === 'failed') {
      const e = info.error;
      throw new ProtocolError(e?.code ?? 'BACKEND_FAILED', `create failed: ${e?.message ?? 'unknown error'}`);
    }
    return { sandbox: info };
  }

  /** Stops serving; kills every sandbox (nothing is left behind) unless `keepSandboxes`. */
  async stop(opts: { keepSandboxes?: boolean } = {}): Promise<void> {
    clearInterval(this.heartbeat);
    this.placement?.stop();
    this.supervisor.send({ type: 'DRAIN' });
    for (const s of this.subs) s.unsubscribe();
    if (!opts.keepSandboxes) await Promise.allSettled([...this.sandboxes.values()].map((s) => s.kill('killed')));
    await this.nodesKv?.delete(this.id).catch(() => {});
    await this.backend?.close();
    this.supervisor.send({ type: 'STOP' });
    await this.nc?.drain().catch(() => {});
  }
}
