/**
 * One inspector for every actor (XState `inspect`): each change of a machine's state becomes an
 * OpenTelemetry span event — on the span of the request that caused it, or on a span of its own
 * when none is active (a ttl or idle timer fired) — and a debug log line. Events that leave the
 * state as it was (an exec's ACTIVITY_START, a RELEASE) are not reported.
 */
import { type Attributes, trace } from '@opentelemetry/api';
import type { Logger } from 'pino';
import type { InspectionEvent } from 'xstate';
import { tracer } from './bind.ts';

export type Inspector = (ev: InspectionEvent) => void;

/** The state value as one string: `{ live: { running: 'idle' } }` → `live.running.idle`. */
export function stateName(value: unknown): string {
  if (typeof value === 'string') return value;
  if (!value || typeof value !== 'object') return String(value);
  const parts: string[] = [];
  for (const [k, v] of Object.entries(value)) parts.push(v && typeof v === 'object' && Object.keys(v).length === 0 ? k : `${k}.${stateName(v)}`);
  return parts.length === 1 ? (parts[0] as string) : `(${parts.join(' ')})`;
}

export function transitionInspector(log: Logger): Inspector {
  // Per actor the last state reported: snapshots also come for events that change only context.
  const last = new WeakMap<object, string>();
  const debug = () => log.isLevelEnabled('debug');
  return (ev) => {
    if (ev.type !== '@xstate.snapshot') return;
    const snap = ev.snapshot as { value?: unknown; context?: { id?: unknown } };
    // Promise and callback actors have no state value: their parents' transitions tell their story.
    if (snap.value === undefined) return;
    const state = stateName(snap.value);
    const ref = ev.actorRef as object;
    const before = last.get(ref);
    if (before === state) return;
    last.set(ref, state);
    const machine = (ev.actorRef as { logic?: { id?: string } }).logic?.id ?? 'actor';
    const id = typeof snap.context?.id === 'string' ? snap.context.id : undefined;
    const attrs: Attributes = { 'paddock.actor.machine': machine, 'paddock.actor.state': state, 'paddock.actor.event': ev.event.type };
    if (before !== undefined) attrs['paddock.actor.from'] = before;
    if (id) attrs[`paddock.${machine}.id`] = id;
    // A timer (ttl, idle) fires in the async context it was set in: the request that started it,
    // whose span ended long ago. An event added to an ended span is dropped, so such a transition
    // gets a span of its own, a root: no request is behind it.
    const span = trace.getActiveSpan();
    if (span?.isRecording()) span.addEvent(`${machine}.transition`, attrs);
    else {
      const own = tracer.startSpan(`${machine}.transition`, { attributes: attrs, root: true });
      own.addEvent(`${machine}.transition`, attrs);
      own.end();
    }
    if (debug()) log.debug({ machine, ...(id ? { id } : {}), from: before, state, event: ev.event.type }, 'transition');
  };
}
