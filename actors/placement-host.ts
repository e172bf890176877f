/**
 * Binds the placement machine to NATS: the node table comes from a watch on `pdk_nodes`, creates
 * arrive on `pdk.v1.place.create` in a queue group, and each is forwarded to the best node's
 * `create`. A node that refuses with NO_CAPACITY (or has died) passes the request to the next.
 *
 * When every node refuses and the bridge (bridge/) says capacity is coming, the create waits in a
 * bounded queue instead of failing: its position goes out on `pdk.v1.evt.<id>.waiting`, the queue
 * goes out as demand on `pdk.v1.bridge.demand`, and it is placed when a node joins or frees room.
 * When the bridge says no capacity can come, every waiting create fails at once with its reason.
 */
import type { KV } from '@nats-io/kv';
import { type Msg, type NatsConnection, RequestError, type Subscription, TimeoutError } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { type Actor, createActor } from 'xstate';
import { ConnectionLost, request } from '../protocol/connection.ts';
import {
  type CreateReply,
  check,
  decode,
  decodeRequest,
  encode,
  type GroupReply,
  Limits,
  type NodeRecord,
  newSandboxId,
  PLACEMENT_QUEUE,
  isToken,
  ProtocolError,
  parseGroupSubject,
  type Reply,
  type SandboxInfo,
  type SandboxSpec,
  Schema,
  scanKv,
  scanKvEntries,
  dropMarker,
  claimPeriod,
  subjects,
  validateCreate,
  validateNodeGroup,
} from '../protocol/index.ts';
import { traceHeaders } from '../protocol/trace.ts';
import { serve } from './bind.ts';
import { DirectoryHost } from './directory-host.ts';
import type { Inspector } from './inspect.ts';
import { hasRoom, isLive, placementMachine, rank } from './placement.ts';
import { RolloutHost } from './rollout-host.ts';

/** A create that finds no node rereads the node table unless it was read this recently. */
const CREATE_RELOAD_MS = 1000;
/** How many nodes one create tries before giving up with NO_CAPACITY. */
const MAX_TRIES = 3;
/** How long placement waits for the node's answer to a create whose caller did not say (`timeoutMs`). */
const NODE_CREATE_TIMEOUT_MS = 120_000;
/** Placement answers this much before the caller's own deadline, so that its TIMEOUT, which says where, arrives first. */
const ANSWER_MARGIN_MS = 1000;
/** Pause and resume of 3,200 sandboxes take ~1 s; killing as many takes minutes (crun delete each). */
const GROUP_TIMEOUT_MS = 600_000;
/** A node silent this long (and ten heartbeats) is lost: its sandboxes are marked failed, `node_lost` (PlacementOptions.lostAfterMs). */
const LOST_AFTER_MS = 15_000;
/** How long a silent node has to answer a ping before it is found lost. */
const LOST_PING_MS = 5000;
/** Group verbs still try a node whose heartbeat is this old (it may be busy, not gone). */
const GROUP_STALE_MS = 10 * 60_000;
/** A node record this recent is tried even when its heartbeat is late (JetStream may be electing). */
const RECENT_MS = 60_000;
/** A node create unanswered this long is sent again (idempotent by id: the node answers with the one under way). */
const NODE_ASK_AGAIN_MS = 10_000;
/** How long a node that has no responders is asked again (it may be reconnecting). */
const NODE_RECONNECT_MS = 5000;
/** How often replicas look for lost nodes. */
const LOST_SWEEP_MS = 2000;
/** How long the directory keeps an ended sandbox's record (PADDOCK_ENDED_RETENTION_SEC). */
const ENDED_RETENTION_MS = 86_400_000;
/**
 * How often the cluster removes records past their retention: a scan of the whole directory (at
 * 380,000 live, seconds of CPU and a few hundred MiB held while it runs), so once an hour for the
 * cluster, by whichever replica claims it (every node of `npm start` runs one).
 */
const ENDED_SWEEP_MS = 60 * 60_000;
/** How often each replica looks whether the cluster's sweep is due: a read of one key. */
const ENDED_LOOK_MS = 5 * 60_000;
/** The directory's key of the last sweep (`claimPeriod`): no sandbox id has a dot. */
export const ENDED_SWEEP_KEY = 'sweep.ended';
/** Sandbox states that have ended: a lost node's records in them stay as they are. */
const ENDED = new Set(['stopped', 'failed']);

