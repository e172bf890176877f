/**
 * Binds the bridge machine to NATS and to a provider. Every replica listens to demand
 * (`pdk.v1.bridge.demand`) and the node table (`pdk_nodes`); one leads at a time, holding the
 * `leader` key of the `pdk_bridge` KV bucket (compare-and-set on its revision, renewed every third
 * of the lease). The leader adopts what the provider lists under its tag, feeds the machine an
 * observation four times a second, carries out its effects, publishes whether capacity can come
 * (`pdk.v1.bridge.state`) and each decision (`pdk.v1.bridge.decision`), and answers
 * `pdk.v1.bridge.status`.
 */
import type { KV } from '@nats-io/kv';
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { type Actor, createActor, type InspectionEvent } from 'xstate';
import { Buckets, type DrainReply, decode, encode, ensureBucket, type FewerReplicas, fewerReplicasWarning, type NodeRecord, ProtocolError, type Reply, replicasFor, subjects } from '../protocol/index.ts';
import { traceHeaders } from '../protocol/trace.ts';
import { type BridgeContext, bridgeMachine, canProvision, type Decision, type Demand, type NodeView, type Policy } from './machine.ts';
import type { Provider } from './provider.ts';

export interface BridgeOptions {
  nc: NatsConnection;
  provider: Provider;
  policy: Policy;
  log: Logger;
  /** The NATS machines' nodes join. */
  natsUrl: string;
  /** This replica's name in the lease. */
  owner: string;
  /** Machines carry `paddock-bridge=<tag>`: the tag of this cluster's bridge. */
  tag?: string;
  leaseMs?: number;
  tickMs?: number;
  /** Sees every transition of the bridge's machine (ops hands in the node's transition inspector: a span event and a debug line each). */
  inspect?: (ev: InspectionEvent) => void;
}

/** A placement replica that has not said what waits for this long has stopped waiting. */
const DEMAND_STALE_MS = 2000;
/** A drain answers once its node has moved every migratable sandbox elsewhere: each move takes seconds. */
const DRAIN_TIMEOUT_MS = 10 * 60_000;

export interface BridgeStatus {
  leader: string | null;
  self: string;
  phase: string;
  canProvision: boolean;
  reason?: string;
  demand: Demand;
  machines: { id: string; state: string; ageMs: number; sinceMs: number }[];
  started: number;
  failures: number;
  provider: Record<string, unknown>;
  decisions: Decision[];
}

function isLive(r: NodeRecord, now: number): boolean {
  return now - r.ts < Math.max(3 * r.heartbeatMs, 5000);
}

export class BridgeHost {
  private readonly subs: Subscription[] = [];
  private readonly demand = new Map<string, { ts: number; kinds: Record<string, Demand> }>();
  private readonly nodes = new Map<string, NodeRecord>();
  private readonly decisions: Decision[] = [];
  private kv?: KV;
  private stopWatch?: () => void;
  private leaseTimer?: NodeJS.Timeout;
  private tickTimer?: NodeJS.Timeout;
  private stateTimer?: NodeJS.Timeout;
  private revision = 0;
  private actor?: Actor<typeof bridgeMachine>;
  private statusSub?: Subscription;
  private leaderName: string | null = null;
  private stopped = false;
  readonly tag: string;
  private readonly leaseMs: number;

  constructor(private readonly o: BridgeOptions) {
    this.tag = o.tag ?? 'default';
    this.leaseMs = o.leaseMs ?? 3000;
  }

  get leading(): boolean {
    return this.actor !== undefined;
  }

  async start(): Promise<void> {
    const replicas = replicasFor(this.o.nc.info);
    const fewer = (f: FewerReplicas) => this.o.log.warn({ ...f }, fewerReplicasWarning(f));
    this.kv = await ensureBucket(this.o.nc, Buckets.bridge, { history: 1, replicas }, fewer);
    const nodes = await ensureBucket(this.o.nc, Buckets.nodes, { history: 1, replicas }, fewer);
    const watch = await nodes.watch({ key: '>' });
    this.stopWatch = () => watch.stop();
    void (async () => {
      for await (const e of watch) {
        if (e.operation === 'PUT') {
          try {
            this.nodes.set(e.key, decode(e.value) as NodeRecord);
          } catch {}
        } else this.nodes.delete(e.key);
      }
    })();
    this.subs.push(
      this.o.nc.subscribe(subjects.bridgeDemand, {
        callback: (_e, m) => {
          try {
            const d = decode(m.data) as { replica: string; ts: number; kinds: Record<string, Demand> };
            this.demand.set(d.replica, { ts: Date.now(), kinds: d.kinds });
          } catch {}
        },
      }),
    );
    await this.lease();
    this.leaseTimer = setInterval(() => void this.lease(), Math.max(100, Math.floor(this.leaseMs / 3)));
  }

