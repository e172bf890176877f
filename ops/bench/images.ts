/**
 * The image benchmark: a small replica of the paper's two image experiments on this machine.
 *
 *   npm run bench:images [-- --n 32] [-- --json]
 *
 * a) lazy vs eager vs local: N sandboxes of the `python` image (bookworm + python3 + pytest + git,
 *    built once into $PADDOCK_IMAGES_DIR) with a small pytest workspace on top, all created at
 *    once, each running a recorded tool-call sequence (python3 imports, pytest, git status).
 *    lazy: a node with an empty layer cache loading layers on first read from its store;
 *    eager: a node with an empty cache downloading whole layers before mounting;
 *    local: a node whose cache already holds every layer (what eager left behind).
 *    Page caches are dropped before each mode, so each starts cold from disk.
 * b) layers vs tar.gz: the same toolkit + workspace for N sandboxes, either as EROFS layers
 *    mounted once and shared (overlay per sandbox), or as a tar.gz extracted into a directory per
 *    sandbox (overlay over it); each sandbox (a chroot in the overlay) runs the same sequence.
 *
 * Disk writes are the host's block-device counters (/proc/diskstats, whole disks) around each
 * run, after a sync: other work on the host during a run is counted too.
 */
import { spawn } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { loadConfig } from '../../runtime/config.ts';
import { ensurePythonImage } from '../../runtime/images/build.ts';
import { MS_RDONLY, sysMount } from '../../runtime/images/fuse.ts';
import { type ImageManifest, ImageStore } from '../../runtime/images/store.ts';
import { run } from '../../runtime/proc.ts';
import { Paddock } from '../../sdk/index.ts';
import { startLocalCluster } from '../local.ts';

const USAGE = 'usage: images.ts [--n N] [--json]';
const progress = (msg: string) => process.stderr.write(`bench: ${msg}\n`);

/** The recorded tool calls of one agent turn sequence. */
const SEQUENCE = [
  ['python3', '-c', 'import json, os, re, subprocess, unittest, email, http.client, sqlite3, decimal; print("ok")'],
  ['python3', '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '/work'],
  ['git', '-C', '/work', 'status', '--short'],
];
const WS_NAME = 'bench-workspace';
const TARGETS = { eagerOverLazy: 1.7, lazyWritesOverEager: 0.5, lazyOverLocal: 1.2, tarOverLayers: 1.76, tarWritesOverLayers: 5, lazyFetchShare: 0.25 };

interface ModeResult {
  wallMs: number;
  fetchedBytes: number;
  diskWriteBytes: number;
  failures: number;
}

function parseArgs(argv: string[]): { n: number; json: boolean } {
  const o = { n: 32, json: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === '--json') o.json = true;
    else if (a === '--n' || a.startsWith('--n=')) {
      const v = Number(a === '--n' ? argv[++i] : a.slice(4));
      if (!Number.isInteger(v) || v < 1) throw new Error(`--n: a positive integer\n${USAGE}`);
      o.n = v;
    } else if (a === '-h' || a === '--help') {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    } else throw new Error(`unknown argument ${a}\n${USAGE}`);
  }
  return o;
}

/** Sectors written to whole disks (not partitions, not loop or zram devices), in bytes. */
async function diskWrites(): Promise<number> {
  await run('sync', []);
  let bytes = 0;
  for (const line of (await readFile('/proc/diskstats', 'utf8')).split('\n')) {
    const f = line.trim().split(/\s+/);
    const name = f[2] ?? '';
    if (!/^(vd[a-z]+|sd[a-z]+|nvme\d+n\d+|xvd[a-z]+)$/.test(name)) continue;
    bytes += Number(f[9] ?? 0) * 512;
  }
  return bytes;
}

async function dropCaches(): Promise<void> {
  await run('sync', []);
  await writeFile('/proc/sys/vm/drop_caches', '3').catch(() => progress('cannot drop page caches (not root?): runs start warm'));
}