/** A bridge state older than this is a bridge gone: creates then fail at once as without one. */
const BRIDGE_STALE_MS = 3000;
/** While creates wait, the demand they make is published this often (the bridge forgets a silent replica). */
const DEMAND_EVERY_MS = 500;

/** What the leading bridge says on `pdk.v1.bridge.state`. */
export interface BridgeState {
  leader: string;
  ts: number;
  /** Whether the bridge can add machines for this kind of demand now. */
  canProvision: boolean;
  /** Why not, when it cannot: the waiting creates fail with it. */
  reason?: string;
}

/** One create held for capacity. */
interface Waiting {
  id: string;
  spec: SandboxSpec;
  /** How long the node may take to make it, once one is chosen. */
  nodeWaitMs: number;
  since: number;
  timer: NodeJS.Timeout;
  /** Being tried on a node now: not tried twice at once. */
  trying: boolean;
  resolve: (r: CreateReply) => void;
  reject: (e: Error) => void;
}

export interface PlacementOptions {
  /** Default of a create's `waitForCapacityMs`. */
  ms: number;
  maxWaiting: number;
  /**
   * How long a node may be silent (and ten of its heartbeats) before its sandboxes are marked
   * `node_lost` (LOST_AFTER_MS when absent). A restarted node takes up its sandboxes only while
   * their records are live: a host whose nodes take longer to come back raises it.
   */
  lostAfterMs?: number;
  /** How long an ended sandbox's record stays in the directory (ENDED_RETENTION_MS when absent). */
  endedRetentionMs?: number;
  /** How often the cluster removes records past that, and markers that old (ENDED_SWEEP_MS when absent). */
  endedSweepMs?: number;
}

export class PlacementHost {
  private readonly actor: Actor<typeof placementMachine>;
  private readonly subs: Subscription[] = [];
  private stopWatch?: () => void;
  /** Placement replicas also answer the directory and command-log calls: both are stateless reads of JetStream. */
  private readonly directory: DirectoryHost;
  private readonly rollouts: RolloutHost;
  private readonly waiting: Waiting[] = [];
  private bridge?: BridgeState;
  private demandTimer?: NodeJS.Timeout;
  private readonly replica = newSandboxId().replace(/^sb-/, 'pl-');
  /** Each node record's revision, from the watch: a lost node is claimed by updating it at that revision. */
  private readonly revisions = new Map<string, number>();
  private lostTimer?: NodeJS.Timeout;
  private endedTimer?: NodeJS.Timeout;
  private sweeping = false;
  /** Creates this replica is placing, by id: what `place.pending` answers (the SDK's probe of its creates). */
  private readonly held = new Map<string, { since: number; node?: string; count: number }>();
  private pendingSub?: Subscription;

  constructor(
    private readonly nc: NatsConnection,
    private readonly nodes: KV,
    private readonly log: Logger,
    inspect?: Inspector,
    private readonly wait: PlacementOptions = { ms: 30_000, maxWaiting: 10_000 },
    /** The node this replica runs beside, asked in-process whether it would refuse a create. */
    private readonly local?: { id: string; refusalFor(spec: SandboxSpec): string | undefined },
    /** The connection JetStream is read over, when not `nc` (a node's: see NodeProcess). */
    store: NatsConnection = nc,
  ) {
    this.actor = createActor(placementMachine, inspect ? { inspect } : {});
    this.directory = new DirectoryHost(nc, log, store);
    this.rollouts = new RolloutHost(nc, this.directory, log, store);
  }

