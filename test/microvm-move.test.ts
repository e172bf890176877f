/**
 * VM snapshots that move between nodes: a microVM's snapshot state goes into the image store, and
 * a node other than the one that took it starts a sandbox from it; a migratable microVM moves whole
 * (processes and memory) when its node is drained with `migrate`. Two real nodes on this host, one
 * store. Skipped where QEMU or the guest kernel is missing (ops/setup.sh installs both).
 */
import { existsSync, readdirSync } from 'node:fs';
import anyTest, { type TestFn } from 'ava';
import type { Sandbox } from '../sdk/index.ts';
import { type ClusterContext, SHARED_IMAGES, startTestCluster, stopTestCluster } from './helpers/cluster.ts';

const ready = existsSync('/usr/bin/qemu-system-x86_64') && readdirSync('/boot').some((n) => /^vmlinuz-.*-cloud-amd64$/.test(n));
const ctxTest = anyTest as TestFn<ClusterContext>;
const test = ready ? ctxTest.serial : ctxTest.skip;
if (!ready) console.log('microvm-move tests skipped: needs qemu-system-x86 and linux-image-cloud-amd64');

if (ready) {
  ctxTest.before(async (t) => {
    Object.assign(t.context, await startTestCluster({ nodes: 2, env: { PADDOCK_BACKENDS: 'container,microvm' } }));
  });
  ctxTest.after.always(async (t) => {
    await stopTestCluster(t.context.cluster ? t.context : undefined);
  });
}

const sh = async (sb: Sandbox, cmd: string) => (await sb.exec(['sh', '-c', cmd])).stdout;
/** A file, and a process started before the snapshot whose pid is in /tmp/pid. */
const PREPARE = 'echo before > /tmp/f; sleep 100000 >/dev/null 2>&1 & echo $! > /tmp/pid';
const CHECK = 'cat /tmp/f; kill -0 $(cat /tmp/pid) && echo alive';

test("a VM snapshot's state is in the image store, and another node starts a sandbox from it: its files, processes and memory", async (t) => {
  const { pdk, cluster } = t.context;
  const [n1, n2] = cluster.nodes;
  if (!n1 || !n2) return t.fail('two nodes');
  const sb = await pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 256, node: n1.id });
  t.teardown(() => sb.kill().catch(() => {}));
  await sh(sb, PREPARE);
  const snap = await sb.snapshot();
  t.teardown(() => pdk.snapshots.delete(snap.id).then(() => {}, () => {}));
  t.is(snap.node, n1.id);
  t.truthy(snap.state, 'its state went to the store');
  t.regex(snap.state?.digest ?? '', /^sha256:[0-9a-f]{64}$/);
  const there = await pdk.sandboxes.create({ fromSnapshot: snap.id, node: n2.id });
  t.teardown(() => there.kill().catch(() => {}));
  t.like(there.info, { node: n2.id, backend: 'microvm', memoryMiB: 256 });
  t.is(await sh(there, CHECK), 'before\nalive\n');
  // Each goes its own way.
  await sh(there, 'echo after > /tmp/f');
  t.is(await sh(sb, 'cat /tmp/f'), 'before\n');
  // Only the snapshot itself is listed: the copy fetched to the other node went after its create.
  t.deepEqual((await pdk.snapshots.list({ from: sb.id })).map((s) => s.id), [snap.id]);
  // Its machine still binds it: another size is refused, as on its own node.
  await t.throwsAsync(pdk.sandboxes.create({ fromSnapshot: snap.id, node: n2.id, memoryMiB: 512 }), { code: 'INVALID_SPEC' } as never);
  t.true(await pdk.snapshots.delete(snap.id));
  t.false(existsSync(`${SHARED_IMAGES}/manifests/vmstate-${snap.id}.json`), 'its copy in the store went with it');
});

test('drain --migrate moves a migratable microVM whole to the other node: processes and memory; the handle follows', async (t) => {
  const { pdk, cluster } = t.context;
  const [n1, n2] = cluster.nodes;
  if (!n1 || !n2) return t.fail('two nodes');
  const vm = await pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 256, node: n1.id, migratable: true, labels: { t: 'vm-move' } });
  const firstId = vm.id;
  t.teardown(async () => {
    await pdk.nodes.undrain(n1.id).catch(() => {});
    await vm.kill().catch(() => {});
  });
  await sh(vm, PREPARE);
  const r = await pdk.nodes.drain(n1.id, { migrate: true });
  t.deepEqual(r.notMigrated, {});
  t.truthy(r.migrated?.[firstId]);
  t.is(await sh(vm, CHECK), 'before\nalive\n', 'the same handle reaches the copy, its process alive');
  t.like(vm.info, { node: n2.id, backend: 'microvm', labels: { t: 'vm-move' } });
  t.like((await pdk.sandboxes.get(firstId)).info, { state: 'stopped', reason: 'migrated', movedTo: vm.id });
  t.deepEqual(await pdk.snapshots.list({ from: firstId }), [], 'no snapshot is left behind by the move');
});
