/**
 * Binds the node supervisor machine (node.ts) to NATS: creates on `pdk.v1.node.<node>.create`
 * pass its admission and queue for the backend, group verbs fan out to this node's sandboxes of a
 * group, `info`, `drain` and `undrain` answer on their subjects, a heartbeat writes the node record
 * to `pdk_nodes`, and a memory watch hibernates idle best-effort sandboxes under pressure. At start
 * it marks the directory records a previous run of this node left live as failed.
 *
 * Everything it talks to is handed in: the connection, the two KV buckets, the backends, the
 * images, the command log and the clock. The node's composition root (ops/node-process.ts) opens
 * them.
 */
import { randomBytes } from 'node:crypto';
import type { KV } from '@nats-io/kv';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { type Actor, createActor } from 'xstate';
import type { StepJournal } from '../chronus/journal.ts';
import {
  type BackendKind,
  type BackendOffer,
  type CreateReply,
  check,
  type DrainReply,
  decode,
  diskMiBOf,
  encode,
  type ForkReply,
  type ForkRequest,
  type GroupVerb,
  Limits,
  type NodeRecord,
  newSandboxId,
  newSnapshotId,
  ProtocolError,
  type Reply,
  type Resources,
  type SandboxInfo,
  type SandboxSpec,
  type SandboxState,
  Schema,
  type SnapshotInfo,
  type SnapshotsDeleteReply,
  scanKv,
  subjects,
  toWireError,
  unavailable,
  validateCreate,
  validateDrain,
  validateNodeGroup,
} from '../protocol/index.ts';
import { Attr } from '../protocol/trace.ts';
import { type Backend, canSnapshot, type KeptSandbox, keepsSnapshots, movesSnapshots } from '../runtime/backend.ts';
import type { BackendSet } from '../runtime/backends.ts';
import type { NodeConfig } from '../runtime/config.ts';
import type { NodeImages } from '../runtime/images/node-images.ts';
import { Semaphore } from '../runtime/limit.ts';
import { describe, judge, type MemoryReading, readMemory } from '../runtime/pressure.ts';
import { serve, tracer } from './bind.ts';
import type { FnHost } from './fncall-host.ts';
import type { Inspector } from './inspect.ts';
import { admissionState, nodeMachine, pickVictims, refusal, underPressure } from './node.ts';
import { SandboxHost, type SandboxHostDeps, type SandboxSnapshots } from './sandbox-host.ts';
import type { AdoptedState } from './sandbox.ts';

/** Time as the node sees it: injected so heartbeat and pressure logic can run on a test clock. */
export interface NodeClock {
  now(): number;
  /** Calls `fn` every `ms` until the returned function is called. */
  every(ms: number, fn: () => void): () => void;
}

export const realClock: NodeClock = {
  now: () => Date.now(),
  every(ms, fn) {
    const t = setInterval(fn, ms);
    return () => clearInterval(t);
  },
};

export interface NodeHostDeps {
  nc: NatsConnection;
  /** `pdk_sandboxes`: sandbox id → SandboxInfo. */
  directory: KV;
  /** `pdk_nodes`: node id → NodeRecord (the heartbeat). */
  nodes: KV;
  /** `pdk_snapshots`: snapshot id → SnapshotInfo, for the snapshots on this node's disk (absent: snapshots stay unlisted). */
  snapshots?: KV;
  /** Disk the node's snapshots may take together, in MiB (default Limits.snapshotBudgetMiB). */
  snapshotBudgetMiB?: number;
  backends: BackendSet;
  images: NodeImages;
  journal?: StepJournal;
  fn?: FnHost;
  cfg: Pick<NodeConfig, 'nodeId' | 'home' | 'placement' | 'heartbeatMs' | 'pressure' | 'createConcurrency' | 'maxOutputBytes'> & { streamBufferBytes?: number; processBufferBytes?: number };
  log: Logger;
  clock?: NodeClock;
  /** The memory gauge (default: /proc/meminfo and PSI). */
  readMemory?: () => Promise<MemoryReading>;
  inspect?: Inspector;
}

export interface NodeGroupReply {
  total: number;
  ok: number;
  failed: Array<{ id: string; node: string; code: string; message: string }>;
  /** hibernate: what this node's sandboxes of the group gave back. */
  releasedBytes: number;
}

/** A snapshot on this node's disk: its record, and the backend's name for it. */
interface HeldSnapshot {
  info: SnapshotInfo;
  name: string;
  /** A fork's: not listed, removed once the copies have loaded it. */
  temporary?: boolean;
  /** Another node's snapshot fetched through the image store for one create: its files go after it. */
  imported?: boolean;
}

const MiB = 1024 * 1024;
/** States of a sandbox, as its record had it when the node died, in which a taken-up sandbox is woken again. */
const WAKE_AFTER_RESTART = new Set<SandboxState>(['running', 'resuming', 'restoring']);
/** How long a migration waits for placement to make the sandbox's copy elsewhere. */
const MIGRATE_CREATE_MS = 120_000;
/** How long a migration waits for a sandbox's calls under way to end before it gives up on moving it. */
const MIGRATE_QUIESCE_MS = 60_000;
/** How a sleeping sandbox is woken for its move, and put back to sleep, here and on its new node. */
const SLEEPS = {
  paused: { wake: 'RESUME', sleep: 'PAUSE', verb: 'pause' },
  hibernated: { wake: 'RESTORE', sleep: 'HIBERNATE', verb: 'hibernate' },
} as const;
/** What a VM's saved state may hold beyond its RAM (device state, video memory). */
const SNAPSHOT_OVERHEAD_MIB = 32;
/** The fields of a spec that a snapshot fixes: the machine its state loads into. */
const SNAPSHOT_FIXES = ['backend', 'image', 'toolkit', 'workspace', 'memoryMiB', 'cpu', 'diskMiB', 'display'] as const;

/** What a sandbox of `spec` takes from a node. */
function needOf(spec: SandboxSpec): Resources {
  return { cpu: spec.cpu, memoryMiB: spec.memoryMiB, sandboxes: 1, pids: spec.pidsLimit, diskMiB: diskMiBOf(spec) };
}