  async start(): Promise<void> {
    this.actor.start();
    await this.reload();
    const watch = await this.nodes.watch({ key: '>' });
    this.stopWatch = () => watch.stop();
    void (async () => {
      for await (const e of watch) {
        if (e.operation === 'PUT') {
          this.revisions.set(e.key, e.revision);
          try {
            this.actor.send({ type: 'NODE_SEEN', record: decode(e.value) as NodeRecord });
          } catch (err) {
            this.log.warn({ err, key: e.key }, 'bad node record');
          }
          // A node that joined or freed room may take what waits.
          if (this.waiting.length > 0) this.kick();
        } else {
          this.revisions.delete(e.key);
          this.actor.send({ type: 'NODE_GONE', node: e.key });
        }
      }
    })();
    this.lostTimer = setInterval(() => {
      if (this.sweeping) return;
      this.sweeping = true;
      void this.sweepLost()
        .catch((err: unknown) => this.log.warn({ err }, 'looking for lost nodes failed'))
        .finally(() => (this.sweeping = false));
    }, LOST_SWEEP_MS);
    this.lostTimer.unref();
    const look = Math.min(ENDED_LOOK_MS, this.wait.endedSweepMs ?? ENDED_SWEEP_MS);
    const sweepAfter = (delay: number) => {
      const timer = setTimeout(() => {
        void this.directory
          .directory()
          .then((kv) => claimPeriod(kv, ENDED_SWEEP_KEY, this.wait.endedSweepMs ?? ENDED_SWEEP_MS, this.local?.id ?? 'placement'))
          .then((mine) => (mine ? this.sweepEnded() : 0))
          .catch((err: unknown) => this.log.warn({ err }, 'removing ended sandboxes from the directory failed'))
          .finally(() => {
            if (this.endedTimer === timer) sweepAfter(look);
          });
      }, delay);
      timer.unref();
      this.endedTimer = timer;
    };
    sweepAfter(look + Math.random() * look);
    const bridgeSub = this.nc.subscribe(subjects.bridgeState, {
      callback: (_e, m) => {
        try {
          this.onBridgeState(decode(m.data) as BridgeState);
        } catch (err) {
          this.log.warn({ err }, 'bad bridge state');
        }
      },
    });
    this.subs.push(bridgeSub);
    this.subs.push(serve(this.nc, subjects.placeCreate, { queue: PLACEMENT_QUEUE, log: this.log, name: 'place.create', maxBytes: Limits.createBytesMax }, (req) => this.tracked(() => this.holding(req.body, () => this.create(req.body)))));
    // Every replica, no queue: only one holding an id can say so. Kept through a drain, whose
    // creates under way are still held.
    this.pendingSub = this.nc.subscribe(subjects.placePending, { callback: (_err, m) => this.answerPending(m) });
    this.subs.push(serve(this.nc, subjects.groupAll, { queue: PLACEMENT_QUEUE, log: this.log, name: 'group' }, (req) => this.tracked(() => this.group(req.subject))));
    this.directory.start();
    this.rollouts.start();
    this.subs.push(serve(this.nc, subjects.nodeList, { queue: PLACEMENT_QUEUE, log: this.log, name: 'nodes.list' }, (req) => this.listNodes(req.body)));
  }

  /**
   * `pdk.v1.nodes.list`: the node table as this replica has it (read afresh), sorted by id;
   * `{state?, backend?}` filter it.
   */
  private async listNodes(body: unknown): Promise<{ nodes: NodeRecord[] }> {
    const b = check(Schema.NodesListRequest, body, 'INVALID_REQUEST', 'nodes.list');
    await this.reload();
    const nodes = Object.values(this.actor.getSnapshot().context.nodes)
      .filter((r) => (b.state === undefined || r.state === b.state) && (b.backend === undefined || r.backends.includes(b.backend)))
      .sort((x, y) => x.node.localeCompare(y.node));
    return { nodes };
  }

  private reloading?: Promise<void>;
  private reloadedAt = 0;

  /**
   * Reads the whole node table: at start, and when a create finds no live node (the watch may lag).
   * Callers meanwhile share the read in flight; with `unlessNewerThanMs`, a read that ended that
   * recently is enough: 300 creates refused at once were 300 scans of the table, and the node's
   * neighbours felt them.
   */
  private reload(unlessNewerThanMs = 0): Promise<void> {
    if (this.reloading !== undefined) return this.reloading;
    if (unlessNewerThanMs > 0 && Date.now() - this.reloadedAt < unlessNewerThanMs) return Promise.resolve();
    this.reloading = (async () => {
      try {
        for (const { value } of await scanKv<NodeRecord>(this.nodes)) this.actor.send({ type: 'NODE_SEEN', record: value });
        this.reloadedAt = Date.now();
      } finally {
        this.reloading = undefined;
      }
    })();
    return this.reloading;
  }

