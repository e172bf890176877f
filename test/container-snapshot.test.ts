/**
 * Snapshots of a container sandbox's files (runtime/container/snapshot.ts), on real containers
 * across two nodes that read one image store: what the sandbox wrote, changed, removed and
 * replaced comes back in sandboxes made from the snapshot, on either node, and in forks.
 */
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { decode, encode, subjects } from '../protocol/index.ts';
import { connectionOf } from '../sdk/client.ts';
import type { Sandbox } from '../sdk/index.ts';
import { clusterTest } from './helpers/cluster.ts';

const test = clusterTest({ nodes: 2 });

/** Leaves marks of every kind of change a writable layer holds. */
const PREPARE = [
  'set -e',
  'mkdir -p /work/pkg/sub && echo v1 > /work/pkg/sub/mod.py',
  'dd if=/dev/urandom of=/work/pkg/blob bs=1k count=300 2>/dev/null && md5sum /work/pkg/blob > /work/sum',
  'ln -s pkg/sub/mod.py /work/link',
  'chmod 0750 /work/pkg/sub && chown 1000:1000 /work/pkg/sub/mod.py',
  'touch -d "2021-02-03 04:05:06" /work/pkg/sub/mod.py',
  // A file of the image removed: a whiteout in the snapshot's layer.
  'rm /bin/yes',
  'mkdir /work/old && echo a > /work/old/a && echo b > /work/old/b',
].join('\n');

const CHECK = [
  'cat /work/pkg/sub/mod.py',
  'md5sum -c /work/sum >/dev/null && echo sum-ok',
  'readlink /work/link',
  'stat -c "%a %u:%g %Y" /work/pkg/sub /work/pkg/sub/mod.py',
  'test -e /bin/yes && echo yes-back || echo yes-gone',
  'ls /work/old | tr "\\n" " "',
].join('; ');

function checkOutput(t: { is: (a: unknown, b: unknown, m?: string) => void; regex: (a: string, r: RegExp) => void }, out: string): void {
  const lines = out.trim().split('\n');
  t.is(lines[0], 'v1');
  t.is(lines[1], 'sum-ok');
  t.is(lines[2], 'pkg/sub/mod.py');
  t.regex(lines[3] ?? '', /^750 0:0 \d+$/);
  // Owner inside and mtime kept (1612325106 = 2021-02-03T04:05:06Z, the container's TZ is UTC).
  t.is(lines[4], '644 1000:1000 1612325106');
  t.is(lines[5], 'yes-gone');
  t.is(lines[6]?.trim(), 'a b');
}

let parent: Sandbox | undefined;