export class NodeHost {
  private readonly supervisor: Actor<typeof nodeMachine>;
  private readonly sandboxes = new Map<string, SandboxHost>();
  /** Creates under way, by sandbox id: one sent again waits for the first. */
  private readonly creating = new Map<string, Promise<CreateReply>>();
  private readonly subs: Subscription[] = [];
  private readonly timers: Array<() => void> = [];
  /** Creates admitted and waiting for a backend slot (CREATE_BEGIN), first come first served. */
  private readonly turns: Array<() => void> = [];
  private readonly clock: NodeClock;
  /** A watch is running (they must not overlap: each may take a hibernation per victim). */
  private reclaiming: boolean = false;
  private imageNames: string[] = [];
  /** Ended sandboxes whose final record did not reach the directory yet. */
  private readonly unwritten = new Map<string, SandboxHost>();
  private beatFailing = false;
  /** The revision of the node record this node last wrote: the next heartbeat is written at it. */
  private beatRevision?: number;
  /** Snapshots on this node's disk, by id (listed ones and forks' temporary ones). */
  private readonly snaps = new Map<string, HeldSnapshot>();
  /** Budget held for snapshots being written: each may take its VM's whole memory. */
  private snapReservedBytes = 0;

  constructor(private readonly deps: NodeHostDeps) {
    this.clock = deps.clock ?? realClock;
    const pools: Partial<Record<BackendKind, Resources>> = {};
    for (const b of deps.backends.all()) pools[b.kind] = b.capacity;
    this.supervisor = createActor(nodeMachine, { input: { pools, createConcurrency: deps.cfg.createConcurrency }, ...(deps.inspect ? { inspect: deps.inspect } : {}) });
  }

  get id(): string {
    return this.deps.cfg.nodeId;
  }

  get capacity(): Resources {
    return this.supervisor.getSnapshot().context.capacity;
  }

  private get log(): Logger {
    return this.deps.log;
  }

  async start(): Promise<void> {
    this.imageNames = await this.deps.images.list();
    // Started first: sandboxes taken up from the previous run are admitted like new ones.
    this.supervisor.start();
    await this.takeUpOrMark();
    await this.loadSnapshots();
    const { nc } = this.deps;
    const log = this.log;
    this.subs.push(serve(nc, subjects.node(this.id, 'create'), { log, nodeId: this.id, name: 'node.create', maxBytes: Limits.createBytesMax }, (req) => this.create(req.body)));
    this.subs.push(serve(nc, subjects.node(this.id, 'group'), { log, nodeId: this.id, name: 'node.group' }, (req) => this.group(req.body)));
    this.subs.push(serve(nc, subjects.node(this.id, 'info'), { log, nodeId: this.id, name: 'node.info' }, () => this.info()));
    this.subs.push(serve(nc, subjects.node(this.id, 'drain'), { log, nodeId: this.id, name: 'node.drain' }, (req) => this.drain(req.body)));
    this.subs.push(serve(nc, subjects.node(this.id, 'undrain'), { log, nodeId: this.id, name: 'node.undrain' }, () => this.setDraining(false)));
    this.subs.push(serve(nc, subjects.node(this.id, 'snapshots.delete'), { log, nodeId: this.id, name: 'node.snapshots.delete' }, (req) => this.deleteSnapshot(req.body)));
    await this.beat();
    this.timers.push(this.clock.every(this.deps.cfg.heartbeatMs, () => void this.beat()));
    this.timers.push(this.clock.every(this.deps.cfg.pressure.intervalMs, () => void this.watchMemory()));
  }

  /**
   * Directory records this node left live when it died. A sandbox its backend kept (recover) is
   * taken up under its id: a VM's state on disk hibernated, and woken if it was running; a
   * container whose processes ran on as it was (running, or paused or hibernated if it was asleep).
   * The rest did not survive, and their records say so.
   */
  private async takeUpOrMark(): Promise<void> {
    const { directory, nc } = this.deps;
    const now = this.clock.now();
    const kept = new Map(this.deps.backends.kept().map((k) => [k.id, k]));
    const wake: SandboxHost[] = [];
    for (const { key, value: info } of await scanKv<SandboxInfo>(directory)) {
      if (info.node !== this.id || info.state === 'stopped' || info.state === 'failed') continue;
      const k = kept.get(key);
      kept.delete(key);
      // A create or a kill under way when the node died: its caller got an error, or wanted it gone.
      if (k && k.kind === info.backend && info.state !== 'creating' && info.state !== 'stopping') {
        const h = await this.takeUp(key, k, info).catch((err: unknown) => {
          this.log.warn({ err, sandbox: key }, 'a sandbox kept across the restart could not be taken up');
          return undefined;
        });
        if (h) {
          // Ended at once (its ttl ran out while the node was away): the actor recorded how.
          if (h.state === 'hibernated' && WAKE_AFTER_RESTART.has(info.state)) wake.push(h);
          continue;
        }
      }
      if (k) await this.deps.backends.get(k.kind)?.backend.destroy(key).catch(() => {});
      const ended: SandboxInfo = { ...info, state: 'failed', reason: 'node_restarted', endedAt: now, error: { code: 'BACKEND_FAILED', message: `node ${this.id} restarted; the sandbox was lost`, retryable: false } };
      await directory.put(key, encode(ended));
      nc.publish(subjects.event(key, 'failed'), encode(ended));
    }
    // Kept, but the directory has them as no live sandbox of this node's: nobody could reach them.
    for (const k of kept.values()) await this.deps.backends.get(k.kind)?.backend.destroy(k.id).catch(() => {});
    if (this.sandboxes.size > 0) this.log.warn({ sandboxes: [...this.sandboxes.keys()], waking: wake.length }, 'took up sandboxes the previous run left (VMs hibernated, those that were running restored; containers as they were)');
    if (wake.length > 0) void this.wake(wake);
  }

