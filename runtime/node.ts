/**
 * The node process: one supervisor actor that admits sandboxes against the node's capacity, one
 * sandbox actor per sandbox, a heartbeat in `pdk_nodes`, and (optionally) a placement replica.
 */
import { cpus, totalmem } from 'node:os';
import { ensurePidMax, pidCapacity } from './pids.ts';
import { type KV, Kvm } from '@nats-io/kv';
import { connect, type NatsConnection, type Subscription } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { type Actor, createActor } from 'xstate';
import { serve, tracer } from '../actors/bind.ts';
import { admissionState, nodeMachine, pickVictims, refusal, underPressure } from '../actors/node.ts';
import { PlacementHost } from '../actors/placement-host.ts';
import { loadChronusConfig } from '../chronus/config.ts';
import { Journal } from '../chronus/journal.ts';
import { SandboxHost } from '../actors/sandbox-host.ts';
import {
  Buckets,
  type CreateReply,
  type GroupVerb,
  encode,
  Limits,
  newSandboxId,
  type NodeRecord,
  ProtocolError,
  type Resources,
  type SandboxInfo,
  scanKv,
  subjects,
  toWireError,
  diskMiBOf,
  validateCreate,
  validateNodeGroup,
} from '../protocol/index.ts';
import type { Backend } from './backend.ts';
import type { NodeConfig } from './config.ts';
import { ContainerBackend } from './container/backend.ts';
import { FnService } from './fncall/service.ts';
import { NodeImages } from './images/node-images.ts';
import { Semaphore } from './limit.ts';
import { describe, judge, readMemory } from './pressure.ts';

