/**
 * The microVM backend through a real node and the SDK: QEMU microvm guests (TCG where /dev/kvm is
 * absent) started as copy-on-write clones of a booted template. Skipped, saying why, where QEMU or
 * the guest kernel is not installed (ops/setup.sh installs both).
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import anyTest, { type TestFn } from 'ava';
import { validateSpec } from '../protocol/index.ts';
import type { LayerManager } from '../runtime/images/layers.ts';
import { hexOf, ImageStore, type LayerRef } from '../runtime/images/store.ts';
import { AgentChannel, T } from '../runtime/microvm/channel.ts';
import { MicrovmBackend } from '../runtime/microvm/index.ts';
import { VMM_OVERHEAD_MIB } from '../runtime/microvm/jail.ts';
import { readText } from '../runtime/sync-read.ts';
import { qemuOf } from '../ops/bench/vm-readings.ts';
import type { Sandbox, SnapshotInfo } from '../sdk/index.ts';
import { type ClusterContext, restartNode, SHARED_IMAGES, startTestCluster, stopTestCluster } from './helpers/cluster.ts';
import { mappers, resident } from './helpers/pages.ts';
import { eventually } from './helpers/wait.ts';

const missing = [
  process.getuid?.() === 0 ? '' : 'root',
  existsSync('/usr/bin/qemu-system-x86_64') ? '' : 'qemu-system-x86 (apt-get install qemu-system-x86)',
  readdirSync('/boot').some((n) => /^vmlinuz-.*-cloud-amd64$/.test(n)) ? '' : 'a guest kernel (apt-get install linux-image-cloud-amd64)',
].filter(Boolean);
const ctxTest = anyTest as TestFn<ClusterContext>;
const test = missing.length > 0 ? ctxTest.skip : ctxTest.serial;
if (missing.length > 0) console.log(`microvm tests skipped: needs ${missing.join(', ')}`);

const MAX_SANDBOXES = 8;

/** QEMU processes of this test's nodes (their command lines name the node directory). */
function qemuPids(home: string): number[] {
  let out = '';
  try {
    out = execFileSync('pgrep', ['-f', `qemu-system-x86_64.*${home}`], { encoding: 'utf8' });
  } catch {
    return [];
  }
  return out.split('\n').filter(Boolean).map(Number);
}

if (missing.length === 0) {
  ctxTest.before(async (t) => {
    // Few sandboxes per node: a fork past them is refused up front, before any snapshot is taken.
    Object.assign(t.context, await startTestCluster({ env: { PADDOCK_BACKENDS: 'container,microvm', PADDOCK_MAX_SANDBOXES: String(MAX_SANDBOXES) } }));
  });
  ctxTest.after.always(async (t) => {
    await stopTestCluster(t.context.cluster ? t.context : undefined);
  });
}

test('create → exec uname -r in a guest kernel of its own; files; stdin', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 256 });
  t.teardown(() => sb.kill().catch(() => {}));
  t.is(sb.info.backend, 'microvm');
  const r = await sb.exec(['uname', '-r']);
  t.is(r.exitCode, 0);
  t.regex(r.stdout, /cloud-amd64/);
  t.not(r.stdout.trim(), execFileSync('uname', ['-r'], { encoding: 'utf8' }).trim());
  // An idle guest's timers that woke its vCPU are off (GUEST_ARGS): the kernel took them from its command line.
  t.is((await sb.exec(['cat', '/proc/sys/vm/compaction_proactiveness', '/proc/sys/vm/stat_interval'])).stdout, '0\n30\n');
  await sb.files.write('/tmp/a/b.txt', 'through the agent');
  t.is(await sb.files.readText('/tmp/a/b.txt'), 'through the agent');
  t.true((await sb.files.list('/tmp/a')).some((e) => e.name === 'b.txt' && e.type === 'file'));
  t.is((await sb.exec(['cat', '/tmp/a/b.txt'])).stdout, 'through the agent');
  t.is((await sb.exec(['cat'], { stdin: 'piped' })).stdout, 'piped');
  // Confined to the guest's root: `..` stops at it.
  t.is(await sb.files.readText('/../../../tmp/a/b.txt'), 'through the agent');
  await sb.files.remove('/tmp/a', { recursive: true });
  await t.throwsAsync(sb.files.readText('/tmp/a/b.txt'), { code: 'NOT_FOUND' } as never);
});