  /**
   * A kept sandbox under an actor again, admitted as at its create. One kept frozen stays asleep
   * if its record says it was (paused or hibernated: both are a frozen cgroup for a container);
   * frozen with a record that says otherwise, the node died halfway through putting it to sleep,
   * and it is woken: its caller got an error.
   */
  private async takeUp(id: string, k: KeptSandbox & { kind: BackendKind }, info: SandboxInfo): Promise<SandboxHost> {
    const { kind, spec } = k;
    const open = this.deps.backends.for(kind, this.id);
    const admit = { type: 'ADMIT' as const, id, kind, need: needOf(spec) };
    if (!this.supervisor.getSnapshot().can(admit)) throw new Error(`no room: ${refusal(this.supervisor.getSnapshot().context, kind, admit.need) ?? 'refused'}`);
    let as: AdoptedState = 'hibernated';
    if (k.state === 'running') as = 'running';
    else if (k.state === 'frozen') {
      if (info.state === 'paused' || info.state === 'hibernated') as = info.state;
      else {
        await open.backend.resume(id);
        as = 'running';
      }
    }
    this.supervisor.send(admit);
    const sleepReason = as === 'running' ? undefined : k.state === 'frozen' ? info.sleepReason : 'node_restarted';
    const host = new SandboxHost(this.hostDeps(open.backend, { adopt: { createdAt: info.createdAt, expiresAt: info.expiresAt, as, ...(sleepReason ? { sleepReason } : {}) } }), id, spec);
    this.sandboxes.set(id, host);
    await host.start();
    return host;
  }

  /** Restores taken-up sandboxes that were running, two at a time (each is a VMM's start and a state's load). */
  private async wake(hosts: SandboxHost[]): Promise<void> {
    const limit = new Semaphore(2);
    await Promise.all(
      hosts.map((h) =>
        limit.run(async () => {
          if (h.state !== 'hibernated') return;
          await h.lifecycle({ type: 'RESTORE' }).then(
            () => this.log.info({ sandbox: h.id }, 'restored a sandbox taken up after the restart'),
            (err: unknown) => this.log.warn({ err, sandbox: h.id }, 'a sandbox taken up after the restart did not restore'),
          );
        }),
      ),
    );
  }

  /**
   * NATS is back after an outage: the node record at once (placement may have dropped the node),
   * then each sandbox's current record and event, live ones and those that ended meanwhile, since
   * the writes made while NATS was away failed.
   */
  async reconnected(): Promise<void> {
    await this.beat();
    const { written, failed } = await this.republish([...this.sandboxes.values(), ...this.unwritten.values()]);
    // JetStream may need a few seconds after a restart to read its store back: what fails now,
    // the heartbeat writes again (repair) until it gets in.
    this.log.info({ written, failed }, 're-published sandbox records after reconnect');
  }

  private async republish(hosts: SandboxHost[]): Promise<{ written: number; failed: number }> {
    const limit = new Semaphore(64);
    let written = 0;
    let failed = 0;
    await Promise.all(
      hosts.map((h) =>
        limit.run(async () => {
          if (await h.republish()) {
            written++;
            this.unwritten.delete(h.id);
          } else failed++;
        }),
      ),
    );
    return { written, failed };
  }

  /** Records the directory does not have right (their write failed): written again at each heartbeat. */
  private async repair(): Promise<void> {
    const stale = [...[...this.sandboxes.values()].filter((h) => h.stale), ...this.unwritten.values()];
    if (stale.length === 0) return;
    const r = await this.republish(stale);
    if (r.written > 0) this.log.info(r, 'directory records repaired');
  }

  record(): NodeRecord {
    const snap = this.supervisor.getSnapshot();
    const ctx = snap.context;
    const offers: Partial<Record<BackendKind, BackendOffer>> = {};
    for (const [kind, pool] of Object.entries(ctx.pools) as Array<[BackendKind, { capacity: Resources; allocated: Resources }]>) {
      offers[kind] = { capacity: pool.capacity, allocated: { ...pool.allocated } };
    }
    const fn = this.deps.fn;
    return {
      node: this.id,
      backends: this.deps.backends.kinds,
      offers,
      images: this.imageNames,
      store: this.deps.images.storeUrl,
      home: this.deps.cfg.home,
      placement: this.deps.cfg.placement,
      ...(fn ? { fn: fn.record(this.imageNames) } : {}),
      capacity: ctx.capacity,
      allocated: ctx.allocated,
      sandboxes: this.sandboxes.size + this.unadmitted(),
      migratable: [...this.sandboxes.values()].filter((h) => h.spec.migratable).length,
      heartbeatMs: this.deps.cfg.heartbeatMs,
      ts: this.clock.now(),
      state: admissionState(snap.value) === 'serving' ? 'serving' : 'draining',
    };
  }

  /**
   * Creates past the first refusal check but not yet admitted (their spec's images are being read):
   * counted as sandboxes in the record, so that a bridge draining this node does not take it for
   * empty and release it under them (their reads of the node's own store then failed with
   * ECONNRESET, UNAVAILABLE to the trainer, instead of the draining node's NO_CAPACITY that
   * placement takes elsewhere).
   */
  private unadmitted(): number {
    let n = 0;
    for (const id of this.creating.keys()) if (!this.sandboxes.has(id)) n++;
    return n;
  }

  private async info() {
    const mem = process.memoryUsage();
    const snapshots = { count: [...this.snaps.values()].filter((x) => !x.temporary).length, bytes: this.snapshotBytes(), budgetBytes: this.snapshotBudgetBytes };
    return { ...this.record(), ids: [...this.sandboxes.keys()], snapshots, creates: { running: this.supervisor.getSnapshot().context.creates.running, waiting: this.turns.length }, process: { heapUsedBytes: mem.heapUsed, rssBytes: mem.rss }, layers: await this.deps.images.stats(), ...(this.deps.fn ? { fnPools: this.deps.fn.stats(), fnImages: this.deps.fn.imageStates() } : {}) };
  }

