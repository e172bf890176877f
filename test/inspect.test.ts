import { context, trace } from '@opentelemetry/api';
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';
import test from 'ava';
import pino from 'pino';
import { createActor, fromPromise, SimulatedClock } from 'xstate';
import { stateName, transitionInspector } from '../actors/inspect.ts';
import { sandboxMachine } from '../actors/sandbox.ts';

const exporter = new InMemorySpanExporter();
new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }).register();

// biome-ignore lint/suspicious/noExplicitAny: one no-op stands in for actors of several input types
const noop = fromPromise(async () => {}) as any;
const machine = sandboxMachine.provide({ actors: { create: noop, destroy: noop, pause: noop, resume: noop, restore: noop, hibernate: fromPromise(async () => ({ bytes: 0, swapped: false as boolean })) } });
const tick = () => new Promise((r) => setImmediate(r));

test('every transition is a span event: on the active span, or on a span of its own when a timer caused it', async (t) => {
  exporter.reset();
  const lines: Array<{ state?: string; event?: string; msg?: string }> = [];
  const log = pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s)) });
  const clock = new SimulatedClock();
  const actor = createActor(machine, { input: { id: 'sb-i', ttlMs: 10_000 }, clock, inspect: transitionInspector(log) });
  const request = trace.getTracer('test').startSpan('request');
  await context.with(trace.setSpan(context.active(), request), async () => {
    actor.start();
    await tick();
    actor.send({ type: 'PAUSE' });
    await tick();
  });
  request.end();
  // The ttl fires with no request in flight.
  clock.increment(10_000);
  await tick();
  await tick();
  t.is(actor.getSnapshot().value, 'stopped');

  const spans = exporter.getFinishedSpans();
  const req = spans.find((s) => s.name === 'request');
  const states = req?.events.map((e) => e.attributes?.['paddock.actor.state']);
  t.true(states?.includes('live.running.idle'), `${states}`);
  t.true(states?.includes('live.paused'), `${states}`);
  const own = spans.filter((s) => s.name === 'sandbox.transition');
  const ttl = own.find((s) => s.attributes['paddock.actor.state'] === 'stopping');
  t.truthy(ttl, 'the ttl transition has a span of its own');
  t.is(ttl?.attributes['paddock.actor.event'], 'xstate.after.ttl.sandbox.live');
  t.is(ttl?.attributes['paddock.sandbox.id'], 'sb-i');
  t.true(own.some((s) => s.attributes['paddock.actor.state'] === 'stopped'));
  // And a debug line each.
  t.true(lines.some((l) => l.msg === 'transition' && l.state === 'stopping'));
});

test('state names: nested values read as paths', (t) => {
  t.is(stateName('stopped'), 'stopped');
  t.is(stateName({ live: { running: 'idle' } }), 'live.running.idle');
  t.is(stateName({ admission: 'serving', memory: 'normal' }), '(admission.serving memory.normal)');
});