test('hibernate ends the VMM; restore brings back its processes and files', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 256 });
  t.teardown(() => sb.kill().catch(() => {}));
  await sb.exec(['sh', '-c', 'sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/pid']);
  await sb.files.write('/tmp/kept', 'kept');
  // Its template's RAM file is read in whole and mapped by the node's holder (ramhold.c): saving
  // a clone reads every page of it, and none is allocated on that path.
  const tdir = join(t.context.home, 'nodes', t.context.cluster.nodes[0]?.id ?? '', 'microvm', 'templates');
  const mems = readdirSync(tdir).map((d) => join(tdir, d, 'mem'));
  t.true(mems.length > 0);
  const held = await eventually(async () => {
    const holders = execFileSync('pgrep', ['-f', '/ramhold-'], { encoding: 'utf8' }).split('\n').filter(Boolean).map(Number);
    return mems.every((f) => mappers(holders, f).length > 0 && resident(f) === statSync(f).size);
  });
  t.true(held, `${mems.join(', ')} held in memory`);
  // The node's allocator settings (ops/launch.ts) are the node's: its VMMs, bounded to their
  // guest's RAM plus an overhead, start with glibc's defaults.
  const environ = (pid: number) => readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
  const nodePid = t.context.cluster.nodes[0]?.proc.pid as number;
  if (process.env.MALLOC_TRIM_THRESHOLD_ === undefined) {
    t.true(environ(nodePid).includes(`MALLOC_TRIM_THRESHOLD_=${32 << 20}`), 'the node started with them');
    for (const q of qemuPids(t.context.home)) t.false(environ(q).some((e) => e.startsWith('MALLOC_')), `QEMU ${q} did not inherit them`);
  }
  const home = t.context.home;
  const own = await qemuOf(home, sb.id);
  t.truthy(own, 'its VMM is found');
  const others = qemuPids(home).filter((p) => p !== own);
  const h = await sb.hibernate();
  t.is(h.state, 'hibernated');
  t.false(existsSync(`/proc/${own}`), 'its VMM exited');
  // A blank VMM of its template waits for the restore: QEMU's start-up is off the restore's path.
  const blank = await eventually(async () => qemuPids(home).find((p) => !others.includes(p)));
  t.truthy(blank, 'a blank VMM was started');
  t.is((await sb.restore()).state, 'running');
  t.is(await qemuOf(home, sb.id), blank, 'it runs on in the blank VMM');
  t.is(await sb.files.readText('/tmp/kept'), 'kept');
  const alive = await sb.exec(['sh', '-c', 'kill -0 $(cat /tmp/pid) && echo alive']);
  t.is(alive.stdout, 'alive\n');
});

/** The hibernation state file of the one hibernated VM of the test cluster's node. */
function hibernationState(c: ClusterContext): string {
  const vms = join(c.home, 'nodes', c.cluster.nodes[0]?.id ?? '', 'microvm', 'vms');
  const found = readdirSync(vms)
    .map((d) => join(vms, d, 'state'))
    .filter((f) => existsSync(f));
  if (found.length !== 1) throw new Error(`${found.length} hibernated VMs under ${vms}`);
  return found[0] as string;
}

