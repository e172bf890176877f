/**
 * The placement machine: keeps the table of live nodes (fed from the `pdk_nodes` KV watch) and the
 * creates this replica has in flight, and ranks nodes for a spec. Stateless across replicas: any
 * replica may answer, node admission arbitrates.
 */
import { assign, setup } from 'xstate';
import type { NodeRecord, SandboxSpec } from '../protocol/index.ts';

export interface PlacementContext {
  nodes: Record<string, NodeRecord>;
  /** Creates sent to a node and not yet answered: heartbeats lag, so count them ourselves. */
  pending: Record<string, { cpu: number; memoryMiB: number; sandboxes: number }>;
}

export type PlacementEvent =
  | { type: 'NODE_SEEN'; record: NodeRecord }
  | { type: 'NODE_GONE'; node: string }
  | { type: 'SENT'; node: string; cpu: number; memoryMiB: number }
  | { type: 'SETTLED'; node: string; cpu: number; memoryMiB: number };

/** A node is live while its last heartbeat is younger than three periods (and 5 s: a busy host's timers slip). */
export function isLive(r: NodeRecord, now: number): boolean {
  return r.state === 'serving' && now - r.ts < Math.max(3 * r.heartbeatMs, 5000);
}

export type Ranking = { nodes: string[]; reason?: string };

/**
 * Nodes that could take `spec`, best first: the one with the largest free share of its scarcest
 * resource. Ties are broken at random so that replicas do not herd onto one node.
 */
export function rank(ctx: PlacementContext, spec: SandboxSpec, now: number, random = Math.random): Ranking {
  const live = Object.values(ctx.nodes).filter((r) => isLive(r, now));
  if (live.length === 0) return { nodes: [], reason: 'no live node' };
  const withBackend = live.filter((r) => r.backends.includes(spec.backend));
  if (withBackend.length === 0) return { nodes: [], reason: `no live node offers backend '${spec.backend}'` };
  // A composed rootfs needs every image it is made of.
  const wanted = [spec.image, spec.toolkit, spec.workspace].filter((x): x is string => x !== undefined);
  const withImage = withBackend.filter((r) => wanted.every((w) => r.images.includes(w)));
  if (withImage.length === 0) return { nodes: [], reason: `no live node has image${wanted.length > 1 ? 's' : ''} '${wanted.join("', '")}'` };
  const pinned = spec.node ? withImage.filter((r) => r.node === spec.node) : withImage;
  if (pinned.length === 0) return { nodes: [], reason: `node '${spec.node}' is not live or lacks the image` };
  const scored = pinned.map((r) => {
    const p = ctx.pending[r.node] ?? { cpu: 0, memoryMiB: 0, sandboxes: 0 };
    const freeCpu = (r.capacity.cpu - r.allocated.cpu - p.cpu - spec.cpu) / r.capacity.cpu;
    const freeMem = (r.capacity.memoryMiB - r.allocated.memoryMiB - p.memoryMiB - spec.memoryMiB) / r.capacity.memoryMiB;
    const freeCount = (r.capacity.sandboxes - r.sandboxes - p.sandboxes - 1) / r.capacity.sandboxes;
    return { node: r.node, score: Math.min(freeCpu, freeMem, freeCount), tie: random() };
  });
  const fitting = scored.filter((s) => s.score >= 0);
  // Nodes that look full still come last: their heartbeat may be stale, and admission decides.
  const order = [...fitting.sort((a, b) => b.score - a.score || a.tie - b.tie), ...scored.filter((s) => s.score < 0)];
  return { nodes: order.map((s) => s.node) };
}

export const placementMachine = setup({
  types: {
    context: {} as PlacementContext,
    events: {} as PlacementEvent,
  },
}).createMachine({
  id: 'placement',
  context: { nodes: {}, pending: {} },
  on: {
    NODE_SEEN: { actions: assign({ nodes: ({ context, event }) => ({ ...context.nodes, [event.record.node]: event.record }) }) },
    NODE_GONE: {
      actions: assign({
        nodes: ({ context, event }) => {
          const { [event.node]: _, ...rest } = context.nodes;
          return rest;
        },
      }),
    },
    SENT: { actions: assign({ pending: ({ context, event }) => bump(context.pending, event.node, event.cpu, event.memoryMiB, 1) }) },
    SETTLED: { actions: assign({ pending: ({ context, event }) => bump(context.pending, event.node, -event.cpu, -event.memoryMiB, -1) }) },
  },
});

function bump(pending: PlacementContext['pending'], node: string, cpu: number, memoryMiB: number, n: number): PlacementContext['pending'] {
  const p = pending[node] ?? { cpu: 0, memoryMiB: 0, sandboxes: 0 };
  const next = { cpu: p.cpu + cpu, memoryMiB: p.memoryMiB + memoryMiB, sandboxes: p.sandboxes + n };
  if (next.sandboxes <= 0) {
    const { [node]: _, ...rest } = pending;
    return rest;
  }
  return { ...pending, [node]: next };
}
