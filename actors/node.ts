/**
 * The node supervisor machine: admission and capacity accounting for one node, whether it serves
 * or drains, and whether it is under memory pressure. Admission is the last word on placement —
 * two placement replicas racing for one node cannot overfill it, because every create passes
 * through this one actor's `ADMIT`, one event at a time. Each backend kind the node offers has a
 * pool of its own (a simulated backend's virtual resources are not the host's).
 *
 *   admission: serving ⇄ draining (DRAIN / UNDRAIN) → stopped (STOP)
 *   memory:    normal ⇄ pressure (PRESSURE / RELIEVED)
 *
 * The host (node-host.ts) does the effects: it asks `can(ADMIT)` before it starts a sandbox, then
 * `can(CREATE_BEGIN)` before its backend create (creates beyond a few at once only slow each other
 * down; the rest wait in the host, first come first served), and hibernates the victims
 * `pickVictims` names while `memory` is `pressure`.
 */
import { assign, setup } from 'xstate';
import type { BackendKind, Resources } from '../protocol/index.ts';

export interface Pool {
  capacity: Resources;
  allocated: Resources;
}

export interface NodeContext {
  /** Sums over the pools (the node record's `capacity` and `allocated`). */
  capacity: Resources;
  allocated: Resources;
  pools: Partial<Record<BackendKind, Pool>>;
  /**
   * Resources held by each admitted sandbox, until it is released. Updated in place: copying a
   * record of 3,200 holds on every admission and release cost the node ~0.3–0.5 ms per create
   * (measured); nothing keeps an earlier snapshot's holds.
   */
  holds: Map<string, { kind: BackendKind; need: Resources }>;
  /** Backend creates running now, and how many may run at once (the rest wait their turn in the host). */
  creates: { running: number; max: number };
}

export type NodeEvent =
  | { type: 'ADMIT'; id: string; kind: BackendKind; need: Resources }
  | { type: 'RELEASE'; id: string }
  /** An admitted sandbox's backend create starts (refused while `max` run), or has ended. */
  | { type: 'CREATE_BEGIN' }
  | { type: 'CREATE_END' }
  | { type: 'DRAIN' }
  | { type: 'UNDRAIN' }
  | { type: 'STOP' }
  /** The memory monitor's reading crossed the threshold (up), or fell back under the release mark. */
  | { type: 'PRESSURE'; reading: string }
  | { type: 'RELIEVED' };

/** A sandbox as the pressure policy sees it. */
export interface Sleeper {
  id: string;
  qos: 'ls' | 'be';
  state: string;
  /** ms since epoch of its last exec or file call; 0 while one is in flight. */
  idleSince: number;
}

/**
 * Whom to hibernate under memory pressure: best-effort sandboxes that are running and idle,
 * longest idle first. Latency-sensitive ones are never chosen; neither is one with a call in flight.
 */
export function pickVictims(sandboxes: Sleeper[], now: number, minIdleMs: number): string[] {
  return sandboxes
    .filter((s) => s.qos === 'be' && s.state === 'running' && s.idleSince > 0 && now - s.idleSince >= minIdleMs)
    .sort((a, b) => a.idleSince - b.idleSince)
    .map((s) => s.id);
}

const zero = (): Resources => ({ cpu: 0, memoryMiB: 0, sandboxes: 0 });

/** Why `need` does not fit in the pool of `kind` (null when it does). Pure: used by the guard and to explain refusals. */
export function refusal(ctx: NodeContext, kind: BackendKind, need: Resources): string | null {
  const pool = ctx.pools[kind];
  if (!pool) return `this node offers no '${kind}' backend`;
  for (const k of COUNTED) {
    const cap = pool.capacity[k];
    if (cap === undefined) continue;
    const free = cap - (pool.allocated[k] ?? 0);
    // A small epsilon: CPU is fractional and sums of 0.1 drift.
    if ((need[k] ?? 0) > free + 1e-9) return `${k}: need ${need[k]}, free ${Math.max(0, round(free))} of ${cap}`;
  }
  return null;
}

const round = (x: number) => Math.round(x * 1000) / 1000;