  private async beat(): Promise<void> {
    try {
      // Images built while the node runs become placeable at the next beat.
      this.imageNames = await this.deps.images.list();
      await this.writeRecord();
      if (this.beatFailing) this.log.info('heartbeat written again');
      this.beatFailing = false;
    } catch (err) {
      // Once per outage: a node cut off from NATS would otherwise log every beat.
      if (!this.beatFailing) this.log.warn({ err: unavailable(err, 'the node table') }, 'heartbeat failed');
      this.beatFailing = true;
      return;
    }
    await this.repair();
  }

  /**
   * The heartbeat, written at the revision of the one before. A node that stalled (SIGSTOP, a
   * paused VM, a loop blocked for longer than `lostAfterMs`) keeps its NATS connection, so nothing
   * else tells it that a placement replica took it for lost meanwhile and marked its sandboxes
   * `failed` / `node_lost` while they ran on. The replica's mark is a write of this record: the
   * write here then fails, the record read back says `lostAt`, and every sandbox's true record
   * is written again. The replica marks each sandbox only at the revision it scanned, so a record
   * written back here is never overwritten by the mark.
   */
  private async writeRecord(): Promise<void> {
    const data = encode(this.record());
    const { nodes } = this.deps;
    if (this.beatRevision !== undefined) {
      try {
        this.beatRevision = await nodes.update(this.id, data, this.beatRevision);
        return;
      } catch (err) {
        // NATS away (the read fails too: the caller's outage path), or the record changed under
        // this node: a replica's mark, or this node's own last write that timed out but landed.
        const now = await nodes.get(this.id).catch(() => {
          throw err;
        });
        const was = now?.operation === 'PUT' ? (decode(now.value) as Partial<NodeRecord>) : undefined;
        this.beatRevision = await nodes.put(this.id, data);
        if (was?.lostAt !== undefined) await this.writtenBack(was.lostAt);
        return;
      }
    }
    this.beatRevision = await nodes.put(this.id, data);
  }

  private async writtenBack(lostAt: number): Promise<void> {
    this.log.warn({ lostAt, sandboxes: this.sandboxes.size }, 'this node was taken for lost while it stalled: writing its sandboxes back into the directory');
    const r = await this.republish([...this.sandboxes.values(), ...this.unwritten.values()]);
    this.log.info(r, 'sandbox records written back after the node was taken for lost');
  }

  /** Drain: the sandboxes keep running, no new ones come; the record says so at once, so placement skips the node. */
  /**
   * Cordons the node; with `migrate`, moves each sandbox created `migratable` to another node, one
   * at a time, before answering: its files as a snapshot (the image store carries it to any node),
   * a sandbox of its spec, labels and remaining TTL made from it through placement (which skips
   * this draining node), then the old one killed with reason `migrated` and `movedTo` in its final
   * record, which the SDK's handle follows. Its processes do not move: they start afresh there. A
   * sleeping one is woken for the copy and put back to sleep there. One that cannot move runs on
   * here, and the reply says why.
   */
  private async drain(body: unknown): Promise<DrainReply> {
    const { migrate } = validateDrain(body);
    const record = await this.setDraining(true);
    if (!migrate) return record;
    const migrated: Record<string, string> = {};
    const notMigrated: Record<string, string> = {};
    for (const h of [...this.sandboxes.values()]) {
      if (!h.spec.migratable || h.info.state === 'stopping' || h.info.state === 'stopped' || h.info.state === 'failed') continue;
      try {
        migrated[h.id] = await this.migrate(h);
      } catch (err) {
        const w = toWireError(err);
        notMigrated[h.id] = `${w.code}: ${w.message}`;
        this.log.warn({ sandbox: h.id, err }, 'a migratable sandbox could not move; it runs on here');
      }
    }
    return { ...(await this.setDraining(true)), migrated, notMigrated };
  }

  private async migrate(h: SandboxHost): Promise<string> {
    const asleep = h.info.state === 'paused' || h.info.state === 'hibernated' ? SLEEPS[h.info.state] : undefined;
    if (asleep) await h.lifecycle({ type: asleep.wake });
    if (h.info.state !== 'running') throw new ProtocolError('INVALID_STATE', `sandbox ${h.id} is ${h.info.state}`);
    await h.quiesce(MIGRATE_QUIESCE_MS);
    let snap: HeldSnapshot;
    try {
      snap = await this.takeSnapshot(h, false);
    } catch (err) {
      h.moving = false;
      throw err;
    }
    const { fromSnapshot: _, node: __, ...rest } = h.spec;
    const leftSec = Math.max(1, Math.ceil((h.info.expiresAt - this.clock.now()) / 1000));
    const spec: SandboxSpec = { ...rest, fromSnapshot: snap.info.id, ttlSec: Math.min(rest.ttlSec, leftSec) };
    let made: SandboxInfo;
    try {
      const m = await this.deps.nc.request(subjects.placeCreate, encode({ spec, timeoutMs: MIGRATE_CREATE_MS }), { timeout: MIGRATE_CREATE_MS + 5_000 });
      const r = decode(m.data) as Reply<CreateReply>;
      if (!r.ok) throw new ProtocolError(r.error.code, `no other node took it: ${r.error.message}`);
      made = r.result.sandbox;
    } catch (err) {
      await this.dropSnapshot(snap).catch(() => {});
      h.moving = false;
      if (asleep) await h.lifecycle({ type: asleep.sleep }).catch(() => {});
      throw err;
    }
    // As after a fork, the copy has what it needs; a record left here would outlive this node (a
    // bridge machine is given back once drained) with no one to delete it.
    await this.dropSnapshot(snap).catch((err: unknown) => this.log.warn({ err, snapshot: snap.info.id }, 'removing a migration snapshot failed'));
    if (asleep) {
      await this.deps.nc.request(subjects.sandbox(made.id, asleep.verb), encode({}), { timeout: 60_000 }).catch((err: unknown) => this.log.warn({ err, sandbox: made.id }, `the moved sandbox could not be put back to sleep`));
    }
    h.info.movedTo = made.id;
    await h.kill('migrated');
    this.log.info({ sandbox: h.id, movedTo: made.id, node: made.node, snapshot: snap.info.id }, 'sandbox moved to another node');
    return made.id;
  }

