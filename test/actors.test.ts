/** The machines on their own: pure transitions, effects stubbed, time simulated. */
import test from 'ava';
import { createActor, fromPromise, SimulatedClock } from 'xstate';
import { nodeMachine, refusal } from '../actors/node.ts';
import { isLive, type PlacementContext, rank } from '../actors/placement.ts';
import { allows, sandboxMachine } from '../actors/sandbox.ts';
import { type NodeRecord, validateSpec } from '../protocol/index.ts';

function deferred() {
  let resolve!: () => void;
  let reject!: (e: Error) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

function sandbox(opts: { ttlMs?: number } = {}) {
  const create = deferred();
  const destroyed: string[] = [];
  const clock = new SimulatedClock();
  const machine = sandboxMachine.provide({
    actors: {
      create: fromPromise(() => create.promise),
      destroy: fromPromise(async ({ input }) => {
        destroyed.push(input.reason);
      }),
    },
  });
  const actor = createActor(machine, { input: { id: 'sb-x', ttlMs: opts.ttlMs ?? 60_000 }, clock });
  actor.start();
  const tick = () => new Promise((r) => setImmediate(r));
  return { actor, create, destroyed, clock, tick };
}

test('sandbox: creating → running → (kill) → stopping → stopped', async (t) => {
  const s = sandbox();
  t.is(s.actor.getSnapshot().value, 'creating');
  s.create.resolve();
  await s.tick();
  t.is(s.actor.getSnapshot().value, 'running');
  s.actor.send({ type: 'KILL' });
  await s.tick();
  t.is(s.actor.getSnapshot().value, 'stopped');
  t.is(s.actor.getSnapshot().context.reason, 'killed');
  t.deepEqual(s.destroyed, ['killed']);
});

test('sandbox: a kill during creating is honoured once created', async (t) => {
  const s = sandbox();
  s.actor.send({ type: 'KILL' });
  t.is(s.actor.getSnapshot().value, 'creating');
  s.create.resolve();
  await s.tick();
  t.is(s.actor.getSnapshot().value, 'stopped');
  t.deepEqual(s.destroyed, ['killed']);
});

test('sandbox: a failed create ends in failed, with the error and no destroy', async (t) => {
  const s = sandbox();
  s.create.reject(new Error('crun exploded'));
  await s.tick();
  const snap = s.actor.getSnapshot();
  t.is(snap.value, 'failed');
  t.is(snap.context.reason, 'create_failed');
  t.is(snap.context.error?.message, 'crun exploded');
  t.deepEqual(s.destroyed, []);
});

test('sandbox: the ttl kills it, not a moment early', async (t) => {
  const s = sandbox({ ttlMs: 10_000 });
  s.create.resolve();
  await s.tick();
  s.clock.increment(9_999);
  await s.tick();
  t.is(s.actor.getSnapshot().value, 'running');
  s.clock.increment(1);
  await s.tick();
  t.is(s.actor.getSnapshot().value, 'stopped');
  t.is(s.actor.getSnapshot().context.reason, 'ttl');
});

test('sandbox: a crash ends in failed after cleanup', async (t) => {
  const s = sandbox();
  s.create.resolve();
  await s.tick();
  s.actor.send({ type: 'CRASHED', error: { code: 'BACKEND_FAILED', message: 'init died', retryable: false } });
  await s.tick();
  t.is(s.actor.getSnapshot().value, 'failed');
  t.deepEqual(s.destroyed, ['crashed']);
});

test('sandbox: verbs allowed per state', (t) => {
  t.true(allows('running', 'exec'));
  t.false(allows('creating', 'exec'));
  t.false(allows('stopping', 'files.write'));
  t.true(allows('stopped', 'info'));
  t.false(allows('failed', 'exec'));
});

test('node: admits within capacity, refuses beyond, releases', (t) => {
  const a = createActor(nodeMachine, { input: { capacity: { cpu: 2, memoryMiB: 1000, sandboxes: 3 } } }).start();
  const need = { cpu: 1, memoryMiB: 400, sandboxes: 1 };
  t.true(a.getSnapshot().can({ type: 'ADMIT', id: 'a', need }));
  a.send({ type: 'ADMIT', id: 'a', need });
  a.send({ type: 'ADMIT', id: 'b', need });
  t.deepEqual(a.getSnapshot().context.allocated, { cpu: 2, memoryMiB: 800, sandboxes: 2 });
  t.false(a.getSnapshot().can({ type: 'ADMIT', id: 'c', need }));
  t.regex(refusal(a.getSnapshot().context, need) ?? '', /cpu: need 1, free 0 of 2/);
  // The same id twice is not admitted twice.
  t.false(a.getSnapshot().can({ type: 'ADMIT', id: 'a', need: { cpu: 0, memoryMiB: 0, sandboxes: 0 } }));
  a.send({ type: 'RELEASE', id: 'a' });
  a.send({ type: 'RELEASE', id: 'a' });
  t.deepEqual(a.getSnapshot().context.allocated, { cpu: 1, memoryMiB: 400, sandboxes: 1 });
  a.send({ type: 'DRAIN' });
  t.false(a.getSnapshot().can({ type: 'ADMIT', id: 'd', need }));
});

function rec(node: string, o: Partial<NodeRecord> = {}): NodeRecord {
  return {
    node,
    backends: ['container'],
    images: ['busybox'],
    capacity: { cpu: 32, memoryMiB: 32_000, sandboxes: 100 },
    allocated: { cpu: 0, memoryMiB: 0, sandboxes: 0 },
    sandboxes: 0,
    heartbeatMs: 1000,
    ts: 1_000_000,
    state: 'serving',
    ...o,
  };
}

test('placement: ranks live nodes by free share, filters by backend, image and liveness', (t) => {
  const now = 1_000_500;
  const ctx: PlacementContext = {
    nodes: {
      busy: rec('busy', { allocated: { cpu: 30, memoryMiB: 1000, sandboxes: 10 }, sandboxes: 10 }),
      idle: rec('idle'),
      stale: rec('stale', { ts: now - 10_000 }),
      other: rec('other', { images: ['python'] }),
    },
    pending: {},
  };
  t.false(isLive(ctx.nodes.stale!, now));
  const spec = validateSpec({});
  t.deepEqual(rank(ctx, spec, now).nodes, ['idle', 'busy']);
  t.deepEqual(rank(ctx, validateSpec({ image: 'python' }), now).nodes, ['other']);
  t.regex(rank(ctx, validateSpec({ image: 'nope' }), now).reason ?? '', /no live node has image/);
  t.regex(rank(ctx, validateSpec({ backend: 'microvm' }), now).reason ?? '', /offers backend/);
  t.deepEqual(rank(ctx, validateSpec({ node: 'busy' }), now).nodes, ['busy']);
  // Creates in flight count against a node before its heartbeat shows them.
  const pending: PlacementContext = { ...ctx, pending: { idle: { cpu: 31, memoryMiB: 0, sandboxes: 1 } } };
  t.deepEqual(rank(pending, spec, now).nodes, ['busy', 'idle']);
});
