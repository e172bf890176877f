/**
 * The bridge machine: from what is on the wire (creates that wait for capacity, the node table) it
 * decides when to add machines, when they have joined, and when an idle one is drained and
 * released. It does no I/O: the host feeds it observations and the answers of the provider, and
 * carries out the effects it names (`provision`, `drain`, `release`, `decide`).
 *
 *   watching → scalingUp → waitingForNodes → coolingDown → watching
 *   watching → draining → releasing → watching
 *
 * The phase is the bridge's; each machine also has a state of its own in the context, since
 * machines of one scale-up join at different times.
 */
import { assign, enqueueActions, setup } from 'xstate';

/** What one machine offers once its node runs: the node's capacity for the kinds it serves. */
export interface Shape {
  cpu: number;
  memoryMiB: number;
  sandboxes: number;
}

export interface Policy {
  shape: Shape;
  /** Machines the bridge runs at most. */
  maxMachines: number;
  /** Machines the bridge may start over its life (a budget); Infinity: no limit. */
  budgetMachines: number;
  /** Extra share of the demand to add (0.25: a quarter more), so a rising burst needs fewer rounds. */
  headroom: number;
  /** After machines join, how long to let placement fill them before deciding again. */
  cooldownMs: number;
  /** A machine with no sandbox this long, while nothing waits, is drained and released. */
  idleMs: number;
  /** A machine whose node has not joined this long after it was provisioned is released as failed. */
  joinDeadlineMs: number;
  /** After a provider failure, how long the bridge says it cannot add machines before trying again. */
  failureBackoffMs: number;
}

export type MachineState = 'provisioning' | 'joining' | 'ready' | 'draining' | 'releasing';

export interface Machine {
  id: string;
  state: MachineState;
  /** When it entered its state. */
  since: number;
  createdAt: number;
  /** Since when its node has had no sandbox (while ready). */
  idleSince?: number;
  /** Since when every sandbox its node has (none, or only ones created `migratable`) may leave it (while ready). */
  drainableSince?: number;
}

/** Demand: creates that wait, summed over placement replicas. */
export interface Demand {
  count: number;
  cpu: number;
  memoryMiB: number;
}

/** A node as the bridge needs it, from the node table. */
export interface NodeView {
  live: boolean;
  state: 'serving' | 'draining';
  sandboxes: number;
  /** Of those, how many were created `migratable`: a drain moves them to other nodes. */
  migratable?: number;
  /** Sandboxes it could still admit (capacity less allocated). */
  free?: number;
}

export interface Decision {
  ts: number;
  action: 'scale-up' | 'joined' | 'drain' | 'undrain' | 'release' | 'provider-failed' | 'join-timeout' | 'cannot-provision' | 'adopt';
  reason: string;
  machines: string[];
}

export interface BridgeContext {
  policy: Policy;
  machines: Record<string, Machine>;
  demand: Demand;
  now: number;
  /** Machines started over the bridge's life (adopted ones count). */
  started: number;
  failures: number;
  /** While set and in the future, the bridge cannot add machines, for this reason. */
  blocked?: { reason: string; until: number };
  coolUntil: number;
  /** Source of machine ids: the host gives a prefix, the machine numbers. */
  prefix: string;
  seq: number;
  /** The node table as last observed. */
  nodes: Record<string, NodeView>;
}

export type BridgeEvent =
  | { type: 'OBSERVE'; now: number; demand: Demand; nodes: Record<string, NodeView> }
  | { type: 'PROVISIONED'; id: string; now: number }
  | { type: 'PROVISION_FAILED'; id: string; reason: string; now: number }
  | { type: 'RELEASED'; id: string; now: number }
  | { type: 'ADOPT'; machines: { id: string; createdAt: number }[]; now: number }
  /** A drain could not move every sandbox (no room elsewhere after all): the machine serves again, and is tried again after the idle time. */
  | { type: 'DRAIN_INCOMPLETE'; id: string; reason: string; now: number };

/** Machines needed for `demand` beyond those already on their way, within policy. */
export function machinesNeeded(ctx: BridgeContext): { add: number; wanted: number; limit?: string } {
  const { demand, policy } = ctx;
  if (demand.count === 0) return { add: 0, wanted: 0 };
  const s = policy.shape;
  const need = Math.max(demand.count / s.sandboxes, demand.cpu / s.cpu, demand.memoryMiB / s.memoryMiB) * (1 + policy.headroom);
  const coming = Object.values(ctx.machines).filter((m) => m.state === 'provisioning' || m.state === 'joining').length;
  const wanted = Math.max(0, Math.ceil(need - 1e-9) - coming);
  const running = Object.values(ctx.machines).filter((m) => m.state !== 'releasing').length;
  const room = Math.min(policy.maxMachines - running, policy.budgetMachines - ctx.started);
  if (wanted > 0 && room <= 0) {
    const limit = policy.maxMachines - running <= 0 ? `the bridge runs its maximum of ${policy.maxMachines} machines` : `the budget of ${policy.budgetMachines} machines is spent`;
    return { add: 0, wanted, limit };
  }
  return { add: Math.min(wanted, Math.max(0, room)), wanted };
}