  private async setDraining(on: boolean): Promise<NodeRecord> {
    const st = admissionState(this.supervisor.getSnapshot().value);
    if (st === 'stopped') throw new ProtocolError('UNAVAILABLE', `node ${this.id} is stopping`);
    this.supervisor.send({ type: on ? 'DRAIN' : 'UNDRAIN' });
    if ((st === 'draining') !== on) this.log.info({ sandboxes: this.sandboxes.size }, on ? 'node draining' : 'node serving again');
    await this.beat();
    return this.record();
  }

  /**
   * A create is idempotent by its id: sent again (its answer was lost with a NATS server, or
   * placement tried again), it gets the answer of the first, or the record of the sandbox it made.
   */
  private create(body: unknown): Promise<CreateReply> {
    const b = validateCreate(body);
    const id = b.id ?? newSandboxId();
    const pending = this.creating.get(id);
    if (pending !== undefined) return pending;
    const had = this.sandboxes.get(id);
    if (had) return Promise.resolve({ sandbox: had.info });
    const p = this.createNew(id, b.spec);
    this.creating.set(id, p);
    return p.finally(() => this.creating.delete(id));
  }

  private async createNew(id: string, spec: SandboxSpec, from?: HeldSnapshot): Promise<CreateReply> {
    const snap = from ?? (spec.fromSnapshot === undefined ? undefined : await this.snapshotFor(spec));
    try {
      return await this.createFrom(id, spec, snap);
    } finally {
      // Fetched for this create alone: the sandbox has loaded it, or never will.
      const b = snap?.imported ? this.deps.backends.get(snap.info.backend)?.backend : undefined;
      if (snap && b && keepsSnapshots(b)) await b.deleteSnapshot(snap.name).catch(() => {});
    }
  }

  private async createFrom(id: string, spec: SandboxSpec, snap: HeldSnapshot | undefined): Promise<CreateReply> {
    const open = this.deps.backends.for(spec.backend, this.id);

    // Refused before the spec's images are looked up: a trainer's creates past capacity cost the node little.
    const refused = this.refusalFor(spec, open.capacity);
    if (refused !== undefined) throw new ProtocolError('NO_CAPACITY', refused);
    const admit = { type: 'ADMIT' as const, id, kind: spec.backend, need: needOf(spec) };
    await open.checkSpec(spec);
    this.admissible(admit);
    this.supervisor.send(admit);

    const host = new SandboxHost(this.hostDeps(open.backend, snap ? { restoreFrom: snap.name } : {}), id, spec);
    this.sandboxes.set(id, host);
    // Creates beyond a few at once only slow each other down (2 cores share mount and crun work):
    // queueing them keeps the same throughput and gives early callers an early answer.
    const info = await this.createInTurn(() => host.start());
    if (info.state === 'failed') {
      const e = info.error;
      throw new ProtocolError(e?.code ?? 'BACKEND_FAILED', `create failed: ${e?.message ?? 'unknown error'}`);
    }
    return { sandbox: info };
  }

  private hostDeps(backend: Backend, extra: Pick<SandboxHostDeps, 'restoreFrom' | 'adopt'>): SandboxHostDeps {
    return {
      nc: this.deps.nc,
      backend,
      directory: this.deps.directory,
      nodeId: this.id,
      log: this.log,
      maxOutputBytes: this.deps.cfg.maxOutputBytes,
      ...(this.deps.cfg.streamBufferBytes !== undefined ? { streamBufferBytes: this.deps.cfg.streamBufferBytes } : {}),
      ...(this.deps.cfg.processBufferBytes !== undefined ? { processBufferBytes: this.deps.cfg.processBufferBytes } : {}),
      maxPayload: this.deps.nc.info?.max_payload ?? 1024 * 1024,
      journal: this.deps.journal,
      ...(this.deps.inspect ? { inspect: this.deps.inspect } : {}),
      ...extra,
      snapshots: this.snapshotService,
      onFinal: (h) => {
        this.sandboxes.delete(h.id);
        this.supervisor.send({ type: 'RELEASE', id: h.id });
        // An end whose record could not be written (NATS away) is written after the reconnect.
        void h.written().then((ok) => {
          if (!ok) this.unwritten.set(h.id, h);
        });
      },
    };
  }

  /**
   * Runs a backend create once the machine grants it a slot. A finished create hands its slot
   * straight to the longest waiting one, so a newcomer cannot overtake the queue.
   */
  private async createInTurn<T>(start: () => Promise<T>): Promise<T> {
    const begin = { type: 'CREATE_BEGIN' } as const;
    if (this.supervisor.getSnapshot().can(begin)) this.supervisor.send(begin);
    else await new Promise<void>((r) => this.turns.push(r));
    try {
      return await start();
    } finally {
      const next = this.turns.shift();
      if (next) next();
      else this.supervisor.send({ type: 'CREATE_END' });
    }
  }

  /**
   * Why this node would refuse `spec` now (NO_CAPACITY's message), or undefined when it would try:
   * the placement replica in the same process asks here instead of over NATS, the same checks
   * `create` makes first. A burst of creates past capacity was two hops a refusal, and the node's
   * own sandboxes' requests queued behind them on its one thread.
   */
  refusalFor(spec: SandboxSpec, fallback?: Resources): string | undefined {
    const ctx = this.supervisor.getSnapshot().context;
    const capacity = ctx.pools[spec.backend]?.capacity ?? fallback;
    if (!capacity) return undefined;
    const need = needOf(spec);
    const never = refusal({ ...ctx, pools: { [spec.backend]: { capacity, allocated: { cpu: 0, memoryMiB: 0, sandboxes: 0 } } } }, spec.backend, need);
    if (never) return `node ${this.id} can never hold this sandbox: ${never}`;
    return this.admissionRefusal({ type: 'ADMIT', id: '-', kind: spec.backend, need });
  }