  private async create(body: unknown): Promise<CreateReply> {
    const { spec, id = newSandboxId(), waitForCapacityMs = this.wait.ms, timeoutMs } = validateCreate(await this.directory.withSnapshot(body));
    // A caller that waits longer (an image of gigabytes pulled whole) lets the node take as long.
    const nodeWaitMs = timeoutMs === undefined ? NODE_CREATE_TIMEOUT_MS : Math.max(1000, timeoutMs - ANSWER_MARGIN_MS);
    let ranking = rank(this.actor.getSnapshot().context, spec, Date.now());
    if (ranking.nodes.length === 0) {
      // A reload that fails (the node table's stream electing a leader after a server died) is no
      // answer yet: the records held may be stale only because the heartbeats could not be written.
      await this.reload(CREATE_RELOAD_MS).catch((err: unknown) => this.log.warn({ err }, 'node table unreadable: placing by the records held'));
      ranking = rank(this.actor.getSnapshot().context, spec, Date.now());
    }
    if (ranking.nodes.length === 0) ranking = this.rankRecent(spec);
    if (ranking.nodes.length === 0) {
      const live = Object.values(this.actor.getSnapshot().context.nodes).some((r) => isLive(r, Date.now()));
      // A spec no live node could ever run is the caller's to fix; an empty cluster is ours.
      if (live) throw new ProtocolError('INVALID_SPEC', `cannot place sandbox: ${ranking.reason}`);
      if (!this.bridgePromises(waitForCapacityMs)) throw new ProtocolError('NO_CAPACITY', `cannot place sandbox: ${ranking.reason}${this.bridgeWhy()}`);
      return this.enqueue(id, spec, waitForCapacityMs, nodeWaitMs);
    }
    const r = await this.attempt(id, spec, ranking.nodes, nodeWaitMs);
    if ('result' in r) {
      if (spec.group) this.actor.send({ type: 'PLACED', group: spec.group, node: r.result.sandbox.node });
      return r.result;
    }
    if (!this.bridgePromises(waitForCapacityMs)) throw new ProtocolError('NO_CAPACITY', `no node could admit the sandbox (${r.refusals.join('; ')})${this.bridgeWhy()}`);
    return this.enqueue(id, spec, waitForCapacityMs, nodeWaitMs);
  }

  /** Runs a create while `place.pending` says this replica holds its id (a create sent again counts twice). */
  private async holding<T>(body: unknown, work: () => Promise<T>): Promise<T> {
    const id = (body as { id?: unknown } | null)?.id;
    if (!isToken(id)) return work();
    const h = this.held.get(id) ?? { since: Date.now(), count: 0 };
    h.count++;
    this.held.set(id, h);
    try {
      return await work();
    } finally {
      if (--h.count === 0 && this.held.get(id) === h) this.held.delete(id);
    }
  }

  /** `pdk.v1.place.pending`: the asked ids this replica holds, or silence when it holds none (another replica may). */
  private answerPending(m: Msg): void {
    if (!m.reply) return;
    let ids: string[];
    try {
      ids = check(Schema.PlacePendingRequest, decodeRequest(m.data), 'INVALID_REQUEST', 'place.pending').ids;
    } catch (err) {
      const e = err instanceof ProtocolError ? err : new ProtocolError('INVALID_REQUEST', `place.pending: the payload is not MessagePack (${(err as Error).message})`);
      m.respond(encode({ ok: false, error: e.toWire() }));
      return;
    }
    const now = Date.now();
    const held = ids.flatMap((id) => {
      const h = this.held.get(id);
      return h ? [{ id, ...(h.node ? { node: h.node } : {}), sinceMs: now - h.since }] : [];
    });
    if (held.length > 0) m.respond(encode({ ok: true, result: { held } }));
  }

