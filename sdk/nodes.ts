/** The nodes of a Paddock: their heartbeat records and what each reports about itself. */
import { type KV, Kvm } from '@nats-io/kv';
import { Buckets, decode, type NodeRecord, subjects } from '../protocol/index.ts';
import type { CallOptions, Transport } from './transport.ts';

/** Counters of one layer on one node (runtime/images/cache.ts). */
export interface NodeLayer {
  digest: string;
  size: number;
  cachedBytes: number;
  complete: boolean;
  users: number;
  /** Bytes received from the layer store. */
  fetchedBytes: number;
  fetches: number;
  /** Chunk reads answered from the node's cache / that went to the store. */
  hits: number;
  misses: number;
  /** Reads that waited for a chunk already being fetched (concurrent first reads fetch once). */
  shared: number;
  errors: number;
  corrupt: number;
}

/** A node's layer cache and the layers it has mounted. */
export interface NodeLayers {
  mode: 'lazy' | 'eager';
  store: string;
  dir: string;
  budgetBytes: number;
  cachedBytes: number;
  evictions: number;
  evictedBytes: number;
  uncachedChunks: number;
  fetchedBytes: number;
  hits: number;
  misses: number;
  layers: NodeLayer[];
  mounted: Array<{ digest: string; sandboxes: number; lazy: boolean }>;
}

export interface NodeInfo extends NodeRecord {
  ids: string[];
  layers?: NodeLayers;
}

export class Nodes {
  private kv?: Promise<KV>;
  constructor(private readonly t: Transport) {}

  /** Heartbeat records of the nodes (live or recently gone). */
  async list(): Promise<NodeRecord[]> {
    this.kv ??= new Kvm(this.t.nc).open(Buckets.nodes);
    const kv = await this.kv;
    const out: NodeRecord[] = [];
    for await (const k of await kv.keys()) {
      const e = await kv.get(k);
      if (e?.operation === 'PUT') out.push(decode(e.value) as NodeRecord);
    }
    return out.sort((a, b) => a.node.localeCompare(b.node));
  }

  /** What a node reports about itself, with its layer cache counters. */
  info(node: string, opts?: CallOptions): Promise<NodeInfo> {
    return this.t.request<NodeInfo>(subjects.node(node, 'info'), {}, opts);
  }
}