  /** Why the supervisor would not admit this now, or undefined. */
  private admissionRefusal(admit: { type: 'ADMIT'; id: string; kind: BackendKind; need: Resources }): string | undefined {
    const snap = this.supervisor.getSnapshot();
    if (admissionState(snap.value) !== 'serving') return `node ${this.id} is draining`;
    if (!snap.can(admit)) return `node ${this.id} is full: ${refusal(snap.context, admit.kind, admit.need) ?? 'refused'}`;
    return undefined;
  }

  /** NO_CAPACITY unless the supervisor would admit this now. */
  private admissible(admit: { type: 'ADMIT'; id: string; kind: BackendKind; need: Resources }): void {
    const why = this.admissionRefusal(admit);
    if (why !== undefined) throw new ProtocolError('NO_CAPACITY', why);
  }

  // ─── snapshots ────────────────────────────────────────────────────────────────────────────

  private get snapshotBudgetBytes(): number {
    return (this.deps.snapshotBudgetMiB ?? Limits.snapshotBudgetMiB.default) * MiB;
  }

  /** Bytes the snapshots on this node's disk take. */
  private snapshotBytes(): number {
    let n = 0;
    for (const s of this.snaps.values()) n += s.info.bytes;
    return n;
  }

  /** The snapshot a create asks for, on this node, of the machine the spec asks for; else NOT_FOUND or INVALID_SPEC. */
  private async snapshotFor(spec: SandboxSpec): Promise<HeldSnapshot> {
    const id = spec.fromSnapshot as string;
    let held = this.snaps.get(id);
    // A snapshot of a container's files is an image in the store: any node that reads it can start
    // from it; another node's VM snapshot whose state is in the store is fetched for this create.
    if (!held) held = await this.storedSnapshot(id);
    if (!held || (held.temporary && !held.imported)) throw new ProtocolError('NOT_FOUND', `no snapshot ${id} on node ${this.id}`, { detail: { snapshot: id, node: this.id } });
    const want = snapshotSpec(held.info);
    for (const f of SNAPSHOT_FIXES) {
      // Only a VM's state needs the machine it was taken of; a container's files fit any size.
      if (held.info.backend === 'container' && (f === 'memoryMiB' || f === 'cpu' || f === 'diskMiB')) continue;
      const got = f === 'diskMiB' ? diskMiBOf(spec) : spec[f];
      if (JSON.stringify(got) !== JSON.stringify(want[f])) throw new ProtocolError('INVALID_SPEC', `${f}: snapshot ${id} was taken of a sandbox with ${f} ${JSON.stringify(want[f])}, not ${JSON.stringify(got)}`, { detail: { field: f } });
    }
    return held;
  }

  /**
   * Another node's snapshot, from the snapshot table: a container's files (an image in the store),
   * or a VM's state in the store, fetched to this node's disk under a name of its own.
   */
  private async storedSnapshot(id: string): Promise<HeldSnapshot | undefined> {
    const e = await this.deps.snapshots?.get(id).catch((err: unknown) => {
      throw unavailable(err, 'the snapshot table');
    });
    if (e?.operation !== 'PUT') return undefined;
    const info = decode(e.value) as SnapshotInfo;
    if (info.backend === 'container') return { info, name: info.id };
    const b = this.deps.backends.get(info.backend)?.backend;
    if (!info.state || !b || !movesSnapshots(b)) return undefined;
    const name = `imp-${info.id}-${randomBytes(4).toString('hex')}`;
    await b.importSnapshot(name, info.state);
    this.log.info({ snapshot: id, from: info.node, bytes: info.state.size }, 'VM snapshot fetched from the image store');
    return { info, name, temporary: true, imported: true };
  }

  /** The snapshot and fork verbs of this node's sandboxes. */
  private readonly snapshotService: SandboxSnapshots = {
    snapshot: async (h) => (await this.takeSnapshot(h, false)).info,
    fork: (h, req) => this.fork(h, req),
  };

  /**
   * Saves a sandbox's state within the node's snapshot budget. Until its size is known it holds
   * its VM's whole memory of the budget, so snapshots written at once cannot overrun it together.
   */
  private async takeSnapshot(h: SandboxHost, temporary: boolean): Promise<HeldSnapshot> {
    const backend = this.deps.backends.for(h.spec.backend, this.id).backend;
    if (!canSnapshot(backend)) throw new ProtocolError('INVALID_REQUEST', `backend ${h.spec.backend} cannot 'snapshot' (it lacks the snapshot capability)`);
    const budget = this.snapshotBudgetBytes;
    const reserve = (h.spec.memoryMiB + SNAPSHOT_OVERHEAD_MIB) * MiB;
    this.withinBudget(h.id, reserve);
    const spec = h.spec;
    const info: SnapshotInfo = {
      id: newSnapshotId(),
      node: this.id,
      backend: spec.backend,
      image: spec.image,
      ...(spec.toolkit ? { toolkit: spec.toolkit } : {}),
      ...(spec.workspace ? { workspace: spec.workspace } : {}),
      ...(spec.display ? { display: spec.display } : {}),
      memoryMiB: spec.memoryMiB,
      cpu: spec.cpu,
      diskMiB: diskMiBOf(spec),
      from: h.id,
      bytes: 0,
      createdAt: this.clock.now(),
    };
    this.snapReservedBytes += reserve;
    let held: HeldSnapshot;
    try {
      const r = await backend.snapshot(h.id, { name: info.id, meta: { info, ...(temporary ? { temporary: true } : {}) }, local: temporary });
      info.bytes = r.bytes;
      held = { info, name: r.snapshot, ...(temporary ? { temporary: true } : {}) };
    } finally {
      this.snapReservedBytes -= reserve;
    }
    this.snaps.set(info.id, held);
    if (this.snapshotBytes() + this.snapReservedBytes > budget) {
      // Larger than its VM's memory (video memory, say): it would overrun the budget, so it goes.
      await this.dropSnapshot(held);
      throw this.overBudget(h.id, info.bytes);
    }
    // A VM's state into the image store as well, after the VM runs on: any node of the same
    // machine can start from it, and a migratable VM moves through it. Without it, it stays here.
    if (!temporary && movesSnapshots(backend)) {
      try {
        info.state = await backend.exportSnapshot(held.name);
      } catch (err) {
        this.log.warn({ err, snapshot: info.id }, 'a VM snapshot could not be copied to the image store: only this node can start from it');
      }
    }
    if (!temporary && this.deps.snapshots) {
      try {
        await this.deps.snapshots.put(info.id, encode(info));
      } catch (err) {
        // Unlisted, no one could find or delete it: it goes.
        await this.dropSnapshot(held).catch(() => {});
        throw unavailable(err, 'the snapshot table');
      }
    }
    this.log.info({ sandbox: h.id, snapshot: info.id, bytes: info.bytes, temporary }, 'snapshot taken');
    return held;
  }

