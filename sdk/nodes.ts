/** The nodes of a Paddock: their heartbeat records and what each reports about itself. */
import { type KV, Kvm } from '@nats-io/kv';
import { Buckets, type LayerStats, type NodeLayerStats, type NodeRecord, ProtocolError, scanKv, subjects } from '../protocol/index.ts';
import { errorFromWire } from './errors.ts';
import type { CallOptions, Transport } from './transport.ts';

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
}
