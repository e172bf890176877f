/** The machines on their own: pure transitions, effects stubbed, time simulated. */
import test from 'ava';
import { createActor, fromPromise, SimulatedClock } from 'xstate';
import { admissionState, nodeMachine, pickVictims, refusal, underPressure } from '../actors/node.ts';
import { judge } from '../runtime/pressure.ts';
import { isLive, type PlacementContext, rank, SAMPLE_K } from '../actors/placement.ts';
import { allows, publicState, sandboxMachine } from '../actors/sandbox.ts';
import { type NodeRecord, SandboxVerbs, SandboxVerbTable, validateSpec } from '../protocol/index.ts';

function deferred() {
  let resolve!: () => void;
  let reject!: (e: Error) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

function sandbox(opts: { ttlMs?: number; idleMs?: number; idleAction?: 'pause' | 'hibernate' | 'kill' } = {}) {
  const create = deferred();
  const destroyed: string[] = [];
  const calls: string[] = [];
  const hibernate = deferred();
  const clock = new SimulatedClock();
  const machine = sandboxMachine.provide({
    actors: {
      create: fromPromise(() => create.promise),
      destroy: fromPromise(async ({ input }) => {
        destroyed.push(input.reason);
      }),
      pause: fromPromise(async () => {
        calls.push('pause');
      }),
      resume: fromPromise(async () => {
        calls.push('resume');
      }),
      hibernate: fromPromise<{ bytes: number; swapped: boolean }, { id: string }>(async () => {
        calls.push('hibernate');
        await hibernate.promise;
        return { bytes: 42, swapped: false };
      }),
      restore: fromPromise(async () => {
        calls.push('restore');
      }),
    },
  });
  const input = { id: 'sb-x', ttlMs: opts.ttlMs ?? 60_000, ...(opts.idleMs ? { idleMs: opts.idleMs } : {}), ...(opts.idleAction ? { idleAction: opts.idleAction } : {}) };
  const actor = createActor(machine, { input, clock });
  actor.start();
  const tick = () => new Promise((r) => setImmediate(r));
  return {
    actor,
    create,
    destroyed,
    calls,
    clock,
    tick,
    hibernation: () => hibernate,
  };
}

const st = (s: { actor: { getSnapshot(): { value: unknown } } }) => publicState(s.actor.getSnapshot().value);

async function running(opts: Parameters<typeof sandbox>[0] = {}) {
  const s = sandbox(opts);
  s.create.resolve();
  await s.tick();
  return s;
}

test('sandbox: creating → running → (kill) → stopping → stopped', async (t) => {
  const s = sandbox();
  t.is(st(s), 'creating');
  s.create.resolve();
  await s.tick();
  t.is(st(s), 'running');
  s.actor.send({ type: 'KILL' });
  await s.tick();
  t.is(st(s), 'stopped');
  t.is(s.actor.getSnapshot().context.reason, 'killed');
  t.deepEqual(s.destroyed, ['killed']);
});

test('sandbox: a kill during creating is honoured once created', async (t) => {
  const s = sandbox();
  s.actor.send({ type: 'KILL' });
  t.is(st(s), 'creating');
  s.create.resolve();
  await s.tick();
  t.is(st(s), 'stopped');
  t.deepEqual(s.destroyed, ['killed']);
});

test('sandbox: a failed create ends in failed, with the error and no destroy', async (t) => {
  const s = sandbox();
  s.create.reject(new Error('crun exploded'));
  await s.tick();
  const snap = s.actor.getSnapshot();
  t.is(publicState(snap.value), 'failed');
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
  t.is(st(s), 'running');
  s.clock.increment(1);
  await s.tick();
  t.is(st(s), 'stopped');
  t.is(s.actor.getSnapshot().context.reason, 'ttl');
});

test('sandbox: a crash ends in failed after cleanup', async (t) => {
  const s = sandbox();
  s.create.resolve();
  await s.tick();
  s.actor.send({ type: 'CRASHED', error: { code: 'BACKEND_FAILED', message: 'init died', retryable: false } });
  await s.tick();
  t.is(st(s), 'failed');
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
  const a = createActor(nodeMachine, { input: { pools: { container: { cpu: 2, memoryMiB: 1000, sandboxes: 3 } } } }).start();
  const need = { cpu: 1, memoryMiB: 400, sandboxes: 1 };
  const admit = (id: string, n = need) => ({ type: 'ADMIT' as const, id, kind: 'container' as const, need: n });
  t.true(a.getSnapshot().can(admit('a')));
  a.send(admit('a'));
  a.send(admit('b'));
  t.deepEqual(a.getSnapshot().context.allocated, { cpu: 2, memoryMiB: 800, sandboxes: 2 });
  t.false(a.getSnapshot().can(admit('c')));
  t.regex(refusal(a.getSnapshot().context, 'container', need) ?? '', /cpu: need 1, free 0 of 2/);
  // The same id twice is not admitted twice.
  t.false(a.getSnapshot().can(admit('a', { cpu: 0, memoryMiB: 0, sandboxes: 0 })));
  a.send({ type: 'RELEASE', id: 'a' });
  a.send({ type: 'RELEASE', id: 'a' });
  t.deepEqual(a.getSnapshot().context.allocated, { cpu: 1, memoryMiB: 400, sandboxes: 1 });
  a.send({ type: 'DRAIN' });
  t.false(a.getSnapshot().can(admit('d')));
  a.send({ type: 'UNDRAIN' });
  t.is(admissionState(a.getSnapshot().value), 'serving');
  t.true(a.getSnapshot().can(admit('d')));
});

test('node: backend creates run a few at a time; the machine grants each its slot', (t) => {
  const a = createActor(nodeMachine, { input: { pools: { sim: { cpu: 8, memoryMiB: 8000, sandboxes: 8 } }, createConcurrency: 2 } }).start();
  const begin = { type: 'CREATE_BEGIN' } as const;
  a.send(begin);
  a.send(begin);
  t.false(a.getSnapshot().can(begin));
  t.is(a.getSnapshot().context.creates.running, 2);
  a.send({ type: 'CREATE_END' });
  t.true(a.getSnapshot().can(begin));
});

test('node: each backend kind has a pool of its own', (t) => {
  const a = createActor(nodeMachine, { input: { pools: { container: { cpu: 1, memoryMiB: 1000, sandboxes: 10 }, sim: { cpu: 64, memoryMiB: 100_000, sandboxes: 1000 } } } }).start();
  const need = { cpu: 1, memoryMiB: 100, sandboxes: 1 };
  a.send({ type: 'ADMIT', id: 'c1', kind: 'container', need });
  // The container pool is full; the simulated one is not.
  t.false(a.getSnapshot().can({ type: 'ADMIT', id: 'c2', kind: 'container', need }));
  t.true(a.getSnapshot().can({ type: 'ADMIT', id: 's1', kind: 'sim', need }));
  t.false(a.getSnapshot().can({ type: 'ADMIT', id: 'v1', kind: 'microvm', need }), 'a kind the node does not offer');
  t.regex(refusal(a.getSnapshot().context, 'microvm', need) ?? '', /offers no 'microvm'/);
  a.send({ type: 'ADMIT', id: 's1', kind: 'sim', need });
  const ctx = a.getSnapshot().context;
  t.deepEqual(ctx.pools.sim?.allocated, { cpu: 1, memoryMiB: 100, sandboxes: 1 });
  t.deepEqual(ctx.allocated, { cpu: 2, memoryMiB: 200, sandboxes: 2 });
  t.deepEqual(ctx.capacity, { cpu: 65, memoryMiB: 101_000, sandboxes: 1010 });
  a.send({ type: 'RELEASE', id: 'c1' });
  t.deepEqual(a.getSnapshot().context.pools.container?.allocated, { cpu: 0, memoryMiB: 0, sandboxes: 0 });
});

test('sandbox verbs: one table says where each is answered, what wakes, what needs a capability', (t) => {
  for (const verb of SandboxVerbs) {
    const row = SandboxVerbTable[verb];
    t.true(row.states.length > 0, verb);
    // A verb that runs something in the sandbox is answered only while it runs.
    if (row.wakes) t.deepEqual([...row.states], ['running'], verb);
    t.true(allows('running', verb) || verb === 'info', verb);
  }
  t.true(allows('paused', 'network.set'));
  t.false(allows('paused', 'exec'));
  t.true(allows('stopping', 'exec.cancel'));
  t.false(allows('stopped', 'pause'));
  t.is(SandboxVerbTable['network.set'].capability, 'network');
  t.is(SandboxVerbTable.stats.capability, 'stats');
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

test('placement: scores each backend kind by its own pool', (t) => {
  const now = 1_000_500;
  const pool = (cpu: number, used: number) => ({ capacity: { cpu, memoryMiB: 64_000, sandboxes: 1000 }, allocated: { cpu: used, memoryMiB: 0, sandboxes: 0 } });
  const ctx: PlacementContext = {
    nodes: {
      // Full of containers, with simulated room to spare.
      mixed: rec('mixed', { backends: ['container', 'sim'], offers: { container: pool(4, 4), sim: pool(64, 0) } }),
      plain: rec('plain', { offers: { container: pool(4, 0) } }),
      sims: rec('sims', { backends: ['sim'], offers: { sim: pool(64, 32) } }),
    },
    pending: {},
  };
  t.deepEqual(rank(ctx, validateSpec({ cpu: 1 }), now).nodes, ['plain', 'mixed']);
  t.deepEqual(rank(ctx, validateSpec({ backend: 'sim', cpu: 1 }), now).nodes, ['mixed', 'sims']);
});

test('sandbox: pause → paused → resume → running; hibernate → hibernated → restore', async (t) => {
  const s = await running();
  s.actor.send({ type: 'PAUSE' });
  await s.tick();
  t.is(st(s), 'paused');
  s.actor.send({ type: 'RESUME' });
  await s.tick();
  t.is(st(s), 'running');
  s.actor.send({ type: 'HIBERNATE', why: 'pressure' });
  t.is(st(s), 'hibernating');
  s.hibernation().resolve();
  await s.tick();
  t.is(st(s), 'hibernated');
  t.deepEqual(s.actor.getSnapshot().context.released, { bytes: 42, swapped: false });
  t.is(s.actor.getSnapshot().context.sleepReason, 'pressure');
  s.actor.send({ type: 'RESTORE' });
  await s.tick();
  t.is(st(s), 'running');
  t.deepEqual(s.calls, ['pause', 'resume', 'hibernate', 'restore']);
});

test('sandbox: illegal transitions are refused (resume while running, restore while paused, pause while stopping)', async (t) => {
  const s = await running();
  t.false(s.actor.getSnapshot().can({ type: 'RESUME' }));
  t.false(s.actor.getSnapshot().can({ type: 'RESTORE' }));
  s.actor.send({ type: 'PAUSE' });
  await s.tick();
  t.false(s.actor.getSnapshot().can({ type: 'PAUSE' }));
  t.false(s.actor.getSnapshot().can({ type: 'RESTORE' }));
  t.true(s.actor.getSnapshot().can({ type: 'HIBERNATE' }));
  s.actor.send({ type: 'RESUME' });
  await s.tick();
  s.actor.send({ type: 'KILL' });
  await s.tick();
  t.is(st(s), 'stopped');
  t.false(s.actor.getSnapshot().can({ type: 'PAUSE' }));
});

test('sandbox: a kill while hibernating waits for the hibernation, then stops', async (t) => {
  const s = await running();
  s.actor.send({ type: 'HIBERNATE' });
  s.actor.send({ type: 'KILL' });
  await s.tick();
  t.is(st(s), 'hibernating');
  t.deepEqual(s.destroyed, []);
  s.hibernation().resolve();
  await s.tick();
  t.is(st(s), 'stopped');
  t.deepEqual(s.destroyed, ['killed']);
});

test('sandbox: the ttl keeps running while paused', async (t) => {
  const s = await running({ ttlMs: 10_000 });
  s.clock.increment(6_000);
  s.actor.send({ type: 'PAUSE' });
  await s.tick();
  s.clock.increment(4_000);
  await s.tick();
  t.is(st(s), 'stopped');
  t.is(s.actor.getSnapshot().context.reason, 'ttl');
});

test('sandbox: idle timeout pauses, never under a call in flight, and restarts after each call', async (t) => {
  const s = await running({ idleMs: 1000, idleAction: 'pause' });
  s.clock.increment(900);
  s.actor.send({ type: 'ACTIVITY_START' });
  s.clock.increment(5000);
  await s.tick();
  t.is(st(s), 'running', 'a long exec is not idleness');
  s.actor.send({ type: 'ACTIVITY_END' });
  s.clock.increment(999);
  await s.tick();
  t.is(st(s), 'running');
  s.clock.increment(1);
  await s.tick();
  t.is(st(s), 'paused');
  t.is(s.actor.getSnapshot().context.sleepReason, 'idle');
});

test('sandbox: idle timeout can hibernate or kill, and says why', async (t) => {
  const h = await running({ idleMs: 1000, idleAction: 'hibernate' });
  h.hibernation().resolve();
  h.clock.increment(1000);
  await h.tick();
  t.is(st(h), 'hibernated');
  const k = await running({ idleMs: 1000, idleAction: 'kill' });
  k.clock.increment(1000);
  await k.tick();
  t.is(st(k), 'stopped');
  t.is(k.actor.getSnapshot().context.reason, 'idle');
});

test('node: under pressure the victims are idle best-effort sandboxes, longest idle first', (t) => {
  const now = 100_000;
  const ids = pickVictims(
    [
      { id: 'ls-old', qos: 'ls', state: 'running', idleSince: 1 },
      { id: 'be-recent', qos: 'be', state: 'running', idleSince: now - 40_000 },
      { id: 'be-oldest', qos: 'be', state: 'running', idleSince: 10 },
      { id: 'be-busy', qos: 'be', state: 'running', idleSince: 0 },
      { id: 'be-paused', qos: 'be', state: 'paused', idleSince: 5 },
      { id: 'be-fresh', qos: 'be', state: 'running', idleSince: now - 1_000 },
    ],
    now,
    30_000,
  );
  t.deepEqual(ids, ['be-oldest', 'be-recent']);
  const a = createActor(nodeMachine, { input: { pools: { container: { cpu: 1, memoryMiB: 1, sandboxes: 1 } } } }).start();
  t.false(underPressure(a.getSnapshot().value));
  a.send({ type: 'PRESSURE', reading: 'low' });
  t.true(underPressure(a.getSnapshot().value));
  t.is(admissionState(a.getSnapshot().value), 'serving', 'pressure does not stop admission by itself');
  a.send({ type: 'RELIEVED' });
  t.false(underPressure(a.getSnapshot().value));
});

test('pressure: thresholds with hysteresis', (t) => {
  const c = { minAvailableMiB: 1000, psiAvg10: 20 };
  t.is(judge({ availableMiB: 900, psiAvg10: 0 }, c), 'pressure');
  t.is(judge({ availableMiB: 5000, psiAvg10: 30 }, c), 'pressure');
  t.is(judge({ availableMiB: 1100, psiAvg10: 0 }, c), 'hold');
  t.is(judge({ availableMiB: 5000, psiAvg10: 15 }, c), 'hold');
  t.is(judge({ availableMiB: 5000, psiAvg10: null }, c), 'relieved');
});

test('placement: a group spreads over nodes or packs onto the fullest that fits, by what this replica placed', (t) => {
  const now = 1_000_500;
  const ctx: PlacementContext = { nodes: { a: rec('a'), b: rec('b'), c: rec('c') }, pending: {}, groups: { job: { a: 2, b: 1 } } };
  t.deepEqual(rank(ctx, validateSpec({ group: 'job' }), now).nodes, ['c', 'b', 'a']);
  t.deepEqual(rank(ctx, validateSpec({ group: 'job', placement: 'pack' }), now).nodes, ['a', 'b', 'c']);
  // pack stops at a node that no longer fits: it goes last, whatever it holds.
  const full: PlacementContext = { ...ctx, nodes: { ...ctx.nodes, a: rec('a', { allocated: { cpu: 32, memoryMiB: 0, sandboxes: 2 }, sandboxes: 2 }) } };
  t.deepEqual(rank(full, validateSpec({ group: 'job', placement: 'pack' }), now).nodes, ['b', 'c', 'a']);
  t.throws(() => validateSpec({ placement: 'random' }), { message: /spread or pack/ });
});

test('placement: past 2 × K nodes only K are scored, and a fit outside the sample is still found', (t) => {
  const now = 1_000_500;
  const nodes: Record<string, NodeRecord> = {};
  for (let i = 0; i < 100; i++) nodes[`n${i}`] = rec(`n${i}`, { allocated: { cpu: 32, memoryMiB: 0, sandboxes: 0 } });
  nodes.n77 = rec('n77');
  const ctx: PlacementContext = { nodes, pending: {} };
  const r = rank(ctx, validateSpec({}), now);
  t.is(r.nodes[0], 'n77', 'the one node with room, though the sample missed it (or found it)');
  const roomy: PlacementContext = { nodes: Object.fromEntries(Object.keys(nodes).map((k) => [k, rec(k)])), pending: {} };
  t.is(rank(roomy, validateSpec({}), now).nodes.length, SAMPLE_K);
  // Samples differ from create to create: the load goes over the fleet, not onto one node.
  const firsts = new Set(Array.from({ length: 50 }, () => rank(roomy, validateSpec({}), now).nodes[0]));
  t.true(firsts.size > 10);
});