test('a hibernation keeps only what differs from the template, and restores exactly; one whose template was made again is refused, not loaded', async (t) => {
  const { pdk } = t.context;
  const sb = await pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 256 });
  t.teardown(() => sb.kill().catch(() => {}));
  // Random bytes in the guest's RAM (its writable layer is a tmpfs there): no page of them is the template's.
  const sum = await sh(sb, 'head -c 8388608 /dev/urandom > /tmp/blob; sha256sum /tmp/blob; sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/pid');
  // A named snapshot may go to another node, whose template was booted on its own: it holds every page.
  const whole = await sb.snapshot();
  await pdk.snapshots.delete(whole.id);
  await sb.hibernate();
  const state = hibernationState(t.context);
  const bytes = statSync(state).size;
  t.true(existsSync(`${state}.base`), 'the template it is a difference from is noted');
  t.true(bytes > 8 << 20, `the written pages are in it (${bytes} bytes)`);
  t.true(bytes < whole.bytes - (8 << 20), `the template's pages are not (${bytes} bytes, against ${whole.bytes} for the whole state)`);
  t.log(`hibernated: ${bytes} bytes; the whole state: ${whole.bytes}`);
  t.is((await sb.restore()).state, 'running');
  t.is(await sh(sb, 'sha256sum /tmp/blob; kill -0 $(cat /tmp/pid) && echo alive'), `${sum}alive\n`);

  // Its template made again since (the same machine, booted anew): its RAM is not the one the
  // state leaves out, so loading it would give the guest another's memory.
  await sb.hibernate();
  // A restore runs the VM on in another VMM's directory: its state is there now.
  const again = hibernationState(t.context);
  t.not(again, state);
  const noted = readFileSync(`${again}.base`, 'utf8');
  await writeFile(`${again}.base`, `${noted}-another`);
  const e = await t.throwsAsync(sb.restore());
  t.regex(String(e?.message), /made again/);
  // Nothing else could wake it: it ends failed, saying why, and its files go.
  const now = await sb.refresh();
  t.is(now.state, 'failed');
  t.regex(now.error?.message ?? '', /made again/);
  t.false(existsSync(again), 'its state went with it');
  t.false(existsSync(state), 'and the first one with the restore');
});

test('a timeout ends the exec with a verdict and kills its process tree; destroy leaves no QEMU', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 256 });
  const slow = await sb.exec(['sh', '-c', 'sleep 60 & sleep 60'], { timeoutMs: 500 });
  t.true(slow.timedOut);
  t.is(slow.verdict, 'TIMEOUT');
  t.is((await sb.exec(['sh', '-c', 'pgrep sleep | wc -l'])).stdout.trim(), '0');
  const big = await sb.exec(['sh', '-c', 'yes | head -c 200000'], { maxOutputBytes: 1000 });
  t.is(big.verdict, 'OUTPUT_LIMIT');
  t.is(big.stdout.length, 1000);
  const own = await qemuOf(t.context.home, sb.id);
  t.truthy(own, 'its VMM is found');
  t.is((await sb.kill()).state, 'stopped');
  t.false(existsSync(`/proc/${own}`), 'its VMM is gone');
});

test('verdicts as on a container: a memory hog is MEMORY_LIMIT, a fork bomb PIDS_LIMIT and ended at once; the sandbox serves on', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 256, pidsLimit: 64 });
  t.teardown(() => sb.kill().catch(() => {}));
  // A line that never ends, held whole: it grows until the guest's OOM killer ends it.
  const hog = await sb.exec(['tail', '/dev/zero']);
  t.is(hog.verdict, 'MEMORY_LIMIT', hog.stderr);
  t.not(hog.exitCode, 0);
  // Background sleeps past the sandbox's 64 processes: its exec ends when the limit bites, long before its timeout.
  const bomb = await sb.exec(['sh', '-c', 'i=0; while [ $i -lt 200 ]; do sleep 300 & i=$((i+1)); done; wait'], { timeoutMs: 120_000 });
  t.is(bomb.verdict, 'PIDS_LIMIT', bomb.stderr);
  t.false(bomb.timedOut);
  const ok = await sb.exec(['sh', '-c', 'echo fine; pgrep sleep | wc -l']);
  t.is(ok.verdict, 'OK');
  t.is(ok.stdout, 'fine\n0\n', "the bomb's processes went with it");
});

/** A QEMU process of this test's: its uid, directory (from its -pidfile) and cgroup (v1 memory or v2 unified path). */
function vmm(pid: number): { pid: number; uid: number; dir: string; cgroup: string } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const uid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]);
  const args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  const dir = dirname(args[args.indexOf('-pidfile') + 1] ?? '');
  const lines = readFileSync(`/proc/${pid}/cgroup`, 'utf8').split('\n');
  const cgroup = (lines.find((l) => /^\d+:[^:]*\bmemory\b[^:]*:/.test(l)) ?? lines.find((l) => l.startsWith('0::')) ?? '').split(':')[2] ?? '';
  return { pid, uid, dir, cgroup };
}

function cgroupFile(cgroup: string, controller: string, v1: string, v2: string): string {
  return existsSync('/sys/fs/cgroup/cgroup.controllers') ? join('/sys/fs/cgroup', cgroup, v2) : join('/sys/fs/cgroup', controller, cgroup, v1);
}