  /** NO_CAPACITY unless `bytes` more fit the node's snapshot budget. */
  private withinBudget(from: string, bytes: number): void {
    if (this.snapshotBytes() + this.snapReservedBytes + bytes > this.snapshotBudgetBytes) throw this.overBudget(from, bytes);
  }

  private overBudget(from: string, bytes: number): ProtocolError {
    const budget = this.snapshotBudgetBytes;
    const used = this.snapshotBytes() + this.snapReservedBytes;
    const mib = (b: number) => Math.ceil(b / MiB);
    return new ProtocolError(
      'NO_CAPACITY',
      `node ${this.id}'s snapshot budget is full: ${mib(used)} of ${mib(budget)} MiB are taken (PADDOCK_SNAPSHOT_BUDGET_MIB), and a snapshot of ${from} may need ${mib(bytes)} MiB: delete snapshots (pdk.snapshots.delete) first`,
      { detail: { reason: 'snapshot_budget', node: this.id, usedMiB: mib(used), budgetMiB: mib(budget), needMiB: mib(bytes) } },
    );
  }

  /** Removes a snapshot's files, then its record. */
  private async dropSnapshot(held: HeldSnapshot): Promise<void> {
    const b = this.deps.backends.get(held.info.backend)?.backend;
    if (b && keepsSnapshots(b)) await b.deleteSnapshot(held.name);
    this.snaps.delete(held.info.id);
    if (!held.temporary) await this.deps.snapshots?.delete(held.info.id);
  }

  /** `pdk.v1.node.<node>.snapshots.delete`: idempotent; `deleted` says whether this node had it. */
  private async deleteSnapshot(body: unknown): Promise<SnapshotsDeleteReply> {
    const { id } = check(Schema.SnapshotsDeleteRequest, body, 'INVALID_REQUEST', 'snapshots.delete');
    const held = this.snaps.get(id);
    if (!held || held.temporary) {
      // A record this node no longer backs (its files went with a disk, say): the record goes too.
      const e = await this.deps.snapshots?.get(id).catch(() => null);
      if (e?.operation === 'PUT' && (decode(e.value) as SnapshotInfo).node === this.id) await this.deps.snapshots?.delete(id);
      return { deleted: false };
    }
    await this.dropSnapshot(held);
    this.log.info({ snapshot: id }, 'snapshot deleted');
    return { deleted: true };
  }

  /**
   * The snapshots a previous run of this node left on its disk are kept and listed again; a fork's
   * temporary one, and records of snapshots whose files are gone, are removed.
   */
  private async loadSnapshots(): Promise<void> {
    const kv = this.deps.snapshots;
    const records = new Map(kv ? (await scanKv<SnapshotInfo>(kv)).map((e) => [e.key, e.value] as const) : []);
    for (const { backend } of this.deps.backends.all()) {
      if (!keepsSnapshots(backend)) continue;
      for (const s of await backend.listSnapshots()) {
        const m = s.meta as { info?: SnapshotInfo; temporary?: boolean } | undefined;
        if (!m?.info || m.temporary || m.info.node !== this.id) {
          await backend.deleteSnapshot(s.snapshot);
          continue;
        }
        // Its copy in the image store was made after the files (and their meta) were written.
        const state = records.get(m.info.id)?.state;
        this.snaps.set(m.info.id, { info: { ...m.info, bytes: s.bytes, ...(state ? { state } : {}) }, name: s.snapshot });
      }
    }
    if (!kv) return;
    for (const [key, value] of records) {
      if (value.node === this.id && !this.snaps.has(key)) await kv.delete(key);
    }
    for (const s of this.snaps.values()) await kv.put(s.info.id, encode(s.info));
    if (this.snaps.size > 0) this.log.info({ snapshots: this.snaps.size, bytes: this.snapshotBytes() }, 'snapshots of a previous run kept');
  }