  /** Takes the lease when it is free or expired, renews it while held, and gives leadership up when a renewal loses. */
  private async lease(): Promise<void> {
    const kv = this.kv;
    if (!kv || this.stopped) return;
    const value = encode({ owner: this.o.owner, ts: Date.now() });
    try {
      if (this.leading) {
        this.revision = await kv.update('leader', value, this.revision);
        return;
      }
      const e = await kv.get('leader');
      if (!e || e.operation !== 'PUT') {
        this.revision = e ? await kv.update('leader', value, e.revision) : await kv.create('leader', value);
      } else {
        const held = decode(e.value) as { owner: string; ts: number };
        this.leaderName = held.owner;
        if (held.owner !== this.o.owner && Date.now() - held.ts < this.leaseMs) return;
        this.revision = await kv.update('leader', value, e.revision);
      }
      await this.lead();
    } catch (err) {
      if (this.leading) {
        this.o.log.warn({ err }, 'bridge lease lost: no longer leading');
        this.follow();
      }
    }
  }

  private observedDemand(now: number): Demand {
    const d: Demand = { count: 0, cpu: 0, memoryMiB: 0 };
    for (const [replica, v] of this.demand) {
      if (now - v.ts > DEMAND_STALE_MS) {
        this.demand.delete(replica);
        continue;
      }
      for (const k of Object.values(v.kinds)) {
        d.count += k.count;
        d.cpu += k.cpu;
        d.memoryMiB += k.memoryMiB;
      }
    }
    return d;
  }

  private observedNodes(now: number): Record<string, NodeView> {
    const out: Record<string, NodeView> = {};
    for (const [id, r] of this.nodes) out[id] = { live: isLive(r, now), state: r.state === 'serving' ? 'serving' : 'draining', sandboxes: r.sandboxes, migratable: r.migratable ?? 0, free: r.capacity.sandboxes - r.allocated.sandboxes };
    return out;
  }

  private async lead(): Promise<void> {
    this.leaderName = this.o.owner;
    this.o.log.info({ owner: this.o.owner }, 'bridge leading');
    const actor = createActor(
      bridgeMachine.provide({
        actions: {
          provision: (_, p) => void this.provision(p.id),
          drain: (_, p) => void this.drain(p.id),
          release: (_, p) => void this.release(p.id, p.why),
          decide: (_, d) => this.decide(d),
        },
      }),
      { input: { policy: this.o.policy, prefix: `${this.tag}-m${Date.now().toString(36)}-` }, ...(this.o.inspect ? { inspect: this.o.inspect } : {}) },
    );
    this.actor = actor;
    actor.start();
    // What an earlier leader started is ours now: adopted, not started again, not leaked.
    const mine = await this.o.provider.list({ 'paddock-bridge': this.tag }).catch((err: unknown) => {
      this.o.log.error({ err }, 'provider list failed');
      return [];
    });
    if (this.actor !== actor) return;
    // One whose start was cut short by the end of the earlier leader goes back at once.
    for (const m of mine.filter((x) => x.gone)) {
      this.decide({ ts: Date.now(), action: 'release', reason: 'listed by the provider but running nothing: its start was cut short', machines: [m.id] });
      void this.o.provider.release(m.id).catch((err: unknown) => this.o.log.error({ err, machine: m.id }, 'release failed'));
    }
    const live = mine.filter((x) => !x.gone);
    actor.send({ type: 'ADOPT', machines: live.map((m) => ({ id: m.id, createdAt: m.createdAt })), now: Date.now() });
    this.tickTimer = setInterval(() => this.tick(), this.o.tickMs ?? 250);
    this.stateTimer = setInterval(() => this.publishState(), 1000);
    this.statusSub = this.o.nc.subscribe(subjects.bridgeStatus, { callback: (_e, m) => {
        try {
          m.respond(encode({ ok: true, result: this.status() }));
        } catch (err) {
          this.o.log.error({ err }, 'bridge status failed');
          m.respond(encode({ ok: false, error: { code: 'INTERNAL', message: (err as Error).message, retryable: true } }));
        }
      },
    });
    this.tick();
  }

  private follow(): void {
    this.actor?.stop();
    this.actor = undefined;
    clearInterval(this.tickTimer);
    clearInterval(this.stateTimer);
    this.statusSub?.unsubscribe();
    this.statusSub = undefined;
  }

  private lastOk?: boolean;

  private tick(): void {
    const now = Date.now();
    this.actor?.send({ type: 'OBSERVE', now, demand: this.observedDemand(now), nodes: this.observedNodes(now) });
    const ok = this.can().ok;
    // A change (capacity can no longer come) reaches the waiting creates at once, not at the next second.
    if (ok !== this.lastOk) this.publishState();
  }

  private can(): { ok: boolean; reason?: string } {
    const ctx = this.actor?.getSnapshot().context;
    return ctx ? canProvision(ctx) : { ok: false, reason: 'no bridge leads' };
  }

  private publishState(): void {
    if (!this.actor) return;
    const c = this.can();
    this.lastOk = c.ok;
    this.o.nc.publish(subjects.bridgeState, encode({ leader: this.o.owner, ts: Date.now(), canProvision: c.ok, ...(c.reason ? { reason: c.reason } : {}) }));
  }