/** A small project: a module, its tests, a git repository. */
async function workspaceDir(root: string): Promise<string> {
  const d = join(root, 'ws', 'work');
  await mkdir(join(d, 'tests'), { recursive: true });
  await writeFile(join(d, 'calc.py'), 'def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n');
  await writeFile(join(d, 'tests', 'test_calc.py'), 'import sys\nsys.path.insert(0, "/work")\nfrom calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n');
  const git = (args: string[]) => run('git', ['-C', d, ...args]);
  await git(['init', '-q']);
  await git(['add', '.']);
  await git(['-c', 'user.name=bench', '-c', 'user.email=bench@paddock', 'commit', '-q', '-m', 'start']);
  return join(root, 'ws');
}

async function modeRun(o: { mode: 'lazy' | 'eager'; cacheDir: string; imagesDir: string; n: number; home: string }): Promise<ModeResult> {
  const cluster = await startLocalCluster({
    home: o.home,
    nodes: 1,
    prefix: `bimg${process.pid}${o.mode}${Math.random().toString(36).slice(2, 5)}n`,
    imagesDir: o.imagesDir,
    env: { PADDOCK_LAYER_MODE: o.mode, PADDOCK_LAYER_CACHE_DIR: o.cacheDir, PADDOCK_MAX_SANDBOXES: '4096', PADDOCK_HEARTBEAT_MS: '1000' },
  });
  const pdk = await Paddock.connect({ servers: cluster.url, timeoutMs: 600_000 });
  try {
    await dropCaches();
    const w0 = await diskWrites();
    const t0 = performance.now();
    let failures = 0;
    const sbs = await Promise.all(
      Array.from({ length: o.n }, async () => {
        const sb = await pdk.sandboxes.create({ image: 'python', workspace: WS_NAME, memoryMiB: 512 });
        for (const cmd of SEQUENCE) {
          const r = await sb.exec(cmd, { timeoutMs: 300_000 });
          if (r.exitCode !== 0) {
            failures++;
            progress(`${cmd.join(' ').slice(0, 40)}: exit ${r.exitCode}: ${Buffer.from(r.stderr).toString().slice(0, 300)}`);
          }
        }
        return sb;
      }),
    );
    const wallMs = performance.now() - t0;
    const w1 = await diskWrites();
    const info = await pdk.nodes.info(cluster.nodes[0]!.id);
    await Promise.all(sbs.map((s) => s.kill()));
    return { wallMs, fetchedBytes: info.layers?.fetchedBytes ?? 0, diskWriteBytes: w1 - w0, failures };
  } finally {
    await pdk.close();
    await cluster.stop();
  }
}

