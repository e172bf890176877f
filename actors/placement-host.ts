/**
 * Binds the placement machine to NATS: the node table comes from a watch on `pdk_nodes`, creates
 * arrive on `pdk.v1.place.create` in a queue group, and each is forwarded to the best node's
 * `create`. A node that refuses with NO_CAPACITY (or has died) passes the request to the next.
 */
import type { KV } from '@nats-io/kv';
import { type NatsConnection, RequestError, type Subscription, TimeoutError } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { type Actor, createActor } from 'xstate';
import {
  type CreateReply,
  decode,
  encode,
  type GroupReply,
  Limits,
  newSandboxId,
  type NodeRecord,
  PLACEMENT_QUEUE,
  ProtocolError,
  parseGroupSubject,
  type Reply,
  requireRecord,
  scanKv,
  subjects,
  validateCreate,
  validateNodeGroup,
} from '../protocol/index.ts';
import { traceHeaders } from '../protocol/trace.ts';
import { serve } from './bind.ts';
import { DirectoryHost } from './directory-host.ts';
import type { Inspector } from './inspect.ts';
import { isLive, placementMachine, rank } from './placement.ts';
import { RolloutHost } from './rollout-host.ts';

/** How many nodes one create tries before giving up with NO_CAPACITY. */
const MAX_TRIES = 3;
const NODE_CREATE_TIMEOUT_MS = 120_000;
/** Pause and resume of 3,200 sandboxes take ~1 s; killing as many takes minutes (crun delete each). */
const GROUP_TIMEOUT_MS = 600_000;

export class PlacementHost {
  private readonly actor: Actor<typeof placementMachine>;
  private readonly subs: Subscription[] = [];
  private stopWatch?: () => void;
  /** Placement replicas also answer the directory and command-log calls: both are stateless reads of JetStream. */
  private readonly directory: DirectoryHost;
  private readonly rollouts: RolloutHost;

  constructor(
    private readonly nc: NatsConnection,
    private readonly nodes: KV,
    private readonly log: Logger,
    inspect?: Inspector,
  ) {
    this.actor = createActor(placementMachine, inspect ? { inspect } : {});
    this.directory = new DirectoryHost(nc, log);
    this.rollouts = new RolloutHost(nc, this.directory, log);
  }

  async start(): Promise<void> {
    this.actor.start();
    await this.reload();
    const watch = await this.nodes.watch({ key: '>' });
    this.stopWatch = () => watch.stop();
    void (async () => {
      for await (const e of watch) {
        if (e.operation === 'PUT') {
          try {
            this.actor.send({ type: 'NODE_SEEN', record: decode(e.value) as NodeRecord });
          } catch (err) {
            this.log.warn({ err, key: e.key }, 'bad node record');
          }
        } else this.actor.send({ type: 'NODE_GONE', node: e.key });
      }
    })();
    this.subs.push(serve(this.nc, subjects.placeCreate, { queue: PLACEMENT_QUEUE, log: this.log, name: 'place.create', maxBytes: Limits.createBytesMax }, (req) => this.create(req.body)));
    this.subs.push(serve(this.nc, subjects.groupAll, { queue: PLACEMENT_QUEUE, log: this.log, name: 'group' }, (req) => this.group(req.subject)));
    this.directory.start();
    this.rollouts.start();
    this.subs.push(serve(this.nc, subjects.nodeList, { queue: PLACEMENT_QUEUE, log: this.log, name: 'nodes.list' }, (req) => this.listNodes(req.body)));
  }

  /**
   * `pdk.v1.nodes.list`: the node table as this replica has it (read afresh), sorted by id;
   * `{state?, backend?}` filter it.
   */
  private async listNodes(body: unknown): Promise<{ nodes: NodeRecord[] }> {
    const b = body === null || body === undefined ? {} : requireRecord(body, 'nodes.list');
    if (b.state !== undefined && b.state !== 'serving' && b.state !== 'draining') throw new ProtocolError('INVALID_REQUEST', 'state: must be serving or draining');
    if (b.backend !== undefined && typeof b.backend !== 'string') throw new ProtocolError('INVALID_REQUEST', 'backend: must be a string');
    await this.reload();
    const nodes = Object.values(this.actor.getSnapshot().context.nodes)
      .filter((r) => (b.state === undefined || r.state === b.state) && (b.backend === undefined || r.backends.includes(b.backend as NodeRecord['backends'][number])))
      .sort((x, y) => x.node.localeCompare(y.node));
    return { nodes };
  }

  /** Reads the whole node table: at start, and when a create finds no live node (the watch may lag). */
  private async reload(): Promise<void> {
    for (const { value } of await scanKv<NodeRecord>(this.nodes)) this.actor.send({ type: 'NODE_SEEN', record: value });
  }

  private async create(body: unknown): Promise<CreateReply> {
    const { spec, id = newSandboxId() } = validateCreate(body);
    let ranking = rank(this.actor.getSnapshot().context, spec, Date.now());
    if (ranking.nodes.length === 0) {
      await this.reload();
      ranking = rank(this.actor.getSnapshot().context, spec, Date.now());
    }
    if (ranking.nodes.length === 0) {
      const live = Object.values(this.actor.getSnapshot().context.nodes).some((r) => isLive(r, Date.now()));
      // A spec no live node could ever run is the caller's to fix; an empty cluster is ours.
      throw new ProtocolError(live ? 'INVALID_SPEC' : 'NO_CAPACITY', `cannot place sandbox: ${ranking.reason}`);
    }
    const refusals: string[] = [];
    for (const node of ranking.nodes.slice(0, MAX_TRIES)) {
      this.actor.send({ type: 'SENT', node, cpu: spec.cpu, memoryMiB: spec.memoryMiB });
      try {
        const reply = await this.nc.request(subjects.node(node, 'create'), encode({ id, spec }), { timeout: NODE_CREATE_TIMEOUT_MS, headers: traceHeaders() });
        const r = decode(reply.data) as Reply<CreateReply>;
        if (r.ok) return r.result;
        if (r.error.code !== 'NO_CAPACITY') throw new ProtocolError(r.error.code, r.error.message, { detail: r.error.detail });
        refusals.push(`${node}: ${r.error.message}`);
      } catch (err) {
        if (err instanceof ProtocolError) throw err;
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
    throw new ProtocolError('NO_CAPACITY', `no node could admit the sandbox (${refusals.join('; ')})`);
  }

  /** `pdk.v1.group.<g>.<verb>`: the verb on every live node at once, one summary back. */
  private async group(subject: string): Promise<GroupReply> {
    const { group, verb } = validateNodeGroup(parseGroupSubject(subject) ?? {});
    const started = performance.now();
    await this.reload();
    const now = Date.now();
    const nodes = Object.values(this.actor.getSnapshot().context.nodes).filter((r) => isLive(r, now) || r.state === 'draining');
    const reply: GroupReply = { group, verb, total: 0, ok: 0, failed: [], unreachable: [], releasedBytes: 0, durationMs: 0 };
    await Promise.all(
      nodes.map(async (n) => {
        try {
          const m = await this.nc.request(subjects.node(n.node, 'group'), encode({ group, verb }), { timeout: GROUP_TIMEOUT_MS, headers: traceHeaders() });
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

  stop(): void {
    for (const s of this.subs) s.unsubscribe();
    this.directory.stop();
    this.rollouts.stop();
    this.stopWatch?.();
    this.actor.stop();
  }
}