  /** Tries the best nodes in turn; NO_CAPACITY from all of them comes back as their refusals. */
  private async attempt(id: string, spec: SandboxSpec, nodes: string[], nodeWaitMs: number): Promise<{ result: CreateReply } | { refusals: string[] }> {
    const refusals: string[] = [];
    for (const node of nodes.slice(0, MAX_TRIES)) {
      // The same answer the node would send, without the round trip through NATS and its handler.
      const refused = node === this.local?.id ? this.local.refusalFor(spec) : undefined;
      if (refused !== undefined) {
        refusals.push(`${node}: ${refused}`);
        continue;
      }
      this.actor.send({ type: 'SENT', node, cpu: spec.cpu, memoryMiB: spec.memoryMiB });
      const h = this.held.get(id);
      if (h) h.node = node;
      try {
        let r = await this.nodeCreate(node, id, spec, nodeWaitMs);
        // The id is taken on another node: a create sent again whose first try made it there. That
        // node answers a create of the id with its sandbox (node creates are idempotent by id).
        const owner = !r.ok && r.error.code === 'ALREADY_EXISTS' ? r.error.detail?.node : undefined;
        if (typeof owner === 'string' && owner !== node) r = await this.nodeCreate(owner, id, spec, nodeWaitMs);
        if (r.ok) return { result: r.result };
        if (r.error.code !== 'NO_CAPACITY') throw new ProtocolError(r.error.code, r.error.message, { detail: r.error.detail });
        refusals.push(`${node}: ${r.error.message}`);
      } catch (err) {
        if (err instanceof ProtocolError) throw err;
        if (err instanceof ConnectionLost) throw new ProtocolError('UNAVAILABLE', `placement lost NATS while creating ${id} on ${node}: ${err.message}`);
        if (err instanceof RequestError && err.isNoResponders()) {
          refusals.push(`${node}: not answering`);
          continue;
        }
        if (err instanceof TimeoutError || (err as Error).cause instanceof TimeoutError) {
          throw new ProtocolError('TIMEOUT', `node ${node} did not answer the create of ${id} in time`);
        }
        throw err;
      } finally {
        this.actor.send({ type: 'SETTLED', node, cpu: spec.cpu, memoryMiB: spec.memoryMiB });
      }
    }
    return { refusals };
  }

  /**
   * Nodes whose heartbeat is late but recent (a minute) and not found lost, ranked as if live:
   * when JetStream loses a stream's leader, every heartbeat stalls for seconds at once, and the
   * nodes are as able to admit as before. Their admission decides.
   */
  private rankRecent(spec: SandboxSpec): ReturnType<typeof rank> {
    const now = Date.now();
    const ctx = this.actor.getSnapshot().context;
    const nodes = Object.fromEntries(
      Object.values(ctx.nodes)
        .filter((r) => r.lostAt === undefined && r.state === 'serving' && now - r.ts < RECENT_MS)
        .map((r) => [r.node, { ...r, ts: now }]),
    );
    return rank({ ...ctx, nodes }, spec, now);
  }

  /** One node's create; sent again after a reconnect of this replica's connection (it is idempotent by id). */
  private async nodeCreate(node: string, id: string, spec: SandboxSpec, waitMs: number): Promise<Reply<CreateReply>> {
    // No responders from a node the table says is there: it may be reconnecting (its server
    // died), its subscriptions not yet back. It is asked again for a few seconds before it counts
    // as not answering.
    // A request or its answer can also vanish inside a NATS server that dies with it queued, with
    // no connection of ours dropping: the create is asked again every NODE_ASK_AGAIN_MS (the node
    // answers a create it is making with that create), not waited for over its whole timeout.
    const until = Date.now() + NODE_RECONNECT_MS;
    const deadline = Date.now() + waitMs;
    for (;;) {
      try {
        const reply = await request(this.nc, subjects.node(node, 'create'), encode({ id, spec }), { timeout: Math.min(NODE_ASK_AGAIN_MS, deadline - Date.now()), headers: traceHeaders(), resend: true });
        return decode(reply.data) as Reply<CreateReply>;
      } catch (err) {
        if ((err instanceof TimeoutError || (err as Error).cause instanceof TimeoutError) && Date.now() < deadline - 100) continue;
        const r = this.actor.getSnapshot().context.nodes[node];
        if (!(err instanceof RequestError && err.isNoResponders()) || Date.now() > until || !r || r.lostAt !== undefined || Date.now() - r.ts > RECENT_MS) throw err;
        await new Promise((res) => setTimeout(res, 250));
      }
    }
  }

  /** Whether a create may wait: the caller allows it, the queue has room, and a live bridge says capacity can come. */
  private bridgePromises(waitMs: number): boolean {
    const b = this.bridge;
    return waitMs > 0 && this.waiting.length < this.wait.maxWaiting && b !== undefined && b.canProvision && Date.now() - b.ts < BRIDGE_STALE_MS;
  }