test('each VMM is a host user of its own with no capability, chrooted in its own directory, in a cgroup bounding its CPU, memory and pids; kill removes both', async (t) => {
  const { pdk, home } = t.context;
  const a = await pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 256, cpu: 0.5 });
  t.teardown(() => a.kill().catch(() => {}));
  const b = await pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 256 });
  t.teardown(() => b.kill().catch(() => {}));
  // The spares waiting for the next create are VMMs too, held to the same. One may be starting:
  // QEMU drops to its user once it has opened its files, before it answers QMP.
  let all = qemuPids(home).map(vmm);
  for (let i = 0; i < 100 && all.some((v) => v.uid === 0); i++) {
    await new Promise((r) => setTimeout(r, 100));
    all = qemuPids(home).map(vmm);
  }
  t.true(all.length >= 2);
  for (const v of all) {
    t.true(v.uid >= 1_000_000_000, `QEMU ${v.pid} runs as uid ${v.uid}`);
    t.regex(readFileSync(`/proc/${v.pid}/status`, 'utf8'), /^CapEff:\s+0+$/m);
    t.regex(readFileSync(`/proc/${v.pid}/status`, 'utf8'), /^NoNewPrivs:\s+1$/m);
    t.regex(v.cgroup, /^\/paddock-vmm\/.+\/microvm\/[0-9a-f]+$/);
    t.is(readFileSync(cgroupFile(v.cgroup, 'memory', 'memory.limit_in_bytes', 'memory.max'), 'utf8').trim(), String((256 + VMM_OVERHEAD_MIB) * 1024 * 1024));
    t.is(readFileSync(cgroupFile(v.cgroup, 'pids', 'pids.max', 'pids.max'), 'utf8').trim(), '512');
    t.is(statSync(v.dir).uid, v.uid, 'its directory is its own');
    // Its root is that directory (-chroot): its console log is there, the host's files are not
    // (no shell, no /etc, no other VM's directory to reach by path).
    t.true(existsSync(`/proc/${v.pid}/root/console.log`), `QEMU ${v.pid} sees its directory as /`);
    for (const host of ['bin/sh', 'etc/passwd', 'proc', 'usr']) t.false(existsSync(`/proc/${v.pid}/root/${host}`), `QEMU ${v.pid} sees no /${host}`);
  }
  t.is(new Set(all.map((v) => v.uid)).size, all.length, 'no two VMMs share a user');
  // The sandbox asked for half a CPU: all of its QEMU's threads together get half a period.
  const quota = (v: { cgroup: string }) => readFileSync(cgroupFile(v.cgroup, 'cpu', 'cpu.cfs_quota_us', 'cpu.max'), 'utf8').trim().split(' ')[0];
  const half = all.filter((v) => quota(v) === '50000');
  t.is(half.length, 1, 'one VMM runs at half a CPU: the sandbox that asked for it');
  const other = all.find((v) => v !== half[0]) as (typeof all)[number];
  // One VMM's user cannot read what another's holds.
  const peek = spawnSync('setpriv', ['--reuid', String(half[0]?.uid), '--regid', String(half[0]?.uid), '--clear-groups', 'cat', join(other.dir, 'console.log')], { encoding: 'utf8' });
  t.not(peek.status, 0);
  t.regex(peek.stderr, /Permission denied/);
  t.is((await a.exec(['true'])).exitCode, 0, 'and the guest runs under its bounds');

  const gone = half[0] as (typeof all)[number];
  await a.kill();
  t.false(existsSync(cgroupFile(gone.cgroup, 'memory', '', '')), 'its cgroup went with it');
  t.is(spawnSync('pgrep', ['-u', String(gone.uid)]).status, 1, 'nothing runs as its user');
});