  private decide(d: Decision): void {
    this.decisions.push(d);
    if (this.decisions.length > 50) this.decisions.shift();
    this.o.log.info({ decision: d.action, machines: d.machines, reason: d.reason }, `bridge: ${d.action}`);
    this.o.nc.publish(subjects.bridgeDecision, encode({ ...d, leader: this.o.owner }), { headers: traceHeaders() });
    // The state follows the decision: a provider failure must reach the waiting creates now.
    queueMicrotask(() => this.publishState());
  }

  private readonly provisioning = new Set<Promise<void>>();

  private provision(id: string): Promise<void> {
    const p = this.provisionOne(id);
    this.provisioning.add(p);
    return p.finally(() => this.provisioning.delete(p));
  }

  private async provisionOne(id: string): Promise<void> {
    const actor = this.actor;
    try {
      await this.o.provider.provision({ id, shape: this.o.policy.shape, tags: { 'paddock-bridge': this.tag }, natsUrl: this.o.natsUrl });
      actor?.send({ type: 'PROVISIONED', id, now: Date.now() });
    } catch (err) {
      this.o.log.warn({ err, machine: id }, 'provision failed');
      actor?.send({ type: 'PROVISION_FAILED', id, reason: (err as Error).message, now: Date.now() });
    }
  }

  /** Cordons the machine's node and has it move its migratable sandboxes elsewhere; the others finish there. */
  private async drain(id: string): Promise<void> {
    const actor = this.actor;
    try {
      const m = await this.o.nc.request(subjects.node(id, 'drain'), encode({ migrate: true }), { timeout: DRAIN_TIMEOUT_MS, headers: traceHeaders() });
      const r = decode(m.data) as Reply<DrainReply>;
      if (!r.ok) throw new ProtocolError(r.error.code, r.error.message);
      const moved = Object.keys(r.result.migrated ?? {}).length;
      const stayed = r.result.notMigrated ?? {};
      if (moved > 0 || Object.keys(stayed).length > 0) this.o.log.info({ machine: id, moved: r.result.migrated, stayed }, `drain moved ${moved} sandbox(es) off the machine`);
      const [first] = Object.entries(stayed);
      if (first) {
        // They run on there: the machine serves again rather than wait, cordoned, for them to end.
        await this.o.nc.request(subjects.node(id, 'undrain'), encode({}), { timeout: 5000, headers: traceHeaders() });
        actor?.send({ type: 'DRAIN_INCOMPLETE', id, reason: `${Object.keys(stayed).length} stayed; ${first[0]}: ${first[1]}`, now: Date.now() });
      }
    } catch (err) {
      // A node that does not answer is gone or going: the release that follows settles it.
      this.o.log.warn({ err, machine: id }, 'drain request failed');
    }
  }

  private async release(id: string, why: string): Promise<void> {
    const actor = this.actor;
    for (let attempt = 0; ; attempt++) {
      try {
        await this.o.provider.release(id);
        break;
      } catch (err) {
        this.o.log.error({ err, machine: id, why }, 'release failed; trying again');
        if (attempt >= 5 || this.stopped) break;
        await new Promise((r) => setTimeout(r, 1000 * (attempt + 1)));
      }
    }
    actor?.send({ type: 'RELEASED', id, now: Date.now() });
  }

  status(): BridgeStatus {
    const snap = this.actor?.getSnapshot();
    const ctx: BridgeContext | undefined = snap?.context;
    const now = Date.now();
    const c = this.can();
    return {
      leader: this.leaderName,
      self: this.o.owner,
      phase: snap ? String(snap.value) : 'following',
      canProvision: c.ok,
      ...(c.reason ? { reason: c.reason } : {}),
      demand: ctx?.demand ?? this.observedDemand(now),
      machines: Object.values(ctx?.machines ?? {}).map((m) => ({ id: m.id, state: m.state, ageMs: now - m.createdAt, sinceMs: now - m.since })),
      started: ctx?.started ?? 0,
      failures: ctx?.failures ?? 0,
      provider: this.o.provider.describe(),
      decisions: [...this.decisions],
    };
  }

  /** Stops leading and listening. The machines stay: a successor adopts them (`releaseAll` gives them back). */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.leaseTimer);
    const wasLeading = this.leading;
    this.follow();
    for (const s of this.subs) s.unsubscribe();
    this.stopWatch?.();
    // A machine being started when the bridge stops is listed once started: wait for it.
    await Promise.allSettled([...this.provisioning]);
    // Let a successor take over at once instead of after the lease.
    if (wasLeading && this.kv) await this.kv.delete('leader', { previousSeq: this.revision }).catch(() => {});
  }

  /** Releases every machine of this bridge's tag: for a Paddock that shuts down as a whole. */
  async releaseAll(): Promise<void> {
    for (const m of await this.o.provider.list({ 'paddock-bridge': this.tag })) await this.o.provider.release(m.id);
  }
}
