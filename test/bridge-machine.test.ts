/** The bridge's decisions as pure logic: whether capacity can still come for creates that wait. */
import test from 'ava';
import { createActor } from 'xstate';
import { type BridgeContext, bridgeMachine, canProvision, type Decision, type Machine, type NodeView, type Policy } from '../bridge/machine.ts';

const policy: Policy = { shape: { cpu: 64, memoryMiB: 65536, sandboxes: 1 }, maxMachines: 1, budgetMachines: Number.POSITIVE_INFINITY, headroom: 0, cooldownMs: 1000, idleMs: 1500, joinDeadlineMs: 60_000, failureBackoffMs: 5000 };
const ctx = (machines: Machine[]): BridgeContext => ({ policy, machines: Object.fromEntries(machines.map((m) => [m.id, m])), demand: { count: 1, cpu: 0.1, memoryMiB: 64 }, now: 10_000, started: machines.length, failures: 0, coolUntil: 0, prefix: 'm', seq: machines.length, nodes: {} });
const machine = (state: Machine['state'], idleSince?: number): Machine => ({ id: 'm1', state, since: 5000, createdAt: 5000, ...(idleSince === undefined ? {} : { idleSince }) });

test('at its maximum the bridge still promises capacity while a machine is on its way or joined and empty', (t) => {
  t.true(canProvision(ctx([])).ok, 'room for a machine');
  t.true(canProvision(ctx([machine('joining')])).ok, 'a machine is joining');
  t.true(canProvision(ctx([machine('ready', 9000)])).ok, 'a machine joined and holds nothing yet');
  t.deepEqual(canProvision(ctx([machine('ready')])), { ok: false, reason: 'the bridge runs its maximum of 1 machines' });
});

test('a machine holding only migratable sandboxes is drained once the other nodes have room for them; a drain that could not move them all serves again', (t) => {
  const drained: string[] = [];
  const decisions: Decision[] = [];
  const actor = createActor(
    bridgeMachine.provide({
      actions: {
        provision: () => {},
        drain: (_, p) => void drained.push(p.id),
        release: () => {},
        decide: (_, d) => void decisions.push(d),
      },
    }),
    { input: { policy, prefix: 'm' } },
  ).start();
  actor.send({ type: 'ADOPT', machines: [{ id: 'm1', createdAt: 0 }], now: 0 });
  const none = { count: 0, cpu: 0, memoryMiB: 0 };
  const table = (baseFree: number, m1: Partial<NodeView>): Record<string, NodeView> => ({
    base: { live: true, state: 'serving', sandboxes: 1, free: baseFree },
    m1: { live: true, state: 'serving', sandboxes: 2, migratable: 2, free: 0, ...m1 },
  });
  // The host observes the node table every half second; a guard sees the observation before.
  const observe = (from: number, to: number, nodes: Record<string, NodeView>) => {
    for (let now = from; now <= to; now += 500) actor.send({ type: 'OBSERVE', now, demand: none, nodes });
  };
  // Two migratable sandboxes on it, no room for them elsewhere: it stays, however long.
  observe(1000, 9000, table(1, {}));
  t.deepEqual(drained, []);
  // One of them not migratable: it stays too.
  observe(9500, 20_000, table(4, { migratable: 1 }));
  t.deepEqual(drained, []);
  // Room for both, for the idle time: drained, and the decision says the drain moves them.
  observe(20_500, 23_000, table(2, {}));
  t.deepEqual(drained, ['m1']);
  t.regex(decisions.find((d) => d.action === 'drain')?.reason ?? '', /migratable/);
  t.is(actor.getSnapshot().context.machines.m1?.state, 'draining');
  // The node could not move one after all: it serves again, and is not drained again before the idle time.
  actor.send({ type: 'DRAIN_INCOMPLETE', id: 'm1', reason: 'NO_CAPACITY: no node admits it', now: 23_200 });
  t.is(actor.getSnapshot().context.machines.m1?.state, 'ready');
  t.regex(decisions.find((d) => d.action === 'undrain')?.reason ?? '', /NO_CAPACITY/);
  observe(23_500, 24_500, table(2, {}));
  t.deepEqual(drained, ['m1']);
  observe(25_000, 26_000, table(2, {}));
  t.deepEqual(drained, ['m1', 'm1']);
  actor.stop();
});