test('free-page reporting: memory the guest fills and frees goes back to the host', async (t) => {
  const { pdk, home } = t.context;
  const sb = await pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 512 });
  t.teardown(() => sb.kill().catch(() => {}));
  // Spares waiting for the next create have no meta.json yet.
  const pid = qemuPids(home).find((p) => (readText(join(vmm(p).dir, 'meta.json')) ?? '').includes(`"${sb.id}"`));
  if (!pid) return t.fail('no QEMU for the sandbox');
  // Pages of its own (written since it was cloned from its template), as QEMU holds them.
  const anon = () => Number(/^Anonymous:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'))?.[1]) * 1024;
  const before = anon();
  const templateRam = templateRamOf(t.context);
  const ram = templateRam();
  // A 192 MiB buffer, filled, then freed when dd exits.
  t.is((await sb.exec(['dd', 'if=/dev/zero', 'of=/dev/null', 'bs=192M', 'count=1'])).exitCode, 0);
  const full = anon();
  t.true(full - before > 128 * 1024 * 1024, `the buffer took ${full - before} bytes of the host`);
  // The guest reports freed 2 MiB blocks after 2 s; QEMU drops them: the template's pages show through again.
  const back = await eventually(async () => anon() < before + 64 * 1024 * 1024);
  t.true(back, `QEMU still holds ${anon() - before} bytes more than before the buffer`);
  // ...and only its own copies: the template's RAM file, under every other clone, is as it was
  // (QEMU 7.2 also punched a hole in it for each report: vmm-exec.c).
  t.deepEqual(templateRam(), ram, 'the template is unchanged');
});

/** The 512 MiB template's RAM file of the test cluster's node: its content's hash, modification time and allocated blocks. */
function templateRamOf(c: ClusterContext): () => { sha256: string; mtimeMs: number; blocks: number } {
  const dir = join(c.home, 'nodes', c.cluster.nodes[0]?.id ?? '', 'microvm', 'templates');
  const mems = readdirSync(dir)
    .map((k) => join(dir, k, 'mem'))
    .filter((f) => existsSync(f) && statSync(f).size === 512 << 20);
  if (mems.length !== 1) throw new Error(`${mems.length} templates of 512 MiB under ${dir}`);
  const mem = mems[0] as string;
  return () => {
    const st = statSync(mem);
    return { sha256: createHash('sha256').update(readFileSync(mem)).digest('hex'), mtimeMs: st.mtimeMs, blocks: st.blocks };
  };
}

/**
 * The backend's Snapshotting capability, below the node (no SDK verb reaches it yet): a fork starts
 * as a copy of the running VM, then each goes its own way.
 */
test('fork: a copy of a running VM, its files and processes, that then goes its own way', async (t) => {
  const store = new ImageStore(SHARED_IMAGES);
  await store.init();
  const image = await store.get('busybox');
  if (!image) throw new Error('no busybox image in the shared store');
  const layerFile = (ref: LayerRef) => join(SHARED_IMAGES, 'blobs', 'sha256', `${hexOf(ref.digest)}.erofs`);
  const layers = { acquireFile: async (ref: LayerRef) => layerFile(ref), releaseFile: () => {} } as unknown as LayerManager;
  const nodeDir = await mkdtemp(join(tmpdir(), 'paddock-microvm-'));
  const b = new MicrovmBackend({ nodeDir, nodeId: `fork${process.pid}`, binDir: process.env.PADDOCK_BIN_DIR || '/var/cache/paddock/bin', layers, resolve: async () => image, spares: 0 });
  t.teardown(async () => {
    await b.close();
    await rm(nodeDir, { recursive: true, force: true });
  });
  await b.init();
  const spec = validateSpec({ memoryMiB: 256 });
  await b.create('parent', spec);
  const run = async (id: string, cmd: string) => (await b.exec(id, { cmd: ['sh', '-c', cmd], timeoutMs: 30_000, maxOutputBytes: 65536 })).stdout.toString();
  await run('parent', 'echo before > /tmp/f; sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/pid');
  await b.fork('parent', 'child', spec);
  t.is(await run('child', 'cat /tmp/f; kill -0 $(cat /tmp/pid) && echo alive'), 'before\nalive\n');
  await run('child', 'echo child > /tmp/f');
  t.is(await run('parent', 'cat /tmp/f'), 'before\n');
  t.not(await run('child', 'hostname'), await run('parent', 'hostname'));
  await b.destroy('child');
  await b.destroy('parent');
  t.deepEqual(qemuPids(nodeDir), []);
  t.deepEqual(await readdir(join(nodeDir, 'microvm', 'vms')), []);
  t.deepEqual(await readdir(join(nodeDir, 'microvm', 'snapshots')), []);
});