  private bridgeWhy(): string {
    const b = this.bridge;
    if (b && !b.canProvision && Date.now() - b.ts < BRIDGE_STALE_MS) return `; the bridge cannot add machines: ${b.reason ?? 'no reason given'}`;
    if (this.waiting.length >= this.wait.maxWaiting) return `; ${this.waiting.length} creates already wait for capacity on this replica`;
    return '';
  }

  private enqueue(id: string, spec: SandboxSpec, waitMs: number, nodeWaitMs: number): Promise<CreateReply> {
    return new Promise<CreateReply>((resolve, reject) => {
      const w: Waiting = {
        id,
        spec,
        nodeWaitMs,
        since: Date.now(),
        trying: false,
        resolve,
        reject,
        timer: setTimeout(() => this.fail(w, `no capacity came within ${waitMs} ms (the bridge is adding machines)`), waitMs),
      };
      this.waiting.push(w);
      this.nc.publish(subjects.event(id, 'waiting'), encode({ id, state: 'waiting', position: this.waiting.length, waiting: this.waiting.length, ts: Date.now() }));
      this.publishDemand();
      this.demandTimer ??= setInterval(() => this.publishDemand(), DEMAND_EVERY_MS);
    });
  }

  private remove(w: Waiting): void {
    clearTimeout(w.timer);
    const i = this.waiting.indexOf(w);
    if (i >= 0) this.waiting.splice(i, 1);
    if (this.waiting.length === 0 && this.demandTimer) {
      clearInterval(this.demandTimer);
      this.demandTimer = undefined;
      this.publishDemand();
    }
  }

  private fail(w: Waiting, why: string): void {
    this.remove(w);
    w.reject(new ProtocolError('NO_CAPACITY', `cannot place sandbox ${w.id}: ${why}`));
  }

  /** The waiting creates by backend kind: what the bridge sizes its machines to. */
  private publishDemand(): void {
    const kinds: Record<string, { count: number; cpu: number; memoryMiB: number; oldestMs: number }> = {};
    const now = Date.now();
    for (const w of this.waiting) {
      const k = kinds[w.spec.backend] ?? { count: 0, cpu: 0, memoryMiB: 0, oldestMs: 0 };
      kinds[w.spec.backend] = k;
      k.count++;
      k.cpu += w.spec.cpu;
      k.memoryMiB += w.spec.memoryMiB;
      k.oldestMs = Math.max(k.oldestMs, now - w.since);
    }
    this.nc.publish(subjects.bridgeDemand, encode({ replica: this.replica, ts: now, kinds }));
  }

  private onBridgeState(b: BridgeState): void {
    this.bridge = b;
    if (!b.canProvision && this.waiting.length > 0) {
      const why = `the bridge cannot add machines: ${b.reason ?? 'no reason given'}`;
      for (const w of [...this.waiting]) if (!w.trying) this.fail(w, why);
    }
  }

  /**
   * Places what waits, oldest first, while ranked nodes seem to have room: each try counts as in
   * flight (SENT), so the next ranking sees it. A create refused again goes back to its place.
   */
  private kick(): void {
    {
      const now = Date.now();
      for (const w of this.waiting) {
        if (w.trying) continue;
        const ranking = rank(this.actor.getSnapshot().context, w.spec, now);
        const ctx = this.actor.getSnapshot().context;
        const roomy = ranking.nodes.filter((n) => hasRoom(ctx, n, w.spec));
        if (roomy.length === 0) break;
        w.trying = true;
        void this.attempt(w.id, w.spec, roomy, w.nodeWaitMs).then(
          (r) => {
            w.trying = false;
            if ('result' in r) {
              this.remove(w);
              w.resolve(r.result);
            } else if (this.waiting.includes(w)) this.kick();
          },
          (err: unknown) => {
            w.trying = false;
            this.remove(w);
            w.reject(err as Error);
          },
        );
      }
    }
  }