/** Whether the bridge can add machines now, and if not why: what placement tells waiting creates. */
export function canProvision(ctx: BridgeContext): { ok: boolean; reason?: string } {
  if (ctx.blocked && ctx.blocked.until > ctx.now) return { ok: false, reason: ctx.blocked.reason };
  const coming = Object.values(ctx.machines).some((m) => m.state === 'provisioning' || m.state === 'joining');
  // A machine that joined and holds nothing yet is capacity placement has not used: the create
  // it was started for may still be on its way there. Saying "cannot" then failed that very
  // create (seen in a fresh CI run, the machine's join and placement's try a moment apart).
  const spare = Object.values(ctx.machines).some((m) => m.state === 'ready' && m.idleSince !== undefined);
  const n = machinesNeeded(ctx);
  // At the limit with nothing on its way and nothing free, no capacity is coming.
  if (n.limit && !coming && !spare) return { ok: false, reason: n.limit };
  return { ok: true };
}

/**
 * Machines to drain: no create waits, and for the idle time each has held nothing but sandboxes
 * created `migratable`, for which the other serving nodes have room (taken oldest first, each
 * one's sandboxes counted against the room before the next).
 */
function idleOnes(ctx: BridgeContext): Machine[] {
  if (ctx.demand.count > 0) return [];
  const ready = Object.values(ctx.machines)
    .filter((m) => m.state === 'ready' && m.drainableSince !== undefined && ctx.now - m.drainableSince >= ctx.policy.idleMs)
    .sort((a, b) => (a.drainableSince as number) - (b.drainableSince as number));
  const chosen: Machine[] = [];
  const leaving = new Set(ready.map((m) => m.id));
  let room = 0;
  for (const [id, n] of Object.entries(ctx.nodes)) if (n.live && n.state === 'serving' && !leaving.has(id)) room += Math.max(0, n.free ?? 0);
  for (const m of ready) {
    const need = ctx.nodes[m.id]?.sandboxes ?? 0;
    if (need > room) continue;
    room -= need;
    chosen.push(m);
  }
  return chosen;
}

function withState(ms: Record<string, Machine>, id: string, state: MachineState, now: number): Record<string, Machine> {
  const m = ms[id];
  if (!m) return ms;
  return { ...ms, [id]: { ...m, state, since: now, idleSince: undefined, drainableSince: undefined } };
}

/** Sandboxes a drain would have to wait for: those not created `migratable`. */
function mustStay(n: NodeView): number {
  return n.sandboxes - Math.min(n.sandboxes, n.migratable ?? 0);
}

/** Folds an observation of the node table into the machines: joined, idle, busy. */
function observeNodes(ms: Record<string, Machine>, nodes: Record<string, NodeView>, now: number): Record<string, Machine> {
  const out: Record<string, Machine> = {};
  for (const m of Object.values(ms)) {
    const n = nodes[m.id];
    if (m.state === 'joining' && n?.live && n.state === 'serving') out[m.id] = { ...m, state: 'ready', since: now, idleSince: n.sandboxes === 0 ? now : undefined, drainableSince: mustStay(n) === 0 ? now : undefined };
    else if (m.state === 'ready' && n) out[m.id] = { ...m, idleSince: n.sandboxes > 0 ? undefined : (m.idleSince ?? now), drainableSince: mustStay(n) > 0 ? undefined : (m.drainableSince ?? now) };
    else out[m.id] = m;
  }
  return out;
}

/** The effects the host carries out. */
type Effect =
  | { type: 'provision'; params: { id: string; shape: Shape } }
  | { type: 'drain'; params: { id: string } }
  | { type: 'release'; params: { id: string; why: string } }
  | { type: 'decide'; params: Decision };
// Actions defined inside setup() cannot name their siblings in enqueue's types: this one cast keeps the effects typed.
const fx = (enqueue: unknown, e: Effect) => (enqueue as (e: Effect) => void)(e);