/** b) one run of N chroot "sandboxes" over either shared layers or per-sandbox tar.gz extractions. */
async function deliveryRun(o: { kind: 'layers' | 'tar'; n: number; root: string; base: string; layers: string[]; tarball: string }): Promise<{ wallMs: number; diskWriteBytes: number }> {
  const dir = join(o.root, o.kind);
  await mkdir(dir, { recursive: true });
  const mounted: string[] = [];
  let seq = 0;
  const mnt = async (src: string) => {
    // Named before the first await: mounts made concurrently must not share a mount point (the
    // same directory twice in lowerdir is an overlay loop, ELOOP).
    const target = join(dir, `l${seq++}`);
    await mkdir(target, { recursive: true });
    await sysMount(src, target, 'erofs', MS_RDONLY, '');
    mounted.push(target);
    return target;
  };
  const roots: string[] = [];
  try {
    await dropCaches();
    const w0 = await diskWrites();
    const t0 = performance.now();
    const baseDir = await mnt(o.base);
    const shared = o.kind === 'layers' ? await Promise.all(o.layers.map(mnt)) : [];
    let next = 0;
    const worker = async () => {
      for (let i = next++; i < o.n; i = next++) {
        const sb = join(dir, `sb${i}`);
        for (const d of ['upper', 'work', 'root', 'unpacked']) await mkdir(join(sb, d), { recursive: true });
        let lowers: string[];
        if (o.kind === 'tar') {
          await run('tar', ['-xzf', o.tarball, '-C', join(sb, 'unpacked')], { timeoutMs: 600_000 });
          lowers = [join(sb, 'unpacked'), baseDir];
        } else lowers = [...shared].reverse().concat(baseDir);
        await run('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lowers.join(':')},upperdir=${join(sb, 'upper')},workdir=${join(sb, 'work')}`, join(sb, 'root')]);
        roots.push(join(sb, 'root'));
        for (const cmd of SEQUENCE) await run('chroot', [join(sb, 'root'), 'env', 'PATH=/usr/bin:/bin', 'HOME=/root', 'PYTHONDONTWRITEBYTECODE=1', ...cmd], { timeoutMs: 300_000 });
      }
    };
    await Promise.all(Array.from({ length: 4 }, worker));
    const wallMs = performance.now() - t0;
    const w1 = await diskWrites();
    return { wallMs, diskWriteBytes: w1 - w0 };
  } finally {
    for (const r of roots) await run('umount', ['-l', r], { allowFail: true });
    for (const m of mounted.reverse()) await run('umount', ['-l', m], { allowFail: true });
    await rm(dir, { recursive: true, force: true });
  }
}

const mib = (b: number) => `${(b / 1024 / 1024).toFixed(1)} MiB`;
const sec = (ms: number) => `${(ms / 1000).toFixed(2)} s`;

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  // Part b mounts: keep them in a namespace of our own, gone when we are.
  if (process.env.PADDOCK_BENCH_NS !== '1') {
    const child = spawn('unshare', ['--mount', '--propagation', 'private', process.execPath, ...process.execArgv, process.argv[1] as string, ...process.argv.slice(2)], { stdio: 'inherit', env: { ...process.env, PADDOCK_BENCH_NS: '1' } });
    child.on('exit', (c) => process.exit(c ?? 1));
    return;
  }
  const imagesDir = loadConfig().imagesDir;
  const store = new ImageStore(imagesDir);
  progress(`python image in ${imagesDir} (built once; ~1 min the first time)`);
  const py: ImageManifest = await ensurePythonImage(store);
  const root = await mkdtemp(join(tmpdir(), 'paddock-bench-images-'));
  try {
    const ws = await workspaceDir(root);
    const wsLayer = await store.buildLayer(ws);
    await store.putManifest({ ...py, name: WS_NAME, layers: [wsLayer], env: [], cwd: '/work' });
    const imageBytes = py.layers.reduce((s, l) => s + l.size, 0) + wsLayer.size;

    const results: Record<'lazy' | 'eager' | 'local', ModeResult> = {} as never;
    const lazyCache = join(root, 'cache-lazy');
    const eagerCache = join(root, 'cache-eager');
    progress(`a) lazy: ${o.n} sandboxes, empty cache`);
    results.lazy = await modeRun({ mode: 'lazy', cacheDir: lazyCache, imagesDir, n: o.n, home: join(root, 'home-lazy') });
    progress(`a) eager: ${o.n} sandboxes, empty cache`);
    results.eager = await modeRun({ mode: 'eager', cacheDir: eagerCache, imagesDir, n: o.n, home: join(root, 'home-eager') });
    progress(`a) local: ${o.n} sandboxes, every layer already in the cache`);
    results.local = await modeRun({ mode: 'lazy', cacheDir: eagerCache, imagesDir, n: o.n, home: join(root, 'home-local') });

    progress('b) packing toolkit + workspace as a tar.gz');
    const [baseRef, toolkitRef] = py.layers as [ImageManifest['layers'][number], ImageManifest['layers'][number]];
    const tarball = join(root, 'toolkit-workspace.tar.gz');
    const unpack = join(root, 'unpack');
    await mkdir(unpack);
    // The tarball holds exactly what the two layers hold: dump both trees and pack them.
    const dumpMnt = join(root, 'dump');
    for (const [i, ref] of [toolkitRef, wsLayer].entries()) {
      await mkdir(`${dumpMnt}${i}`, { recursive: true });
      await sysMount(store.blobPath(ref.digest), `${dumpMnt}${i}`, 'erofs', MS_RDONLY, '');
      await run('cp', ['-a', `${dumpMnt}${i}/.`, unpack], { timeoutMs: 600_000 });
      await run('umount', [`${dumpMnt}${i}`]);
    }
    await run('tar', ['-czf', tarball, '-C', unpack, '.'], { timeoutMs: 600_000 });
    await rm(unpack, { recursive: true, force: true });
    progress(`b) tar.gz: ${o.n} sandboxes, each extracting it`);
    const tar = await deliveryRun({ kind: 'tar', n: o.n, root, base: store.blobPath(baseRef.digest), layers: [], tarball });
    progress(`b) layers: ${o.n} sandboxes over shared EROFS layers`);
    const layers = await deliveryRun({ kind: 'layers', n: o.n, root, base: store.blobPath(baseRef.digest), layers: [store.blobPath(toolkitRef.digest), store.blobPath(wsLayer.digest)], tarball });

    const r = (a: number, b: number) => (b > 0 ? a / b : Number.POSITIVE_INFINITY);
    const check = (ok: boolean) => (ok ? 'meets' : 'MISSES');
    const lines = [
      `a) ${o.n} sandboxes of python (${mib(imageBytes)} in ${py.layers.length + 1} layers), tool calls: python3 imports, pytest, git status`,
      `   mode    wall      fetched from store   disk written   failures`,
      ...(['lazy', 'eager', 'local'] as const).map((m) => `   ${m.padEnd(6)}  ${sec(results[m].wallMs).padStart(8)}  ${mib(results[m].fetchedBytes).padStart(12)}        ${mib(results[m].diskWriteBytes).padStart(11)}   ${results[m].failures}`),
      `   eager/lazy wall ${r(results.eager.wallMs, results.lazy.wallMs).toFixed(2)}× (target ≥ ${TARGETS.eagerOverLazy}×: ${check(r(results.eager.wallMs, results.lazy.wallMs) >= TARGETS.eagerOverLazy)})`,
      `   lazy/eager disk writes ${(100 * r(results.lazy.diskWriteBytes, results.eager.diskWriteBytes)).toFixed(0)}% (target ≤ 50%: ${check(r(results.lazy.diskWriteBytes, results.eager.diskWriteBytes) <= TARGETS.lazyWritesOverEager)})`,
      `   lazy/local wall ${r(results.lazy.wallMs, results.local.wallMs).toFixed(2)}× (target ≤ ${TARGETS.lazyOverLocal}×: ${check(r(results.lazy.wallMs, results.local.wallMs) <= TARGETS.lazyOverLocal)})`,
      `   lazy fetched ${(100 * r(results.lazy.fetchedBytes, imageBytes)).toFixed(1)}% of the image (target ≤ 25%: ${check(r(results.lazy.fetchedBytes, imageBytes) <= TARGETS.lazyFetchShare)})`,
      `b) toolkit + workspace (${mib(toolkitRef.size + wsLayer.size)} as layers) for ${o.n} sandboxes`,
      `   delivery  wall      disk written`,
      `   tar.gz    ${sec(tar.wallMs).padStart(8)}  ${mib(tar.diskWriteBytes).padStart(11)}`,
      `   layers    ${sec(layers.wallMs).padStart(8)}  ${mib(layers.diskWriteBytes).padStart(11)}`,
      `   tar/layers wall ${r(tar.wallMs, layers.wallMs).toFixed(2)}× (target ≥ ${TARGETS.tarOverLayers}×: ${check(r(tar.wallMs, layers.wallMs) >= TARGETS.tarOverLayers)}), disk writes ${r(tar.diskWriteBytes, layers.diskWriteBytes).toFixed(1)}× (target ≥ ${TARGETS.tarWritesOverLayers}×: ${check(r(tar.diskWriteBytes, layers.diskWriteBytes) >= TARGETS.tarWritesOverLayers)})`,
    ];
    process.stdout.write(`${lines.join('\n')}\n`);
    if (o.json) {
      const pick = (m: ModeResult) => ({ wallMs: Math.round(m.wallMs), fetchedBytes: m.fetchedBytes, diskWriteBytes: m.diskWriteBytes });
      process.stdout.write(
        `${JSON.stringify({ n: o.n, lazy: pick(results.lazy), eager: pick(results.eager), local: pick(results.local), imageBytes, tar: { wallMs: Math.round(tar.wallMs), diskWriteBytes: tar.diskWriteBytes }, layers: { wallMs: Math.round(layers.wallMs), diskWriteBytes: layers.diskWriteBytes } })}\n`,
      );
    }
  } finally {
    await store.removeManifest(WS_NAME);
    await rm(root, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench: ${(err as Error).stack ?? err}\n`);
  process.exit(1);
});
