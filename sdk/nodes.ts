/** The nodes of a Paddock: their heartbeat records and what each reports about itself. */
import { type KV, Kvm } from '@nats-io/kv';
import { type BackendKind, Buckets, type DrainReply, type LayerStats, type NodeLayerStats, type NodeRecord, ProtocolError, scanKv, subjects } from '../protocol/index.ts';
import { errorFromWire } from './errors.ts';
import type { CallOptions, Transport } from './transport.ts';

/** A drain that moves sandboxes waits this long by default: each move snapshots files and makes a sandbox. */
const MIGRATE_TIMEOUT_MS = 10 * 60_000;

/** Counters of one layer on one node. */
export type NodeLayer = LayerStats;

/** A node's layer cache and the layers it has mounted. */
export type NodeLayers = NodeLayerStats;

export interface NodeInfo extends NodeRecord {
  ids: string[];
  layers?: NodeLayers;
}

export class Nodes {
  private kv?: Promise<KV>;
  constructor(private readonly t: Transport) {}

  /** Heartbeat records of the nodes (live or recently gone). */
  async list(opts: CallOptions = {}): Promise<NodeRecord[]> {
    this.kv ??= new Kvm(this.t.nc).open(Buckets.nodes);
    const deadline = Date.now() + (opts.timeoutMs ?? this.t.defaultTimeoutMs);
    try {
      const rows = await this.t.within(
        (async () => scanKv<NodeRecord>(await (this.kv as Promise<KV>), { deadline, ...(opts.signal ? { signal: opts.signal } : {}) }))(),
        opts,
        'listing the nodes',
      );
      return rows.map((r) => r.value).sort((a, b) => a.node.localeCompare(b.node));
    } catch (err) {
      if (err instanceof ProtocolError) throw errorFromWire(err.toWire());
      throw err;
    }
  }

  /** What a node reports about itself, with its layer cache counters. */
  info(node: string, opts?: CallOptions): Promise<NodeInfo> {
    return this.t.request<NodeInfo>(subjects.node(node, 'info'), {}, opts);
  }

  /** The node table as a placement replica has it (`pdk.v1.nodes.list`), optionally filtered. */
  async query(filter: { state?: 'serving' | 'draining'; backend?: BackendKind } = {}, opts?: CallOptions): Promise<NodeRecord[]> {
    return (await this.t.request<{ nodes: NodeRecord[] }>(subjects.nodeList, filter, opts)).nodes;
  }

  /**
   * Stops new sandboxes from landing on `node`; the ones it has keep running. With `migrate`, those
   * created `migratable` are first moved to other nodes (files, spec, labels and the rest of their
   * TTL; their processes start afresh), and the reply says which went where and which stayed.
   */
  drain(node: string, opts: CallOptions & { migrate?: boolean } = {}): Promise<DrainReply> {
    const { migrate, ...call } = opts;
    return this.t.request<DrainReply>(subjects.node(node, 'drain'), migrate ? { migrate } : {}, { ...(migrate ? { timeoutMs: MIGRATE_TIMEOUT_MS } : {}), ...call });
  }

  /** Lets a drained node take new sandboxes again. */
  undrain(node: string, opts?: CallOptions): Promise<NodeRecord> {
    return this.t.request<NodeRecord>(subjects.node(node, 'undrain'), {}, opts);
  }
}
