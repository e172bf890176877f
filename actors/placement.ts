/**
 * The placement machine: keeps the table of live nodes (fed from the `pdk_nodes` KV watch) and the
 * creates this replica has in flight, and ranks nodes for a spec. Stateless across replicas: any
 * replica may answer, node admission arbitrates.
 */
import { assign, setup } from 'xstate';
import type { BackendKind, BackendOffer, NodeRecord, SandboxSpec } from '../protocol/index.ts';

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
 * The pool a node offers for `kind`: its own when the record lists offers per kind, else the whole
 * node's (records of nodes from before offers).
 */
export function offerOf(r: NodeRecord, kind: BackendKind): BackendOffer | undefined {
  if (r.offers) return r.offers[kind];
  if (!r.backends.includes(kind)) return undefined;
  return { capacity: r.capacity, allocated: { ...r.allocated, sandboxes: r.sandboxes } };
}

/**
 * Nodes that could take `spec`, best first: the one with the largest free share of its scarcest
 * resource in the pool of the spec's backend kind. Ties are broken at random so that replicas do
 * not herd onto one node.
 */
export function rank(ctx: PlacementContext, spec: SandboxSpec, now: number, random = Math.random): Ranking {
  const live = Object.values(ctx.nodes).filter((r) => isLive(r, now));
  if (live.length === 0) return { nodes: [], reason: 'no live node' };
  const withBackend = live.filter((r) => offerOf(r, spec.backend) !== undefined);
  if (withBackend.length === 0) return { nodes: [], reason: `no live node offers backend '${spec.backend}'` };
  // A composed rootfs needs every image it is made of.
  const wanted = [spec.image, spec.toolkit, spec.workspace].filter((x): x is string => x !== undefined);
  const withImage = withBackend.filter((r) => wanted.every((w) => r.images.includes(w)));
  if (withImage.length === 0) return { nodes: [], reason: `no live node has image${wanted.length > 1 ? 's' : ''} '${wanted.join("', '")}'` };
  const pinned = spec.node ? withImage.filter((r) => r.node === spec.node) : withImage;
  if (pinned.length === 0) return { nodes: [], reason: `node '${spec.node}' is not live or lacks the image` };
  const scored = pinned.map((r) => {
    const { capacity: c, allocated: a } = offerOf(r, spec.backend) as BackendOffer;
    // Creates in flight count against every pool of the node: the replica does not track kinds.
    const p = ctx.pending[r.node] ?? { cpu: 0, memoryMiB: 0, sandboxes: 0 };
    const freeCpu = (c.cpu - a.cpu - p.cpu - spec.cpu) / c.cpu;
    const freeMem = (c.memoryMiB - a.memoryMiB - p.memoryMiB - spec.memoryMiB) / c.memoryMiB;
    const freeCount = (c.sandboxes - a.sandboxes - p.sandboxes - 1) / c.sandboxes;
    return { node: r.node, score: Math.min(freeCpu, freeMem, freeCount), tie: random() };
  });
  const fitting = scored.filter((s) => s.score >= 0);
  // Nodes that look full still come last: their heartbeat may be stale, and admission decides.
  const order = [...fitting.sort((a, b) => b.score - a.score || a.tie - b.tie), ...scored.filter((s) => s.score < 0)];
  return { nodes: order.map((s) => s.node) };
}

/** Whether `node` seems to have room for `spec` in its pool, creates in flight counted: worth trying for a create that waits. */
export function hasRoom(ctx: PlacementContext, node: string, spec: SandboxSpec): boolean {
  const r = ctx.nodes[node];
  const o = r && offerOf(r, spec.backend);
  if (!o) return false;
  const p = ctx.pending[node] ?? { cpu: 0, memoryMiB: 0, sandboxes: 0 };
  const { capacity: c, allocated: a } = o;
  return a.cpu + p.cpu + spec.cpu <= c.cpu && a.memoryMiB + p.memoryMiB + spec.memoryMiB <= c.memoryMiB && a.sandboxes + p.sandboxes + 1 <= c.sandboxes;
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