  /**
   * `count` copies of a running sandbox from one snapshot of it, each through the node's admission
   * and create path. All or none: when one cannot be made, those made are killed.
   */
  private async fork(h: SandboxHost, req: ForkRequest): Promise<ForkReply> {
    const count = req.count ?? 1;
    const { fromSnapshot: _, ...parent } = h.spec;
    const spec: SandboxSpec = { ...parent, labels: req.labels ?? parent.labels, ttlSec: req.ttlSec ?? parent.ttlSec };
    if (req.group !== undefined) spec.group = req.group;
    // Room for all of them first: a snapshot no copy could use costs seconds and disk.
    const need = needOf(spec);
    const all: Resources = { cpu: need.cpu * count, memoryMiB: need.memoryMiB * count, sandboxes: count, ...(need.pids !== undefined ? { pids: need.pids * count } : {}), ...(need.diskMiB !== undefined ? { diskMiB: need.diskMiB * count } : {}) };
    const why = this.admissionRefusal({ type: 'ADMIT', id: '-', kind: spec.backend, need: all });
    if (why !== undefined) throw new ProtocolError('NO_CAPACITY', `cannot fork ${h.id} into ${count}: ${why}`, { detail: { count } });
    const snap = await this.takeSnapshot(h, true);
    let results: Array<PromiseSettledResult<CreateReply>>;
    try {
      results = await Promise.allSettled(Array.from({ length: count }, () => this.createNew(newSandboxId(), { ...spec }, snap)));
    } finally {
      await this.dropSnapshot(snap).catch((err: unknown) => this.log.warn({ err, snapshot: snap.info.id }, 'removing a fork snapshot failed'));
    }
    const made = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value.sandbox] : []));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (!failed) return { sandboxes: made };
    await Promise.allSettled(made.map((info) => this.sandboxes.get(info.id)?.kill('killed')));
    const e = failed.reason as Error;
    const code = e instanceof ProtocolError ? e.code : 'BACKEND_FAILED';
    throw new ProtocolError(code, `fork of ${h.id} into ${count} failed, the ${made.length} made were killed: ${e.message}`, { detail: { count, made: made.length, ...(e instanceof ProtocolError ? e.detail : {}) } });
  }

  /** A sandbox whose init died: it fails at once (reason crashed). */
  crashed(id: string, why: string): void {
    this.sandboxes.get(id)?.crashed(why);
  }

  /** Applies a group verb to this node's sandboxes of `group`, many at once; a summary per sandbox. */
  private async group(body: unknown): Promise<NodeGroupReply> {
    const b = validateNodeGroup(body);
    const verb = b.verb;
    const members = [...this.sandboxes.values()].filter((h) => h.spec.group === b.group);
    const failed: NodeGroupReply['failed'] = [];
    let ok = 0;
    let releasedBytes = 0;
    const limit = new Semaphore(64);
    await Promise.all(
      members.map((h) =>
        limit.run(async () => {
          try {
            // Not `releasedBytes += await …`: that reads the sum before the await, and the
            // sandboxes running beside this one would each add to a stale sum.
            const bytes = await applyGroupVerb(h, verb);
            releasedBytes += bytes;
            ok++;
          } catch (err) {
            const w = toWireError(err);
            failed.push({ id: h.id, node: this.id, code: w.code, message: w.message });
          }
        }),
      ),
    );
    return { total: members.length, ok, failed, releasedBytes };
  }

  /** One reading of the memory gauge; under pressure, hibernate idle best-effort sandboxes one by one. */
  private async watchMemory(): Promise<void> {
    if (this.reclaiming) return;
    this.reclaiming = true;
    const read = this.deps.readMemory ?? readMemory;
    const cfg = this.deps.cfg.pressure;
    try {
      let reading = await read();
      const verdict = judge(reading, cfg);
      const was = underPressure(this.supervisor.getSnapshot().value);
      if (verdict === 'pressure' && !was) {
        this.supervisor.send({ type: 'PRESSURE', reading: describe(reading) });
        this.log.warn({ memory: reading }, 'memory pressure: hibernating idle best-effort sandboxes');
      } else if (verdict === 'relieved' && was) {
        this.supervisor.send({ type: 'RELIEVED' });
        this.log.info({ memory: reading }, 'memory pressure relieved');
      }
      if (!underPressure(this.supervisor.getSnapshot().value)) return;
      const now = this.clock.now();
      const victims = pickVictims(
        [...this.sandboxes.values()].map((h) => ({ id: h.id, qos: h.spec.qos, state: h.state, idleSince: h.idleSince() })),
        now,
        cfg.minIdleMs,
      );
      for (const id of victims) {
        const h = this.sandboxes.get(id);
        if (!h) continue;
        await tracer.startActiveSpan('node.pressure.hibernate', { attributes: { [Attr.sandboxId]: id, [Attr.nodeId]: this.id, [Attr.backend]: h.spec.backend, 'paddock.node.memory': describe(reading), 'paddock.sandbox.idle_ms': now - h.idleSince() } }, async (span) => {
          try {
            const info = await h.lifecycle({ type: 'HIBERNATE', why: 'pressure' });
            this.log.warn({ sandbox: id, idleMs: now - h.idleSince(), released: info.released, memory: reading }, 'hibernated under memory pressure');
          } catch (err) {
            this.log.warn({ err, sandbox: id }, 'could not hibernate under pressure');
          } finally {
            span.end();
          }
        });
        reading = await read();
        if (judge(reading, cfg) !== 'pressure') break;
      }
    } catch (err) {
      this.log.warn({ err }, 'memory watch failed');
    } finally {
      this.reclaiming = false;
    }
  }

  /**
   * Stops serving and kills every sandbox (nothing is left behind) unless `keepSandboxes`; removes
   * the node record. What the host was handed (backends, images, log, connection) its owner closes.
   */
  async stop(opts: { keepSandboxes?: boolean } = {}): Promise<void> {
    for (const stop of this.timers.splice(0)) stop();
    this.supervisor.send({ type: 'DRAIN' });
    for (const s of this.subs.splice(0)) s.unsubscribe();
    if (!opts.keepSandboxes) await Promise.allSettled([...this.sandboxes.values()].map((s) => s.kill('killed')));
    await this.deps.nodes.delete(this.id).catch(() => {});
    this.supervisor.send({ type: 'STOP' });
  }
}

/**
 * A group verb on one sandbox; already being where the verb leads counts as done. The memory a
 * hibernation gave back (0 for the other verbs, and for a sandbox that was already asleep).
 */
async function applyGroupVerb(h: SandboxHost, verb: GroupVerb): Promise<number> {
  const st = h.state;
  switch (verb) {
    case 'kill':
      await h.kill('killed');
      return 0;
    case 'pause':
      if (st === 'paused' || st === 'hibernated') return 0;
      await h.lifecycle({ type: 'PAUSE', why: 'group' });
      return 0;
    case 'hibernate':
      if (st === 'hibernated') return 0;
      return (await h.lifecycle({ type: 'HIBERNATE', why: 'group' })).released?.bytes ?? 0;
    case 'resume':
    case 'restore':
      if (st === 'running') return 0;
      await h.lifecycle({ type: st === 'hibernated' ? 'RESTORE' : 'RESUME' });
      return 0;
  }
}

/** The spec fields a snapshot fixes, as its record has them. */
function snapshotSpec(s: SnapshotInfo): Pick<SandboxSpec, (typeof SNAPSHOT_FIXES)[number]> {
  return { backend: s.backend, image: s.image, toolkit: s.toolkit, workspace: s.workspace, memoryMiB: s.memoryMiB, cpu: s.cpu, diskMiB: s.diskMiB, display: s.display };
}