  /** `pdk.v1.group.<g>.<verb>`: the verb on every live node at once, one summary back. */
  private async group(subject: string): Promise<GroupReply> {
    const { group, verb } = validateNodeGroup(parseGroupSubject(subject) ?? {});
    const started = performance.now();
    // The watched table, not a read of every node record per call: with hundreds of nodes that
    // read was the call's cost. Only an empty table (a replica just started) is read afresh.
    if (Object.keys(this.actor.getSnapshot().context.nodes).length === 0) await this.reload(CREATE_RELOAD_MS);
    const now = Date.now();
    // Every node not known lost, a stale heartbeat included: a node busy with a group verb of tens
    // of thousands of sandboxes misses heartbeats (their writes queue behind the directory's), and
    // a resume that skipped it left its part of the job paused with nothing said. A node that is
    // really gone has no subscription: it answers "no responders" at once and is listed unreachable.
    const nodes = Object.values(this.actor.getSnapshot().context.nodes).filter((r) => r.lostAt === undefined && (isLive(r, now) || r.state === 'draining' || now - r.ts < GROUP_STALE_MS));
    const reply: GroupReply = { group, verb, total: 0, ok: 0, failed: [], unreachable: [], releasedBytes: 0, durationMs: 0 };
    await Promise.all(
      nodes.map(async (n) => {
        try {
          const m = await request(this.nc, subjects.node(n.node, 'group'), encode({ group, verb }), { timeout: GROUP_TIMEOUT_MS, headers: traceHeaders(), resend: true });
          const r = decode(m.data) as Reply<{ total: number; ok: number; failed: GroupReply['failed']; releasedBytes?: number }>;
          if (!r.ok) throw new ProtocolError(r.error.code, r.error.message);
          reply.total += r.result.total;
          reply.ok += r.result.ok;
          reply.releasedBytes += r.result.releasedBytes ?? 0;
          reply.failed.push(...r.result.failed);
        } catch (err) {
          if (err instanceof ProtocolError) throw err;
          reply.unreachable.push(n.node);
        }
      }),
    );
    reply.durationMs = Math.round(performance.now() - started);
    return reply;
  }

  /**
   * A node that stopped heartbeating without stopping (SIGKILL, its host gone) leaves records
   * that say `running`. One replica — the one whose update of the node's record at the revision
   * it watched succeeds — marks them failed with `node_lost`. A node that comes back republishes
   * its sandboxes' true states over these (node-host `reconnected`); one restarted under its id
   * marks them `node_restarted`.
   */
  private async sweepLost(): Promise<void> {
    const now = Date.now();
    for (const r of Object.values(this.actor.getSnapshot().context.nodes)) {
      if (r.lostAt !== undefined || now - r.ts < Math.max(this.wait.lostAfterMs ?? LOST_AFTER_MS, 10 * r.heartbeatMs)) continue;
      const rev = this.revisions.get(r.node);
      if (rev === undefined) continue;
      // Silence in the table is not death: a node whose heartbeat writes time out behind a flood of
      // directory writes (a group pause of 32,000) still answers. Only one that does not is lost.
      if (await this.answers(r.node)) continue;
      let marked: number;
      try {
        marked = await this.nodes.update(r.node, encode({ ...r, lostAt: now }), rev);
      } catch {
        continue; // another replica took it, or the node beat again
      }
      const kv = await this.directory.directory();
      const gone = (await scanKv<SandboxInfo>(kv)).filter((e) => e.value.node === r.node && !ENDED.has(e.value.state));
      // A node that had only stalled writes its heartbeat over the mark and its sandboxes back
      // (node-host writeRecord). If it did so during the scan, what the scan read may be its own
      // write-back: leave it. A failed read of the record is no proof of life; the per-record
      // revisions below still keep whatever the node writes from here on.
      const since = await this.nodes.get(r.node).catch(() => null);
      if (since && since.revision !== marked) {
        this.log.info({ node: r.node }, 'a node taken for lost wrote its record again: its sandboxes are left as it wrote them');
        continue;
      }
      const silent = Math.round((now - r.ts) / 1000);
      let n = 0;
      for (const { key, value, revision } of gone) {
        const ended: SandboxInfo = { ...value, state: 'failed', reason: 'node_lost', endedAt: now, error: { code: 'BACKEND_FAILED', message: `node ${r.node} stopped answering (no heartbeat for ${silent} s): the sandbox is lost with it`, retryable: false } };
        const rec = encode(ended);
        // At the revision scanned: a record the node wrote since (it was not lost after all) stays.
        if (!(await this.markAt(kv, key, rec, revision))) continue;
        n++;
        this.nc.publish(subjects.event(key, 'failed'), rec);
      }
      this.log.warn({ node: r.node, silentSec: silent, sandboxes: n }, 'node lost: its sandboxes are marked failed');
    }
  }

