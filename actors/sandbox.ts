/**
 * The sandbox machine: one actor per sandbox. It decides; the backend does (through the injected
 * `create`, `pause`, `resume`, `hibernate`, `restore` and `destroy` actors); the binding in
 * `sandbox-host.ts` carries messages to and from NATS.
 *
 *   creating ──▶ live ─────────────────────────────────────────────▶ stopping ──▶ stopped
 *      │         ┌──────────────────────────────────────────────┐      ▲             
 *      │         │ running ⇄ pausing → paused → resuming ┐      │      │ KILL, ttl, idle kill,
 *      │         │    ▲  └──→ hibernating → hibernated   │      │──────┘ crash
 *      │         │    └──── restoring ◀──────────┘       │      │
 *      │         │    ◀──────────────────────────────────┘      │
 *      │         └──────────────────────────────────────────────┘
 *      └──error──▶ failed
 *
 * A sandbox a restarted node takes up (its backend kept it across the restart) goes from creating
 * straight to where the backend kept it: live.hibernated (a VM's saved state), or live.running or
 * live.paused (a container whose processes ran on without the node).
 *
 * The ttl (maximum lifetime) runs on `live` as a whole, so pausing does not stop the clock. The
 * idle timer runs only while `running` with no exec or file call in flight. A kill that arrives
 * while creating or hibernating waits for that step to finish, then stops the sandbox: never a
 * half-made or half-hibernated sandbox torn down under the backend's feet.
 *
 * A backend's create is all-or-nothing: when it fails it has already undone its partial work, so
 * `failed` straight from `creating` leaves nothing behind.
 */
import { assign, fromPromise, setup } from 'xstate';
import type { EndReason, IdleAction, SandboxState, SandboxVerb, WireError } from '../protocol/index.ts';
import { toWireError, verbAllowed } from '../protocol/index.ts';

export interface SandboxInput {
  id: string;
  ttlMs: number;
  /** No exec or file call for this long → `idleAction`. Absent: never idle out. */
  idleMs?: number;
  idleAction?: IdleAction;
  /**
   * Taken up by a restarted node: the backend holds it already, in this state (its create is a
   * no-op), and the actor starts there instead of in running.
   */
  adopted?: AdoptedState;
  /** Why it went to sleep, when it is taken up asleep (else `node_restarted`). */
  sleepReason?: string;
}

/** Where a backend kept a sandbox across its node's restart. */
export type AdoptedState = 'running' | 'paused' | 'hibernated';

export interface SandboxContext {
  id: string;
  ttlMs: number;
  idleMs?: number;
  idleAction: IdleAction;
  /** Exec and file calls in flight: the sandbox is not idle while any runs. */
  inflight: number;
  /** A kill that arrived while creating or hibernating; honoured once that step is done. */
  killRequested: boolean;
  reason?: EndReason;
  error?: WireError;
  /** Why the sandbox last paused or hibernated (`idle`, `pressure`, or a caller's request). */
  sleepReason?: string;
  /** What the last hibernation gave back. */
  released?: { bytes: number; swapped: boolean };
  adopted?: AdoptedState;
}

export type SandboxEvent =
  | { type: 'KILL'; reason?: EndReason }
  | { type: 'PAUSE'; why?: string }
  | { type: 'RESUME' }
  | { type: 'HIBERNATE'; why?: string }
  | { type: 'RESTORE' }
  | { type: 'ACTIVITY_START' }
  | { type: 'ACTIVITY_END' }
  /** The backend saw the sandbox die on its own (its init exited, the node lost it). */
  | { type: 'CRASHED'; error: WireError };

const idles = (c: SandboxContext) => c.idleMs !== undefined && c.inflight === 0;

/** Largest delay a JS timer can hold; an absent idle timeout waits "forever" behind a guard. */
const NEVER = 2 ** 31 - 1;

