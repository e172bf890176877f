/**
 * A placement replica on its own (`paddock placement`): no node beside it, so that placement can
 * be scaled, restarted and upgraded apart from the nodes. It opens a NATS connection and the node
 * table and serves what every replica serves (creates, group verbs, the directory, the command
 * log's reads). Stopping drains it: it takes no new call and finishes those under way, so a
 * rolling restart of every replica loses no create.
 */
import { connect } from '@nats-io/transport-node';
import type { Logger } from 'pino';
import { PlacementHost, type PlacementOptions } from '../actors/placement-host.ts';
import { natsServers } from '../protocol/discovery.ts';
import { Buckets, ensureBucket, type FewerReplicas, fewerReplicasWarning, replicasFor } from '../protocol/index.ts';
import type { NodeConfig } from '../runtime/config.ts';
import { inspectorFor } from './telemetry.ts';

export interface PlacementProcess {
  stop(): Promise<void>;
}

export async function startPlacement(o: { natsUrl: string; log: Logger; wait?: PlacementOptions; name?: string }): Promise<PlacementProcess> {
  const nc = await connect({ servers: natsServers(o.natsUrl), name: o.name ?? 'paddock-placement', maxReconnectAttempts: -1, reconnectTimeWait: 500, noAsyncTraces: true });
  try {
    const replicas = replicasFor(nc.info);
    const fewer = (f: FewerReplicas) => o.log.warn({ ...f }, fewerReplicasWarning(f));
    // The directory bucket too: its reads are served here, and a replica may start before any node.
    await ensureBucket(nc, Buckets.sandboxes, { history: 1, replicas }, fewer);
    const nodes = await ensureBucket(nc, Buckets.nodes, { history: 1, replicas }, fewer);
    const host = new PlacementHost(nc, nodes, o.log, inspectorFor(o.log), o.wait);
    await host.start();
    return {
      stop: async () => {
        await host.drain();
        await nc.drain().catch(() => {});
      },
    };
  } catch (e) {
    await nc.close().catch(() => {});
    throw e;
  }
}

/** A placement replica's options from a node's configuration. */
export function placementOptions(cfg: Pick<NodeConfig, 'waitForCapacity' | 'nodeLostMs' | 'endedRetentionMs'>): PlacementOptions {
  return { ...cfg.waitForCapacity, ...(cfg.nodeLostMs ? { lostAfterMs: cfg.nodeLostMs } : {}), endedRetentionMs: cfg.endedRetentionMs };
}