  /** Writes `rec` at `revision`; a failure that was not a newer write (a timeout) is tried once more. */
  private async markAt(kv: KV, key: string, rec: Uint8Array, revision: number): Promise<boolean> {
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        await kv.update(key, rec, revision);
        return true;
      } catch {
        const now = await kv.get(key).catch(() => null);
        if (now?.revision !== revision) return false;
      }
    }
    return false;
  }

  /**
   * Removes from the directory the records of sandboxes that ended more than the retention ago,
   * and then the delete markers that stood for records removed before the last sweep. Kept for
   * ever, every sandbox ever made stayed in the directory, and each listing and each node's start
   * read them all (a fleet of 160 that had made 10,000 sandboxes took 45 s to start instead of 12).
   * A delete at the record's revision leaves alone one written since. Returns how many went. The
   * replicas' timer runs it once an hour for the cluster (claimPeriod); called directly, it runs.
   */
  async sweepEnded(now = Date.now()): Promise<number> {
    const kv = await this.directory.directory();
    const keep = this.wait.endedRetentionMs ?? ENDED_RETENTION_MS;
    const markersAfter = this.wait.endedSweepMs ?? ENDED_SWEEP_MS;
    let n = 0;
    for (const e of await scanKvEntries<SandboxInfo>(kv)) {
      if (e.key === ENDED_SWEEP_KEY) continue;
      try {
        // A delete marker a sweep period old: every reader that saw the record has seen it go, and
        // nothing writes its key again (ids are random; a create sent again comes within minutes).
        if (e.deleted) {
          if (now - e.at >= markersAfter) await dropMarker(kv, e.key);
        } else if (ENDED.has(e.value.state) && typeof e.value.endedAt === 'number' && now - e.value.endedAt >= keep) {
          await kv.delete(e.key, { previousSeq: e.revision });
          n++;
        }
      } catch {
        // Written since (the id is live again), or removed by another replica.
      }
    }
    if (n > 0) this.log.info({ removed: n, retentionSec: Math.round(keep / 1000) }, 'removed ended sandboxes from the directory');
    return n;
  }

  /** Whether the node answers a request of its own (node.info) within a few seconds. */
  private async answers(node: string): Promise<boolean> {
    try {
      await this.nc.request(subjects.node(node, 'info'), encode({}), { timeout: LOST_PING_MS });
      return true;
    } catch {
      return false;
    }
  }

  private inflight = 0;
  private idle?: () => void;

  /** Creates and group verbs under way are counted, so that a replica stopping can finish them first. */
  private async tracked<T>(work: () => Promise<T>): Promise<T> {
    this.inflight++;
    try {
      return await work();
    } finally {
      if (--this.inflight === 0) this.idle?.();
    }
  }

  /**
   * Stops taking calls (the queue group's other replicas get them), finishes those under way (up
   * to `timeoutMs`), then stops: a replica restarted this way loses no create.
   */
  async drain(timeoutMs = 30_000): Promise<void> {
    // drain, not unsubscribe: a request the server routed here before it saw the UNSUB still
    // reaches the handler instead of vanishing (its caller would wait out its timeout).
    await Promise.all(this.subs.splice(0).map((s) => s.drain().catch(() => {})));
    this.directory.stop();
    this.rollouts.stop();
    if (this.inflight > 0) {
      let timer: NodeJS.Timeout | undefined;
      const t0 = Date.now();
      this.log.info({ inflight: this.inflight }, 'placement draining: finishing the calls under way');
      await Promise.race([new Promise<void>((r) => (this.idle = r)), new Promise<void>((r) => (timer = setTimeout(r, timeoutMs)))]);
      clearTimeout(timer);
      if (this.inflight > 0) this.log.warn({ inflight: this.inflight, waitedMs: Date.now() - t0 }, 'placement drained with calls still under way: they end with this replica');
    }
    this.stop();
  }

  stop(): void {
    if (this.lostTimer) clearInterval(this.lostTimer);
    if (this.endedTimer) clearTimeout(this.endedTimer);
    this.endedTimer = undefined;
    this.pendingSub?.unsubscribe();
    for (const w of [...this.waiting]) this.fail(w, 'the placement replica is stopping');
    for (const s of this.subs) s.unsubscribe();
    this.directory.stop();
    this.rollouts.stop();
    this.stopWatch?.();
    this.actor.stop();
  }
}