export const sandboxMachine = setup({
  types: {
    context: {} as SandboxContext,
    input: {} as SandboxInput,
    events: {} as SandboxEvent,
  },
  actors: {
    create: fromPromise<void, { id: string }>(async () => {
      throw new Error('sandbox machine: no create actor provided');
    }),
    destroy: fromPromise<void, { id: string; reason: EndReason }>(async () => {
      throw new Error('sandbox machine: no destroy actor provided');
    }),
    pause: fromPromise<void, { id: string }>(async () => {
      throw new Error('sandbox machine: no pause actor provided');
    }),
    resume: fromPromise<void, { id: string }>(async () => {
      throw new Error('sandbox machine: no resume actor provided');
    }),
    hibernate: fromPromise<{ bytes: number; swapped: boolean }, { id: string }>(async () => {
      throw new Error('sandbox machine: no hibernate actor provided');
    }),
    restore: fromPromise<void, { id: string }>(async () => {
      throw new Error('sandbox machine: no restore actor provided');
    }),
  },
  delays: {
    ttl: ({ context }) => context.ttlMs,
    idle: ({ context }) => context.idleMs ?? NEVER,
  },
  guards: {
    killRequested: ({ context }) => context.killRequested,
    idlePause: ({ context }) => idles(context) && context.idleAction === 'pause',
    idleHibernate: ({ context }) => idles(context) && context.idleAction === 'hibernate',
    idleKill: ({ context }) => idles(context) && context.idleAction === 'kill',
    lastActivity: ({ context }) => context.inflight <= 1,
    adoptedHibernated: ({ context }) => context.adopted === 'hibernated',
    adoptedPaused: ({ context }) => context.adopted === 'paused',
  },
  actions: {
    requestKill: assign({ killRequested: true, reason: ({ event }) => (event.type === 'KILL' ? (event.reason ?? 'killed') : 'killed') }),
    setKillReason: assign({ reason: ({ event }) => (event.type === 'KILL' ? (event.reason ?? 'killed') : 'killed') }),
    busy: assign({ inflight: ({ context }) => context.inflight + 1 }),
    done: assign({ inflight: ({ context }) => Math.max(0, context.inflight - 1) }),
    sleepWhy: assign({ sleepReason: ({ event }) => ('why' in event && event.why) || 'requested' }),
  },
}).createMachine({
  id: 'sandbox',
  initial: 'creating',
  context: ({ input }) => ({
    id: input.id,
    ttlMs: input.ttlMs,
    idleMs: input.idleMs,
    idleAction: input.idleAction ?? 'pause',
    inflight: 0,
    killRequested: false,
    ...(input.adopted ? { adopted: input.adopted } : {}),
    ...(input.adopted && input.adopted !== 'running' ? { sleepReason: input.sleepReason ?? 'node_restarted' } : {}),
  }),
  states: {
    creating: {
      invoke: {
        src: 'create',
        input: ({ context }) => ({ id: context.id }),
        // Taken up after a node's restart, it is where its backend kept it.
        onDone: [{ guard: 'adoptedHibernated', target: '#sandbox.live.hibernated' }, { guard: 'adoptedPaused', target: '#sandbox.live.paused' }, { target: 'live' }],
        onError: {
          target: 'failed',
          actions: assign({ reason: 'create_failed' as const, error: ({ event }) => toWireError(event.error) }),
        },
      },
      on: { KILL: { actions: 'requestKill' } },
    },
    live: {
      initial: 'running',
      after: {
        ttl: { target: 'stopping', actions: assign({ reason: 'ttl' as const }) },
      },
      on: {
        KILL: { target: 'stopping', actions: 'setKillReason' },
        // Calls in flight while asleep (a group pause mid-exec) still count down; `running`
        // overrides these to also restart its idle timer.
        ACTIVITY_START: { actions: 'busy' },
        ACTIVITY_END: { actions: 'done' },
        CRASHED: { target: 'stopping', actions: assign({ reason: 'crashed' as const, error: ({ event }) => event.error }) },
      },
      states: {
        running: {
          always: { guard: 'killRequested', target: '#sandbox.stopping' },
          initial: 'idle',
          on: {
            PAUSE: { target: 'pausing', actions: 'sleepWhy' },
            HIBERNATE: { target: 'hibernating', actions: 'sleepWhy' },
            ACTIVITY_START: { target: '.busy', actions: 'busy' },
            ACTIVITY_END: [{ guard: 'lastActivity', target: '.idle', reenter: true, actions: 'done' }, { actions: 'done' }],
          },
          states: {
            idle: {
              after: {
                idle: [
                  { guard: 'idlePause', target: '#sandbox.live.pausing', actions: assign({ sleepReason: 'idle' }) },
                  { guard: 'idleHibernate', target: '#sandbox.live.hibernating', actions: assign({ sleepReason: 'idle' }) },
                  { guard: 'idleKill', target: '#sandbox.stopping', actions: assign({ reason: 'idle' as const }) },
                ],
              },
            },
            busy: {},
          },
        },
        pausing: {
          invoke: {
            src: 'pause',
            input: ({ context }) => ({ id: context.id }),
            onDone: 'paused',
            onError: { target: 'running', actions: assign({ error: ({ event }) => toWireError(event.error) }) },
          },
          on: { KILL: { actions: 'requestKill' } },
        },
        paused: {
          always: { guard: 'killRequested', target: '#sandbox.stopping' },
          on: {
            RESUME: 'resuming',
            HIBERNATE: { target: 'hibernating', actions: 'sleepWhy' },
          },
        },
        resuming: {
          invoke: {
            src: 'resume',
            input: ({ context }) => ({ id: context.id }),
            onDone: 'running',
            onError: { target: '#sandbox.stopping', actions: assign({ reason: 'crashed' as const, error: ({ event }) => toWireError(event.error) }) },
          },
          on: { KILL: { actions: 'requestKill' } },
        },
        hibernating: {
          invoke: {
            src: 'hibernate',
            input: ({ context }) => ({ id: context.id }),
            onDone: { target: 'hibernated', actions: assign({ released: ({ event }) => event.output }) },
            // The backend thaws what it froze before it reports a failure: running is the truth.
            onError: { target: 'running', actions: assign({ error: ({ event }) => toWireError(event.error) }) },
          },
          // The one place a kill must wait: the backend is rewriting the cgroup's memory limits.
          on: { KILL: { actions: 'requestKill' } },
        },
        hibernated: {
          always: { guard: 'killRequested', target: '#sandbox.stopping' },
          on: {
            RESTORE: 'restoring',
            RESUME: 'restoring',
          },
        },
        restoring: {
          invoke: {
            src: 'restore',
            input: ({ context }) => ({ id: context.id }),
            onDone: 'running',
            onError: { target: '#sandbox.stopping', actions: assign({ reason: 'crashed' as const, error: ({ event }) => toWireError(event.error) }) },
          },
          on: { KILL: { actions: 'requestKill' } },
        },
      },
    },
    stopping: {
      invoke: {
        src: 'destroy',
        input: ({ context }) => ({ id: context.id, reason: context.reason ?? 'killed' }),
        onDone: [{ guard: ({ context }) => context.reason === 'crashed', target: 'failed' }, { target: 'stopped' }],
        onError: { target: 'failed', actions: assign({ error: ({ event }) => toWireError(event.error) }) },
      },
    },
    stopped: { type: 'final' },
    failed: { type: 'final' },
  },
});

/** The public state of a snapshot value: `{ live: { running: 'idle' } }` → `running`. */
export function publicState(value: unknown): SandboxState {
  if (typeof value === 'string') return value as SandboxState;
  const live = (value as { live?: unknown }).live;
  if (typeof live === 'string') return live as SandboxState;
  if (live && typeof live === 'object') return Object.keys(live)[0] as SandboxState;
  throw new Error(`unexpected sandbox state ${JSON.stringify(value)}`);
}

/** Which verbs each state answers directly (the verb table, protocol/verbs.ts); anything else gets INVALID_STATE. */
export function allows(state: SandboxState, verb: SandboxVerb): boolean {
  return verbAllowed(state, verb);
}

/** States in which the sandbox's processes are frozen or on their way there or back. */
export function isAsleep(state: SandboxState): boolean {
  return state === 'pausing' || state === 'paused' || state === 'hibernating' || state === 'hibernated' || state === 'resuming' || state === 'restoring';
}

export function isFinal(state: SandboxState): boolean {
  return state === 'stopped' || state === 'failed';
}