/** Files in the node's snapshot directory. */
async function snapshotFiles(c: ClusterContext): Promise<string[]> {
  const node = c.cluster.nodes[0];
  if (!node) throw new Error('no node');
  return (await readdir(join(c.home, 'nodes', node.id, 'microvm', 'snapshots'))).sort();
}

const sh = async (sb: Sandbox, cmd: string) => (await sb.exec(['sh', '-c', cmd])).stdout;

/** The VM the snapshot tests below share (a boot under TCG costs seconds), and its snapshot. */
const shared: { parent?: Sandbox; snap?: SnapshotInfo } = {};

test('snapshot through the SDK: a sandbox made from it has its file and process, then goes its own way', async (t) => {
  const { pdk } = t.context;
  const parent = await pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 256, group: 'snapjob', labels: { role: 'parent' } });
  shared.parent = parent;
  await sh(parent, 'echo before > /tmp/f; sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/pid');
  // A sleeping sandbox is woken for it, as for an exec.
  await parent.pause();
  const snap = await parent.snapshot();
  t.is((await parent.refresh()).state, 'running');
  shared.snap = snap;
  t.like(snap, { from: parent.id, node: parent.info.node, backend: 'microvm', image: parent.info.image, memoryMiB: 256 });
  t.regex(snap.id, /^sn-/);
  t.true(snap.bytes > 0);
  t.deepEqual(await snapshotFiles(t.context), [`${snap.id}.json`, `${snap.id}.state`]);
  t.is(await sh(parent, 'cat /tmp/f'), 'before\n', 'the parent runs on');

  const copy = await pdk.sandboxes.create({ fromSnapshot: snap.id });
  t.teardown(() => copy.kill().catch(() => {}));
  t.like(copy.info, { backend: 'microvm', memoryMiB: 256, node: snap.node, state: 'running' });
  t.not(copy.id, parent.id);
  t.is(await sh(copy, 'cat /tmp/f; kill -0 $(cat /tmp/pid) && echo alive'), 'before\nalive\n');
  await sh(copy, 'echo copy > /tmp/f');
  t.is(await sh(parent, 'cat /tmp/f'), 'before\n');
  t.is(await sh(copy, 'cat /tmp/f'), 'copy\n');
  t.not(await sh(copy, 'hostname'), await sh(parent, 'hostname'));
  t.true((await pdk.sandboxes.list({ backend: 'microvm' })).some((s) => s.id === copy.id), 'a sandbox of its own in the directory');

  // The snapshot fixes the machine; an unknown one is NOT_FOUND.
  await t.throwsAsync(pdk.sandboxes.create({ fromSnapshot: snap.id, memoryMiB: 512 }), { code: 'INVALID_SPEC', message: /memoryMiB/ } as never);
  await t.throwsAsync(pdk.sandboxes.create({ fromSnapshot: snap.id, backend: 'container' }), { code: 'INVALID_SPEC', message: /backend/ } as never);
  await t.throwsAsync(pdk.sandboxes.create({ fromSnapshot: 'sn-nosuchsnapshot00' }), { code: 'NOT_FOUND', message: /no snapshot/ } as never);
});

test('fork(3): three independent copies on the same node, with the parent’s group and labels; fork past capacity makes none', async (t) => {
  const { pdk } = t.context;
  const { parent, snap } = shared;
  if (!parent || !snap) return t.fail('needs the snapshot test before it');
  const kids = await parent.fork(3);
  t.teardown(() => Promise.all(kids.map((k) => k.kill().catch(() => {}))));
  t.is(kids.length, 3);
  t.is(new Set([parent.id, ...kids.map((k) => k.id)]).size, 4);
  for (const k of kids) t.like(k.info, { state: 'running', node: parent.info.node, backend: 'microvm', group: 'snapjob', labels: { role: 'parent' } });
  await Promise.all(kids.map((k) => sh(k, `echo ${k.id} > /tmp/f`)));
  for (const k of kids) t.is(await sh(k, 'cat /tmp/f; kill -0 $(cat /tmp/pid) && echo alive'), `${k.id}\nalive\n`);
  t.is(await sh(parent, 'cat /tmp/f'), 'before\n');
  const listed = (await pdk.sandboxes.list({ group: 'snapjob' })).map((s) => s.id);
  for (const k of kids) t.true(listed.includes(k.id));
  // The fork's own snapshot is gone with the fork; only the one taken on purpose stays.
  t.deepEqual((await pdk.snapshots.list({ from: parent.id })).map((s) => s.id), [snap.id]);
  t.deepEqual(await snapshotFiles(t.context), [`${snap.id}.json`, `${snap.id}.state`]);
  await Promise.all(kids.map((k) => k.kill()));

  const before = (await pdk.sandboxes.list()).length;
  await t.throwsAsync(parent.fork(MAX_SANDBOXES), { code: 'NO_CAPACITY', message: /cannot fork/ } as never);
  t.is((await pdk.sandboxes.list()).length, before, 'none made');
  t.deepEqual(await snapshotFiles(t.context), [`${snap.id}.json`, `${snap.id}.state`]);
});