/** What admission counts; pids and diskMiB only on nodes whose capacity names them. */
const COUNTED = ['cpu', 'memoryMiB', 'sandboxes', 'pids', 'diskMiB'] as const;

function add(a: Resources, b: Resources, sign: 1 | -1): Resources {
  const r: Resources = {
    cpu: round(a.cpu + sign * b.cpu),
    memoryMiB: a.memoryMiB + sign * b.memoryMiB,
    sandboxes: a.sandboxes + sign * b.sandboxes,
  };
  if (a.pids !== undefined || b.pids !== undefined) r.pids = (a.pids ?? 0) + sign * (b.pids ?? 0);
  if (a.diskMiB !== undefined || b.diskMiB !== undefined) r.diskMiB = (a.diskMiB ?? 0) + sign * (b.diskMiB ?? 0);
  return r;
}

export const nodeMachine = setup({
  types: {
    context: {} as NodeContext,
    input: {} as { pools: Partial<Record<BackendKind, Resources>>; createConcurrency?: number },
    events: {} as NodeEvent,
  },
  guards: {
    fits: ({ context, event }) => event.type === 'ADMIT' && !context.holds.has(event.id) && refusal(context, event.kind, event.need) === null,
    holds: ({ context, event }) => event.type === 'RELEASE' && context.holds.has(event.id),
    createSlot: ({ context }) => context.creates.running < context.creates.max,
  },
  actions: {
    // Pools are updated in place, like `holds` (see there).
    hold: assign(({ context, event }) => {
      if (event.type !== 'ADMIT') return {};
      context.holds.set(event.id, { kind: event.kind, need: event.need });
      const pool = context.pools[event.kind] as Pool;
      pool.allocated = add(pool.allocated, event.need, 1);
      return { allocated: add(context.allocated, event.need, 1) };
    }),
    release: assign(({ context, event }) => {
      if (event.type !== 'RELEASE') return {};
      const held = context.holds.get(event.id);
      if (!held) return {};
      context.holds.delete(event.id);
      const pool = context.pools[held.kind];
      if (pool) pool.allocated = add(pool.allocated, held.need, -1);
      return { allocated: add(context.allocated, held.need, -1) };
    }),
    // In place, as the holds: a create's two events must not copy the context.
    beginCreate: ({ context }) => {
      context.creates.running++;
    },
    endCreate: ({ context }) => {
      context.creates.running = Math.max(0, context.creates.running - 1);
    },
  },
}).createMachine({
  id: 'node',
  type: 'parallel',
  context: ({ input }) => {
    const pools: NodeContext['pools'] = {};
    let capacity = zero();
    for (const [kind, c] of Object.entries(input.pools) as Array<[BackendKind, Resources]>) {
      pools[kind] = { capacity: c, allocated: zero() };
      capacity = add(capacity, c, 1);
    }
    return { capacity, allocated: zero(), pools, holds: new Map(), creates: { running: 0, max: input.createConcurrency ?? Number.POSITIVE_INFINITY } };
  },
  on: {
    RELEASE: { guard: 'holds', actions: 'release' },
    CREATE_BEGIN: { guard: 'createSlot', actions: 'beginCreate' },
    CREATE_END: { actions: 'endCreate' },
  },
  states: {
    admission: {
      initial: 'serving',
      states: {
        serving: {
          on: {
            ADMIT: { guard: 'fits', actions: 'hold' },
            DRAIN: 'draining',
            STOP: 'stopped',
          },
        },
        // Draining: sandboxes keep running, no new ones are admitted, placement skips the node.
        draining: {
          on: { UNDRAIN: 'serving', STOP: 'stopped' },
        },
        stopped: { type: 'final' },
      },
    },
    // Under pressure the host hibernates idle best-effort sandboxes (pickVictims) until relieved.
    memory: {
      initial: 'normal',
      states: {
        normal: { on: { PRESSURE: 'pressure' } },
        pressure: { on: { RELIEVED: 'normal' } },
      },
    },
  },
});

export function admissionState(value: unknown): 'serving' | 'draining' | 'stopped' {
  return (value as { admission: 'serving' | 'draining' | 'stopped' }).admission;
}

export function underPressure(value: unknown): boolean {
  return (value as { memory: string }).memory === 'pressure';
}