test.serial('a snapshot of a container keeps its files; a sandbox made from it on the other node has them and goes its own way', async (t) => {
  const { pdk, cluster } = t.context;
  const [n1, n2] = cluster.nodes;
  if (!n1 || !n2) return t.fail('two nodes');
  parent = await pdk.sandboxes.create({ node: n1.id, labels: { t: 'snap' } });
  const prep = await parent.exec(['sh', '-c', PREPARE]);
  t.is(prep.exitCode, 0, prep.stderr);
  const snap = await parent.snapshot();
  t.like(snap, { backend: 'container', from: parent.id, node: n1.id });
  t.true(snap.bytes > 300 * 1024, `the layer holds the 300 KiB file (${snap.bytes})`);
  t.deepEqual((await pdk.snapshots.list({ from: parent.id })).map((s) => s.id), [snap.id]);

  // The parent runs on and changes; the snapshot does not.
  await parent.exec(['sh', '-c', 'echo v2 > /work/pkg/sub/mod.py']);

  const child = await pdk.sandboxes.create({ fromSnapshot: snap.id, node: n2.id, memoryMiB: 512 });
  t.teardown(() => child.kill().catch(() => {}));
  t.is(child.info.node, n2.id, 'any node that reads the store');
  const r = await child.exec(['sh', '-c', CHECK]);
  t.is(r.exitCode, 0, r.stderr);
  checkOutput(t, r.stdout);
  // Its own writable layer: a change there is not the parent's.
  await child.exec(['sh', '-c', 'echo mine > /work/pkg/sub/mod.py && rm /work/sum']);
  t.is((await parent.exec(['cat', '/work/pkg/sub/mod.py'])).stdout, 'v2\n');
  t.is((await parent.exec(['sh', '-c', 'test -e /work/sum && echo kept'])).stdout, 'kept\n');

  // A snapshot of a sandbox made from a snapshot: a directory of the lower snapshot replaced
  // (opaque in the new layer) shows only its new entries, and a removed file stays removed.
  await child.exec(['sh', '-c', 'rm -rf /work/old && mkdir /work/old && echo c > /work/old/c']);
  const grand = await child.snapshot();
  t.teardown(() => pdk.snapshots.delete(grand.id).then(() => {}));
  const g = await pdk.sandboxes.create({ fromSnapshot: grand.id, node: n1.id });
  t.teardown(() => g.kill().catch(() => {}));
  t.is((await g.exec(['sh', '-c', 'ls /work/old; cat /work/pkg/sub/mod.py; test -e /work/sum || echo sum-gone'])).stdout, 'c\nmine\nsum-gone\n');

  // A sandbox made without naming a node lands anywhere; the snapshot's image fixes its files.
  const anywhere = await pdk.sandboxes.create({ fromSnapshot: snap.id });
  t.teardown(() => anywhere.kill().catch(() => {}));
  checkOutput(t, (await anywhere.exec(['sh', '-c', CHECK])).stdout);

  // The same tree gives the same layer: a second snapshot of an unchanged child is the same bytes.
  const s1 = await anywhere.snapshot();
  const s2 = await anywhere.snapshot();
  t.is(s1.bytes, s2.bytes);
  await pdk.snapshots.delete(s1.id);
  await pdk.snapshots.delete(s2.id);

  t.true(await pdk.snapshots.delete(snap.id));
  await t.throwsAsync(pdk.sandboxes.create({ fromSnapshot: snap.id }), { code: 'NOT_FOUND' } as never);
  t.false(await pdk.snapshots.delete(snap.id));
});

test.serial('fork(3) of a container: three copies of its files, each its own; the fork leaves no snapshot behind', async (t) => {
  const { pdk, home, cluster } = t.context;
  if (!parent) return t.fail('needs the test before it');
  const before = (await pdk.snapshots.list()).length;
  const copies = await parent.fork(3);
  t.teardown(() => Promise.all(copies.map((c) => c.kill().catch(() => {}))));
  t.is(copies.length, 3);
  for (const [i, c] of copies.entries()) {
    const r = await c.exec(['sh', '-c', `cat /work/pkg/sub/mod.py; echo ${i} > /work/mine`]);
    t.is(r.stdout, 'v2\n', 'a fork has the state of the moment');
  }
  const mine = await Promise.all(copies.map(async (c) => (await c.exec(['cat', '/work/mine'])).stdout.trim()));
  t.deepEqual(mine, ['0', '1', '2']);
  t.is((await pdk.snapshots.list()).length, before);
  const n1 = cluster.nodes[0];
  if (!n1) return t.fail('a node');
  const left = (await readdir(join(home, 'nodes', n1.id, 'snapshots')).catch(() => [] as string[])).filter((f) => !f.endsWith('.json'));
  t.deepEqual(left, [], 'no staging dir or blob left');
});

test.serial("bad input: an unknown snapshot is NOT_FOUND, another image than the snapshot's INVALID_SPEC; a snapshot outlives its sandbox", async (t) => {
  const { pdk } = t.context;
  await t.throwsAsync(pdk.sandboxes.create({ fromSnapshot: 'sn-nosuchsnapshot00' }), { code: 'NOT_FOUND', message: /no snapshot/ } as never);
  await t.throwsAsync(pdk.sandboxes.create({ fromSnapshot: '' }), { code: 'INVALID_SPEC' } as never);
  if (!parent) return t.fail('needs the first test');
  const snap = await parent.snapshot();
  t.teardown(() => pdk.snapshots.delete(snap.id).then(() => {}));
  await t.throwsAsync(pdk.sandboxes.create({ fromSnapshot: snap.id, image: 'python' }), { code: 'INVALID_SPEC', message: /image/ } as never);
  await parent.kill();
  // The snapshot outlives its sandbox.
  const after = await pdk.sandboxes.create({ fromSnapshot: snap.id });
  t.teardown(() => after.kill().catch(() => {}));
  t.is((await after.exec(['cat', '/work/pkg/sub/mod.py'])).stdout, 'v2\n');
});