export const bridgeMachine = setup({
  types: {
    context: {} as BridgeContext,
    events: {} as BridgeEvent,
    input: {} as { policy: Policy; prefix: string },
  },
  actions: {
    /** Ask the provider for a machine of the policy's shape, named `id`; answer with PROVISIONED or PROVISION_FAILED. */
    provision: (_, _p: { id: string; shape: Shape }) => {},
    /** Cordon the machine's node: placement skips it from now on. */
    drain: (_, _p: { id: string }) => {},
    /** Stop the machine's node and give the machine back; answer with RELEASED. */
    release: (_, _p: { id: string; why: string }) => {},
    /** Publish and record a decision with its reason. */
    decide: (_, _p: Decision) => {},
    observe: assign(({ context, event }) => {
      if (event.type !== 'OBSERVE') return {};
      return { now: event.now, demand: event.demand, nodes: event.nodes, machines: observeNodes(context.machines, event.nodes, event.now) };
    }),
    scaleUp: enqueueActions(({ context, enqueue }) => {
      const { add } = machinesNeeded(context);
      const ids: string[] = [];
      const machines = { ...context.machines };
      let seq = context.seq;
      for (let i = 0; i < add; i++) {
        const id = `${context.prefix}${++seq}`;
        ids.push(id);
        machines[id] = { id, state: 'provisioning', since: context.now, createdAt: context.now };
      }
      enqueue.assign({ machines, seq, started: context.started + add });
      const d = context.demand;
      fx(enqueue, { type: 'decide', params: { ts: context.now, action: 'scale-up', reason: `${d.count} creates wait (${d.cpu} CPU, ${d.memoryMiB} MiB) that no node can admit; adding ${add} machine${add === 1 ? '' : 's'} of ${context.policy.shape.sandboxes} sandboxes`, machines: ids } });
      for (const id of ids) fx(enqueue, { type: 'provision', params: { id, shape: context.policy.shape } });
    }),
    drainIdle: enqueueActions(({ context, enqueue }) => {
      const idle = idleOnes(context);
      let machines = context.machines;
      for (const m of idle) machines = withState(machines, m.id, 'draining', context.now);
      enqueue.assign({ machines });
      fx(enqueue, { type: 'decide', params: { ts: context.now, action: 'drain', reason: `no create waits and ${idle.length === 1 ? 'this machine has' : 'these machines have'} had no sandbox for ${context.policy.idleMs} ms but ones created migratable, which the drain moves to other nodes`, machines: idle.map((m) => m.id) } });
      for (const m of idle) fx(enqueue, { type: 'drain', params: { id: m.id } });
    }),
    releaseDrained: enqueueActions(({ context, event, enqueue }) => {
      if (event.type !== 'OBSERVE') return;
      let machines = context.machines;
      for (const m of Object.values(context.machines)) {
        if (m.state !== 'draining') continue;
        const n = event.nodes[m.id];
        // Cordoned and empty (or gone): its sandboxes have finished.
        if (n && !(n.state === 'draining' && n.sandboxes === 0)) continue;
        machines = withState(machines, m.id, 'releasing', context.now);
        fx(enqueue, { type: 'decide', params: { ts: context.now, action: 'release', reason: 'drained: cordoned with no sandbox left', machines: [m.id] } });
        fx(enqueue, { type: 'release', params: { id: m.id, why: 'drained' } });
      }
      enqueue.assign({ machines });
    }),
    joinTimeouts: enqueueActions(({ context, enqueue }) => {
      let machines = context.machines;
      let failures = context.failures;
      for (const m of Object.values(context.machines)) {
        if (m.state !== 'joining' || context.now - m.since < context.policy.joinDeadlineMs) continue;
        machines = withState(machines, m.id, 'releasing', context.now);
        failures++;
        fx(enqueue, { type: 'decide', params: { ts: context.now, action: 'join-timeout', reason: `its node did not join within ${context.policy.joinDeadlineMs} ms: released and counted as a provider failure`, machines: [m.id] } });
        fx(enqueue, { type: 'release', params: { id: m.id, why: 'join timeout' } });
      }
      enqueue.assign({ machines, failures });
    }),
    reportLimit: enqueueActions(({ context, enqueue }) => {
      const n = machinesNeeded(context);
      if (n.limit && !canProvision(context).ok) {
        // Said once per blocked spell: the state message carries it every second anyway.
        if (context.blocked?.reason !== n.limit) {
          enqueue.assign({ blocked: { reason: n.limit, until: context.now } });
          fx(enqueue, { type: 'decide', params: { ts: context.now, action: 'cannot-provision', reason: n.limit, machines: [] } });
        }
      }
    }),
  },
  guards: {
    needsMachines: ({ context }) => machinesNeeded(context).add > 0 && canProvision(context).ok,
    hasIdle: ({ context }) => idleOnes(context).length > 0,
    noneProvisioning: ({ context }) => !Object.values(context.machines).some((m) => m.state === 'provisioning'),
    noneJoining: ({ context }) => !Object.values(context.machines).some((m) => m.state === 'joining'),
    cooled: ({ context }) => context.now >= context.coolUntil,
    noneDraining: ({ context }) => !Object.values(context.machines).some((m) => m.state === 'draining'),
    noneReleasing: ({ context }) => !Object.values(context.machines).some((m) => m.state === 'releasing'),
  },
}).createMachine({
  id: 'bridge',
  context: ({ input }) => ({ policy: input.policy, prefix: input.prefix, machines: {}, demand: { count: 0, cpu: 0, memoryMiB: 0 }, now: 0, started: 0, failures: 0, coolUntil: 0, seq: 0, nodes: {} }),
  initial: 'watching',
  on: {
    // Observations update what the bridge knows in every phase; each phase then decides.
    OBSERVE: { actions: ['observe', 'joinTimeouts'] },
    ADOPT: {
      actions: enqueueActions(({ context, event, enqueue }) => {
        const machines = { ...context.machines };
        for (const m of event.machines) if (!machines[m.id]) machines[m.id] = { id: m.id, state: 'joining', since: event.now, createdAt: m.createdAt };
        enqueue.assign({ machines, started: context.started + event.machines.length });
        if (event.machines.length > 0) enqueue({ type: 'decide', params: { ts: event.now, action: 'adopt', reason: 'machines the provider lists under this bridge tag, started by an earlier leader', machines: event.machines.map((m) => m.id) } });
      }),
    },
    PROVISION_FAILED: {
      actions: enqueueActions(({ context, event, enqueue }) => {
        const { [event.id]: _, ...machines } = context.machines;
        const reason = `provider failed to start machine ${event.id}: ${event.reason}`;
        enqueue.assign({ machines, failures: context.failures + 1, blocked: { reason, until: event.now + context.policy.failureBackoffMs } });
        enqueue({ type: 'decide', params: { ts: event.now, action: 'provider-failed', reason, machines: [event.id] } });
        // Whatever the provider made of it before failing goes back: nothing is left orphaned.
        enqueue({ type: 'release', params: { id: event.id, why: 'provision failed' } });
      }),
    },
    RELEASED: {
      actions: assign({
        machines: ({ context, event }) => {
          const { [event.id]: _, ...rest } = context.machines;
          return rest;
        },
      }),
    },
    PROVISIONED: { actions: assign({ machines: ({ context, event }) => withState(context.machines, event.id, 'joining', event.now) }) },
    DRAIN_INCOMPLETE: {
      actions: enqueueActions(({ context, event, enqueue }) => {
        const m = context.machines[event.id];
        if (m?.state !== 'draining') return;
        enqueue.assign({ machines: { ...context.machines, [m.id]: { ...m, state: 'ready', since: event.now, drainableSince: event.now } } });
        enqueue({ type: 'decide', params: { ts: event.now, action: 'undrain', reason: `its drain could not move every sandbox (${event.reason}): it serves again, and is tried again after the idle time`, machines: [m.id] } });
      }),
    },
  },
  states: {
    watching: {
      on: {
        OBSERVE: [
          { guard: 'needsMachines', target: 'scalingUp', actions: ['observe', 'joinTimeouts', 'scaleUp'] },
          { guard: 'hasIdle', target: 'draining', actions: ['observe', 'joinTimeouts', 'drainIdle'] },
          { actions: ['observe', 'joinTimeouts', 'reportLimit'] },
        ],
      },
    },
    scalingUp: {
      always: [
        { guard: 'noneProvisioning', target: 'waitingForNodes' },
      ],
    },
    waitingForNodes: {
      always: { guard: 'noneJoining', target: 'coolingDown', actions: assign({ coolUntil: ({ context }) => context.now + context.policy.cooldownMs }) },
      on: { OBSERVE: { actions: ['observe', 'joinTimeouts'] } },
    },
    coolingDown: {
      on: {
        OBSERVE: [{ guard: 'cooled', target: 'watching', actions: ['observe', 'joinTimeouts'] }, { actions: ['observe', 'joinTimeouts'] }],
      },
    },
    draining: {
      always: { guard: 'noneDraining', target: 'releasing' },
      on: { OBSERVE: { actions: ['observe', 'joinTimeouts', 'releaseDrained'] } },
    },
    releasing: {
      always: { guard: 'noneReleasing', target: 'watching' },
    },
  },
});
