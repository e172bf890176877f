/** The bridge's decisions as pure logic: whether capacity can still come for creates that wait. */
import test from 'ava';
import { type BridgeContext, canProvision, type Machine, type Policy } from '../bridge/machine.ts';

const policy: Policy = { shape: { cpu: 64, memoryMiB: 65536, sandboxes: 1 }, maxMachines: 1, budgetMachines: Number.POSITIVE_INFINITY, headroom: 0, cooldownMs: 1000, idleMs: 1500, joinDeadlineMs: 60_000, failureBackoffMs: 5000 };
const ctx = (machines: Machine[]): BridgeContext => ({ policy, machines: Object.fromEntries(machines.map((m) => [m.id, m])), demand: { count: 1, cpu: 0.1, memoryMiB: 64 }, now: 10_000, started: machines.length, failures: 0, coolUntil: 0, prefix: 'm', seq: machines.length });
const machine = (state: Machine['state'], idleSince?: number): Machine => ({ id: 'm1', state, since: 5000, createdAt: 5000, ...(idleSince === undefined ? {} : { idleSince }) });

test('at its maximum the bridge still promises capacity while a machine is on its way or joined and empty', (t) => {
  t.true(canProvision(ctx([])).ok, 'room for a machine');
  t.true(canProvision(ctx([machine('joining')])).ok, 'a machine is joining');
  t.true(canProvision(ctx([machine('ready', 9000)])).ok, 'a machine joined and holds nothing yet');
  t.deepEqual(canProvision(ctx([machine('ready')])), { ok: false, reason: 'the bridge runs its maximum of 1 machines' });
});