test('snapshots outlive their sandbox and a node restart; a node past its snapshot budget refuses; delete removes the files, twice is harmless', async (t) => {
  const { pdk, cluster, home } = t.context;
  const { parent, snap } = shared;
  if (!parent || !snap) return t.fail('needs the snapshot test before it');
  await parent.kill();
  t.deepEqual((await pdk.snapshots.list()).map((s) => s.id), [snap.id], 'killing its sandbox keeps it');

  const node = cluster.nodes[0];
  if (!node) return t.fail('no node');
  await node.stop();
  cluster.nodes[0] = await restartNode({ cluster, home }, node.id, { PADDOCK_BACKENDS: 'container,microvm', PADDOCK_MAX_SANDBOXES: String(MAX_SANDBOXES), PADDOCK_SNAPSHOT_BUDGET_MIB: '200' });
  t.deepEqual(await pdk.snapshots.list(), [snap], 'listed again, as it was');
  const again = await pdk.sandboxes.create({ fromSnapshot: snap.id });
  t.teardown(() => again.kill().catch(() => {}));
  t.is(await sh(again, 'cat /tmp/f; kill -0 $(cat /tmp/pid) && echo alive'), 'before\nalive\n');

  // 200 MiB: not room for the memory of a 256 MiB VM beside the snapshot held.
  const err = await t.throwsAsync(again.snapshot(), { code: 'NO_CAPACITY', message: /snapshot budget/ } as never);
  t.is((err as unknown as { detail?: { reason?: string } }).detail?.reason, 'snapshot_budget');
  t.deepEqual((await pdk.snapshots.list()).map((s) => s.id), [snap.id]);
  t.deepEqual(await snapshotFiles(t.context), [`${snap.id}.json`, `${snap.id}.state`], 'nothing left of the refused one');

  t.true(await pdk.snapshots.delete(snap.id));
  t.deepEqual(await pdk.snapshots.list(), []);
  t.deepEqual(await snapshotFiles(t.context), []);
  t.false(await pdk.snapshots.delete(snap.id), 'a second delete is harmless');
  await t.throwsAsync(pdk.sandboxes.create({ fromSnapshot: snap.id }), { code: 'NOT_FOUND' } as never);
  t.is(await sh(again, 'cat /tmp/f'), 'before\n', 'a sandbox made from it runs on');
});

/** The host side trusts nothing the guest sends: a frame out of bounds or of no known kind cuts the channel, the node serves on. */
ctxTest('the agent channel cuts off a guest that sends an oversized frame or one of an unknown type', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'paddock-agent-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  for (const [name, frame] of [
    ['oversized', Buffer.from([0xff, 0xff, 0xff, 0x7f, 101, 0, 0, 0, 1, 0, 0, 0])],
    ['unknown type', Buffer.from([0, 0, 0, 0, 77, 0, 0, 0, 1, 0, 0, 0])],
    ['unasked reply', Buffer.from([4, 0, 0, 0, 104, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0])],
  ] as const) {
    const path = join(dir, `${name.replace(/ /g, '-')}.sock`);
    const server = createServer((s) => s.write(frame));
    await new Promise<void>((r) => server.listen(path, r));
    const ch = await AgentChannel.open(path);
    const broken = await new Promise<string>((r) => {
      ch.onBroken = r;
    });
    t.regex(broken, /the guest sent/, name);
    await t.throwsAsync(ch.request(T.PING), { message: /the guest sent/ }, name);
    ch.close();
    await new Promise((r) => server.close(r));
  }
});