export class PaddockNode {
  private nc!: NatsConnection;
  private directory!: KV;
  private nodesKv!: KV;
  private backend!: ContainerBackend;
  private images!: NodeImages;
  private readonly supervisor: Actor<typeof nodeMachine>;
  private readonly sandboxes = new Map<string, SandboxHost>();
  private readonly subs: Subscription[] = [];
  private placement?: PlacementHost;
  private fn?: FnService;
  private journal?: Journal;
  private heartbeat?: NodeJS.Timeout;
  private pressureTimer?: NodeJS.Timeout;
  private reclaiming = false;
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
      pids: cfg.capacity.pids ?? pidCapacity(ensurePidMax(cfg.capacity.raisePidMax, log)),
      // The container backend's writable layers are tmpfs: RAM, promised at the memory overcommit.
      diskMiB: cfg.capacity.diskMiB ?? Math.floor((totalmem() / 1024 / 1024) * cfg.overcommit.memory),
    };
    this.creates = new Semaphore(cfg.createConcurrency);
    this.supervisor = createActor(nodeMachine, { input: { capacity: this.capacity } });
  }

  get id(): string {
    return this.cfg.nodeId;
  }

  async start(): Promise<void> {
    if (!this.cfg.natsUrl) throw new Error('the node needs NATS_URL');
    // noAsyncTraces: by default every request (each directory write is one) captures a stack trace
    // for its possible timeout error — ~10% of the node's main thread in a group pause of 3,200.
    this.nc = await connect({ servers: this.cfg.natsUrl, name: `paddock-node-${this.id}`, maxReconnectAttempts: -1, noAsyncTraces: true });
    const kvm = new Kvm(this.nc);
    this.directory = await kvm.create(Buckets.sandboxes, { history: 1 });
    this.nodesKv = await kvm.create(Buckets.nodes, { history: 1 });
    this.journal = await Journal.open(this.nc, { nodeId: this.id, log: this.log.child({ part: 'chronus' }), config: loadChronusConfig(), maxPayload: this.nc.info?.max_payload ?? 1024 * 1024 });
    this.journal.startSweeper();

    this.images = new NodeImages(this.cfg, this.log.child({ part: 'images' }));
    await this.images.start();
    this.imageNames = await this.images.list();

    this.backend = new ContainerBackend({ nodeDir: this.cfg.nodeDir, nodeId: this.id, layers: this.images.layers, binDir: this.cfg.binDir, log: this.log });
    this.backend.onCrash = (id, why) => this.sandboxes.get(id)?.crashed(why);
    const leftovers = await this.backend.recover();
    if (leftovers.length > 0) this.log.warn({ sandboxes: leftovers }, 'removed leftovers of a previous run');
    await this.markOrphans();
    if (this.cfg.fn.enabled) {
      const fn = new FnService({ nc: this.nc, backend: this.backend, images: this.images, cfg: this.cfg.fn, nodeId: this.id, nodeDir: this.cfg.nodeDir, log: this.log.child({ part: 'fncall' }) });
      // A node that cannot serve FnCall (no C compiler for its runner) still serves sandboxes.
      await fn.start().then(
        () => (this.fn = fn),
        (err: unknown) => this.log.error({ err }, 'FnCall is not available on this node'),
      );
      // With a store of its own, the node makes what FnCall needs; a shared store is filled by whoever runs it.
      if (this.fn && this.cfg.fn.buildImages && !this.cfg.layers.store) fn.buildImages({ imagesDir: this.cfg.imagesDir, copyFrom: this.cfg.fn.imagesFrom });
    }

    this.supervisor.start();
    this.subs.push(serve(this.nc, subjects.node(this.id, 'create'), { log: this.log, name: 'node.create', maxBytes: Limits.createBytesMax }, (req) => this.create(req.body)));
    this.subs.push(serve(this.nc, subjects.node(this.id, 'group'), { log: this.log, name: 'node.group' }, (req) => this.group(req.body)));
    this.subs.push(serve(this.nc, subjects.node(this.id, 'info'), { log: this.log, name: 'node.info' }, async () => ({ ...this.record(), ids: [...this.sandboxes.keys()], layers: await this.images.stats(), ...(this.fn ? { fnPools: this.fn.stats(), fnImages: this.fn.imageStates() } : {}) })));

    await this.beat();
    this.heartbeat = setInterval(() => void this.beat(), this.cfg.heartbeatMs);
    this.pressureTimer = setInterval(() => void this.watchMemory(), this.cfg.pressure.intervalMs);
    if (this.cfg.placement) {
      this.placement = new PlacementHost(this.nc, this.nodesKv, this.log.child({ part: 'placement' }));
      await this.placement.start();
    }
  }

  /** Directory records this node left running when it died: they did not survive, say so. */
  private async markOrphans(): Promise<void> {
    const now = Date.now();
    for (const { key, value: info } of await scanKv<SandboxInfo>(this.directory)) {
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
      store: this.images.storeUrl,
      home: this.cfg.home,
      placement: this.cfg.placement,
      ...(this.fn ? { fn: { languages: this.fn.languages(this.imageNames), ...this.fn.load } } : {}),
      capacity: this.capacity,
      allocated: ctx.allocated,
      sandboxes: this.sandboxes.size,
      heartbeatMs: this.cfg.heartbeatMs,
      ts: Date.now(),
      state: admissionState(this.supervisor.getSnapshot().value) === 'serving' ? 'serving' : 'draining',
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
    const b = validateCreate(body);
    const spec = b.spec;
    const backend = this.backendFor(spec.backend);
    const id = b.id ?? newSandboxId();
    if (this.sandboxes.has(id)) throw new ProtocolError('INVALID_REQUEST', `sandbox ${id} already exists`);

    const need: Resources = { cpu: spec.cpu, memoryMiB: spec.memoryMiB, sandboxes: 1, pids: spec.pidsLimit, diskMiB: diskMiBOf(spec) };
    const never = refusal({ capacity: this.capacity, allocated: { cpu: 0, memoryMiB: 0, sandboxes: 0 }, holds: new Map() }, need);
    if (never) throw new ProtocolError('NO_CAPACITY', `node ${this.id} can never hold this sandbox: ${never}`);
    // Refused before the image is looked up: a trainer's creates past capacity cost the node little.
    this.admissible(id, need);
    const image = await this.images.forSpec(spec);
    this.admissible(id, need);
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
        journal: this.journal,
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

  /** NO_CAPACITY unless the supervisor would admit `need` now. */
  private admissible(id: string, need: Resources): void {
    const snap = this.supervisor.getSnapshot();
    if (admissionState(snap.value) !== 'serving') throw new ProtocolError('NO_CAPACITY', `node ${this.id} is draining`);
    if (!snap.can({ type: 'ADMIT', id, need })) {
      throw new ProtocolError('NO_CAPACITY', `node ${this.id} is full: ${refusal(snap.context, need) ?? 'refused'}`);
    }
  }

  /** Applies a group verb to this node's sandboxes of `group`, many at once; a summary per sandbox. */
  private async group(body: unknown): Promise<NodeGroupReply> {
    const b = validateNodeGroup(body);
    const verb = b.verb;
    const members = [...this.sandboxes.values()].filter((h) => h.spec.group === b.group);
    const failed: NodeGroupReply['failed'] = [];
    let ok = 0;
    const limit = new Semaphore(64);
    await Promise.all(
      members.map((h) =>
        limit.run(async () => {
          try {
            await applyGroupVerb(h, verb);
            ok++;
          } catch (err) {
            const w = toWireError(err);
            failed.push({ id: h.id, node: this.id, code: w.code, message: w.message });
          }
        }),
      ),
    );
    return { total: members.length, ok, failed };
  }

  /** One reading of the memory gauge; under pressure, hibernate idle best-effort sandboxes one by one. */
  private async watchMemory(): Promise<void> {
    if (this.reclaiming) return;
    this.reclaiming = true;
    try {
      let reading = await readMemory();
      const verdict = judge(reading, this.cfg.pressure);
      const was = underPressure(this.supervisor.getSnapshot().value);
      if (verdict === 'pressure' && !was) {
        this.supervisor.send({ type: 'PRESSURE', reading: describe(reading) });
        this.log.warn({ memory: reading }, 'memory pressure: hibernating idle best-effort sandboxes');
      } else if (verdict === 'relieved' && was) {
        this.supervisor.send({ type: 'RELIEVED' });
        this.log.info({ memory: reading }, 'memory pressure relieved');
      }
      if (!underPressure(this.supervisor.getSnapshot().value)) return;
      const now = Date.now();
      const victims = pickVictims(
        [...this.sandboxes.values()].map((h) => ({ id: h.id, qos: h.spec.qos, state: h.state, idleSince: h.idleSince() })),
        now,
        this.cfg.pressure.minIdleMs,
      );
      for (const id of victims) {
        const h = this.sandboxes.get(id);
        if (!h) continue;
        await tracer.startActiveSpan('node.pressure.hibernate', { attributes: { 'sandbox.id': id, 'node.memory': describe(reading), 'sandbox.idle_ms': now - h.idleSince() } }, async (span) => {
          try {
            const info = await h.lifecycle({ type: 'HIBERNATE', why: 'pressure' });
            this.log.warn({ sandbox: id, idleMs: now - h.idleSince(), released: info.released, memory: reading }, 'hibernated under memory pressure');
          } catch (err) {
            this.log.warn({ err, sandbox: id }, 'could not hibernate under pressure');
          } finally {
            span.end();
          }
        });
        reading = await readMemory();
        if (judge(reading, this.cfg.pressure) !== 'pressure') break;
      }
    } catch (err) {
      this.log.warn({ err }, 'memory watch failed');
    } finally {
      this.reclaiming = false;
    }
  }

  /** Stops serving; kills every sandbox (nothing is left behind) unless `keepSandboxes`. */
  async stop(opts: { keepSandboxes?: boolean } = {}): Promise<void> {
    clearInterval(this.heartbeat);
    clearInterval(this.pressureTimer);
    this.placement?.stop();
    this.supervisor.send({ type: 'DRAIN' });
    for (const s of this.subs) s.unsubscribe();
    if (!opts.keepSandboxes) await Promise.allSettled([...this.sandboxes.values()].map((s) => s.kill('killed')));
    // Steps cut short by the kills above still get their results into the log.
    await this.journal?.close();
    await this.nodesKv?.delete(this.id).catch(() => {});
    await this.fn?.stop().catch((err: unknown) => this.log.warn({ err }, 'FnCall stop failed'));
    await this.backend?.close();
    await this.images?.close();
    this.supervisor.send({ type: 'STOP' });
    await this.nc?.drain().catch(() => {});
  }
}

export interface NodeGroupReply {
  total: number;
  ok: number;
  failed: Array<{ id: string; node: string; code: string; message: string }>;
}

/** A group verb on one sandbox; already being where the verb leads counts as done. */
async function applyGroupVerb(h: SandboxHost, verb: GroupVerb): Promise<void> {
  const st = h.state;
  switch (verb) {
    case 'kill':
      await h.kill('killed');
      return;
    case 'pause':
      if (st === 'paused' || st === 'hibernated') return;
      await h.lifecycle({ type: 'PAUSE', why: 'group' });
      return;
    case 'hibernate':
      if (st === 'hibernated') return;
      await h.lifecycle({ type: 'HIBERNATE', why: 'group' });
      return;
    case 'resume':
    case 'restore':
      if (st === 'running') return;
      await h.lifecycle({ type: st === 'hibernated' ? 'RESTORE' : 'RESUME' });
      return;
  }
}