test.serial('drain --migrate moves migratable sandboxes, files and all, to the other node, asleep ones asleep; handles follow; the others run on', async (t) => {
  const { pdk, cluster } = t.context;
  const [n1, n2] = cluster.nodes;
  if (!n1 || !n2) return t.fail('two nodes');
  const mover = await pdk.sandboxes.create({ node: n1.id, migratable: true, labels: { t: 'move' }, group: 'movers', ttlSec: 3600 });
  const sleeper = await pdk.sandboxes.create({ node: n1.id, migratable: true, labels: { t: 'move-asleep' } });
  const stayer = await pdk.sandboxes.create({ node: n1.id, labels: { t: 'stay' } });
  const ids = [mover.id, sleeper.id];
  t.teardown(async () => {
    await pdk.nodes.undrain(n1.id).catch(() => {});
    for (const sb of [mover, sleeper, stayer]) await sb.kill().catch(() => {});
  });
  const prep = await mover.exec(['sh', '-c', PREPARE]);
  t.is(prep.exitCode, 0, prep.stderr);
  await sleeper.files.write('/work/note', 'written before its sleep');
  await sleeper.pause();
  const [moverId, sleeperId] = ids as [string, string];

  // Calls go on during the move: each either lands before the copy (and is in it) or waits and
  // lands on the copy. None is lost with the old sandbox.
  let appended = 0;
  let moving = true;
  const writer = (async () => {
    while (moving) if ((await mover.exec(['sh', '-c', 'echo x >> /work/log'])).exitCode === 0) appended++;
  })();
  await new Promise((res) => setTimeout(res, 300));
  const r = await pdk.nodes.drain(n1.id, { migrate: true });
  moving = false;
  await writer;
  t.true(appended > 0);
  t.is((await mover.exec(['sh', '-c', 'wc -l < /work/log'])).stdout.trim(), String(appended), 'every append that answered is in the copy');
  t.is(r.state, 'draining');
  t.deepEqual(r.notMigrated, {});
  t.deepEqual(Object.keys(r.migrated ?? {}).sort(), [moverId, sleeperId].sort());
  t.is(r.sandboxes, 1, 'only the one not migratable is left on the node');

  // The same handle: its next call reaches the copy on the other node, which has every file.
  checkOutput(t, (await mover.exec(['sh', '-c', CHECK])).stdout);
  t.is(mover.id, r.migrated?.[moverId] ?? 'none');
  t.like(mover.info, { node: n2.id, state: 'running', group: 'movers', labels: { t: 'move' } });
  t.true(mover.info.expiresAt <= Date.now() + 3600_000, 'the copy has what was left of the TTL');
  const old = await pdk.sandboxes.get(moverId);
  t.like(old.info, { state: 'stopped', reason: 'migrated', movedTo: mover.id, node: n1.id });

  // Asleep before, asleep after; woken, its files are there.
  t.like(await sleeper.refresh(), { id: r.migrated?.[sleeperId], node: n2.id, state: 'paused' });
  t.is((await sleeper.exec(['cat', '/work/note'])).stdout, 'written before its sleep');

  // Not migratable: it runs on where it was.
  t.is((await stayer.exec(['echo', 'here'])).stdout, 'here\n');
  t.is(stayer.info.node, n1.id);

  // No snapshot is left behind by the moves.
  for (const id of ids) t.deepEqual(await pdk.snapshots.list({ from: id }), []);

  // Drained again, nothing is left to move.
  const again = await pdk.nodes.drain(n1.id, { migrate: true });
  t.deepEqual(again.migrated, {});
  t.deepEqual(again.notMigrated, {});
});

test('migratable is for backends with state to move: on the simulated one it is INVALID_SPEC, and a drain request is checked', async (t) => {
  const { pdk, cluster } = t.context;
  await t.throwsAsync(pdk.sandboxes.create({ backend: 'sim', migratable: true }), { code: 'INVALID_SPEC', message: /migratable/ } as never);
  const n1 = cluster.nodes[0];
  if (!n1) return t.fail('a node');
  const m = await connectionOf(pdk).request(subjects.node(n1.id, 'drain'), encode({ migrate: 'yes' }), { timeout: 5000 });
  t.like(decode(m.data), { ok: false, error: { code: 'INVALID_REQUEST' } });
});
