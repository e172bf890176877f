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
  /**
   * Sandboxes of each group this replica placed, by node: what `spread` and `pack` go by. A
   * replica's own view (others place too, and kills are not counted down): a preference, not a
   * rule — admission still decides.
   */
  groups?: Record<string, Record<string, number>>;
}

export type PlacementEvent =
  | { type: 'NODE_SEEN'; record: NodeRecord }
  | { type: 'NODE_GONE'; node: string }
  | { type: 'SENT'; node: string; cpu: number; memoryMiB: number }
  | { type: 'SETTLED'; node: string; cpu: number; memoryMiB: number }
  | { type: 'PLACED'; node: string; group: string };

/** Candidates scored per create once there are more than twice as many: best of K, as E2B samples. */
export const SAMPLE_K = 8;
/** Groups a replica remembers placements of; the oldest is forgotten past this. */
const GROUPS_KEPT = 1000;

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
 * Nodes that could take `spec`, best first. A sandbox of a group goes by the group's placement
 * policy first (`spread`: the node with fewest of the group; `pack`: the one with most, while it
 * fits), then by the largest free share of the scarcest resource in the pool of the spec's backend
 * kind. Past 2 × SAMPLE_K nodes only a random sample is scored (all of them when none in it fits).
 * Ties are broken at random so that replicas do not herd onto one node.
 */
export function rank(ctx: PlacementContext, spec: SandboxSpec, now: number, random = Math.random, everyNode = false): Ranking {
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
  const placed = spec.group ? ctx.groups?.[spec.group] : undefined;
  const policy = spec.placement ?? 'spread';
  // Best of K: scoring every node per create is what a fleet of hundreds cannot afford, and
  // replicas that all pick the single best herd onto it. Nodes holding the group come along for
  // `pack` (it wants them); for `spread` a sample is already spread.
  let candidates = pinned;
  if (!everyNode && pinned.length > 2 * SAMPLE_K) {
    candidates = sample(pinned, SAMPLE_K, random);
    if (placed && policy === 'pack') for (const r of pinned) if (placed[r.node] && !candidates.includes(r)) candidates.push(r);
  }
  const scored = candidates.map((r) => {
    const { capacity: c, allocated: a } = offerOf(r, spec.backend) as BackendOffer;
    // Creates in flight count against every pool of the node: the replica does not track kinds.
    const p = ctx.pending[r.node] ?? { cpu: 0, memoryMiB: 0, sandboxes: 0 };
    const freeCpu = (c.cpu - a.cpu - p.cpu - spec.cpu) / c.cpu;
    const freeMem = (c.memoryMiB - a.memoryMiB - p.memoryMiB - spec.memoryMiB) / c.memoryMiB;
    const freeCount = (c.sandboxes - a.sandboxes - p.sandboxes - 1) / c.sandboxes;
    return { node: r.node, score: Math.min(freeCpu, freeMem, freeCount), group: placed?.[r.node] ?? 0, tie: random() };
  });
  const fitting = scored.filter((s) => s.score >= 0);
  if (fitting.length === 0 && candidates !== pinned) return rank(ctx, spec, now, random, true);
  // spread: fewest of the group first; pack: most of the group first (while it fits); then the
  // most free room. Nodes that look full still come last: their heartbeat may be stale, and
  // admission decides.
  const byGroup = (a: { group: number }, b: { group: number }) => (policy === 'pack' ? b.group - a.group : a.group - b.group);
  const order = [...fitting.sort((a, b) => byGroup(a, b) || b.score - a.score || a.tie - b.tie), ...scored.filter((s) => s.score < 0)];
  return { nodes: order.map((s) => s.node) };
}

/** `k` distinct members of `xs`, at random (a partial Fisher–Yates shuffle of a copy). */
function sample<T>(xs: readonly T[], k: number, random: () => number): T[] {
  const a = [...xs];
  for (let i = 0; i < k && i < a.length; i++) {
    const j = i + Math.floor(random() * (a.length - i));
    [a[i], a[j]] = [a[j] as T, a[i] as T];
  }
  return a.slice(0, k);
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
    // In place, as placedIn: a fleet of 160 nodes heartbeats 80 times a second, and a copy of the
    // table at each was work in proportion to the fleet for every replica.
    NODE_SEEN: {
      actions: assign({
        nodes: ({ context, event }) => {
          context.nodes[event.record.node] = event.record;
          return context.nodes;
        },
      }),
    },
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
    PLACED: { actions: assign({ groups: ({ context, event }) => placedIn(context.groups ?? {}, event.group, event.node) }) },
  },
});

/**
 * Counts a placement, in place: copying the map at every create of a burst of thousands would
 * cost more than the placement itself. The group seen longest ago is forgotten past GROUPS_KEPT.
 */
function placedIn(groups: NonNullable<PlacementContext['groups']>, group: string, node: string): NonNullable<PlacementContext['groups']> {
  let g = groups[group];
  if (!g) {
    const keys = Object.keys(groups);
    if (keys.length >= GROUPS_KEPT) delete groups[keys[0] as string];
    g = {};
    groups[group] = g;
  }
  g[node] = (g[node] ?? 0) + 1;
  return groups;
}

/**
 * Counts a create in flight to `node`, in place: two copies of the map per create (SENT, SETTLED)
 * were 5% of a fleet process's CPU with 160 nodes in it (ops/bench/scale.ts --profile).
 */
function bump(pending: PlacementContext['pending'], node: string, cpu: number, memoryMiB: number, n: number): PlacementContext['pending'] {
  const p = pending[node] ?? { cpu: 0, memoryMiB: 0, sandboxes: 0 };
  const next = { cpu: p.cpu + cpu, memoryMiB: p.memoryMiB + memoryMiB, sandboxes: p.sandboxes + n };
  if (next.sandboxes <= 0) delete pending[node];
  else pending[node] = next;
  return pending;
}
