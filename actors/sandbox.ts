/**
 * The sandbox machine: one actor per sandbox. It decides; the backend does (through the injected
 * `create` and `destroy` actors); the binding in `sandbox-host.ts` carries messages to and from NATS.
 *
 *   creating ──done──▶ running ──KILL / ttl──▶ stopping ──▶ stopped
 *      │                  │                        │
 *      └──error──▶ failed ◀──CRASHED── ─ ─ ─ ─ ─ ─ ┘ (destroy failed)
 *
 * A backend's create is all-or-nothing: when it fails it has already undone its partial work, so
 * `failed` straight from `creating` leaves nothing behind.
 */
import { assign, fromPromise, setup } from 'xstate';
import type { EndReason, SandboxState } from '../protocol/index.ts';
import type { WireError } from '../protocol/index.ts';
import { toWireError } from '../protocol/index.ts';
import type { SandboxVerb } from '../protocol/index.ts';

export interface SandboxInput {
  id: string;
  ttlMs: number;
}

export interface SandboxContext {
  id: string;
  ttlMs: number;
  /** A kill that arrived while creating; honoured as soon as the sandbox runs. */
  killRequested: boolean;
  reason?: EndReason;
  error?: WireError;
}

export type SandboxEvent =
  | { type: 'KILL'; reason?: EndReason }
  /** The backend saw the sandbox die on its own (its init exited, the node lost it). */
  | { type: 'CRASHED'; error: WireError };

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
  },
  delays: {
    ttl: ({ context }) => context.ttlMs,
  },
  guards: {
    killRequested: ({ context }) => context.killRequested,
  },
}).createMachine({
  id: 'sandbox',
  initial: 'creating',
  context: ({ input }) => ({ id: input.id, ttlMs: input.ttlMs, killRequested: false }),
  states: {
    creating: {
      invoke: {
        src: 'create',
        input: ({ context }) => ({ id: context.id }),
        onDone: { target: 'running' },
        onError: {
          target: 'failed',
          actions: assign({ reason: 'create_failed' as const, error: ({ event }) => toWireError(event.error) }),
        },
      },
      on: {
        KILL: { actions: assign({ killRequested: true, reason: ({ event }) => event.reason ?? 'killed' }) },
      },
    },
    running: {
      always: { guard: 'killRequested', target: 'stopping' },
      after: {
        ttl: { target: 'stopping', actions: assign({ reason: 'ttl' as const }) },
      },
      on: {
        KILL: { target: 'stopping', actions: assign({ reason: ({ event }) => event.reason ?? 'killed' }) },
        CRASHED: { target: 'stopping', actions: assign({ reason: 'crashed' as const, error: ({ event }) => event.error }) },
      },
    },
    stopping: {
      invoke: {
        src: 'destroy',
        input: ({ context }) => ({ id: context.id, reason: context.reason ?? 'killed' }),
        onDone: [
          { guard: ({ context }) => context.reason === 'crashed', target: 'failed' },
          { target: 'stopped' },
        ],
        onError: { target: 'failed', actions: assign({ error: ({ event }) => toWireError(event.error) }) },
      },
    },
    stopped: { type: 'final' },
    failed: { type: 'final' },
  },
});

/** Which verbs each state answers; anything else gets INVALID_STATE. Pure, for the binding. */
const ALLOWED: Record<SandboxState, ReadonlySet<SandboxVerb>> = {
  creating: new Set(['info', 'kill']),
  running: new Set(['info', 'exec', 'exec.cancel', 'files.read', 'files.write', 'files.list', 'files.remove', 'kill']),
  stopping: new Set(['info', 'kill', 'exec.cancel']),
  stopped: new Set(['info', 'kill']),
  failed: new Set(['info', 'kill']),
};

export function allows(state: SandboxState, verb: SandboxVerb): boolean {
  return ALLOWED[state].has(verb);
}

export function isFinal(state: SandboxState): boolean {
  return state === 'stopped' || state === 'failed';
}
