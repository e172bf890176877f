/**
 * The image benchmark: the paper's two image experiments on this machine, with the layer store
 * behind a shaped network link.
 *
 *   npm run bench:images [-- --n 64] [-- --link 1gbit|10gbit|none] [-- --json]
 *                        [-- --modes lazy,eager,local] [-- --no-tar] [-- --image python|busybox]
 *                        [-- --chunk BYTES] [-- --readahead KIB] [-- --tasks K [-- --task-mib M]]
 *
 * The link (link.ts): the store runs in a network namespace of its own, reached over a veth pair
 * shaped with tbf on the store's side; the node, its NATS and this benchmark's client run in the
 * other namespace of the pair. `--link none` serves the store on loopback instead (no namespaces).
 * Namespaces are removed at the end, on SIGINT/SIGTERM, and (left by a run killed outright) at the
 * start of the next run.
 *
 * a) lazy vs eager vs local: N sandboxes of the `python` image (bookworm + python3 + pytest + git,
 *    built once into $PADDOCK_IMAGES_DIR) with a small pytest workspace on top, all created at
 *    once, each running a recorded tool-call sequence (python3 imports, pytest, git status).
 *    lazy: a node with an empty layer cache loading layers on first read from the store;
 *    eager: a node with an empty cache downloading whole layers before mounting;
 *    local: a node whose cache already holds every layer (what eager left behind).
 *    Page caches are dropped before each mode, so each starts cold from disk.
 * b) layers vs tar.gz: the same toolkit + workspace for N sandboxes, either as EROFS layers
 *    fetched over the link once and mounted once, shared (an overlay per sandbox), or as a tar.gz
 *    fetched over the link and extracted per sandbox (an overlay over it); each sandbox (a chroot
 *    in its overlay) runs the same sequence. The base layer is local for both.
 *
 * `--tasks K` gives the sandboxes K distinct task environments instead of one shared image: sandbox
 * i runs on python plus environment i mod K, a layer of its own (TASK_MODULES modules of
 * incompressible bytes, `--task-mib` in all, 128 by default, as a task's installed dependencies would be), and
 * its tool calls import TASK_IMPORTS of them. That is the paper's setting: its nodes pulled
 * thousands of distinct task images (eagerly, 1,600 GB written per node), where one image shared by
 * every sandbox is pulled once per node and costs the link almost nothing.
 *
 * `--chunk` re-indexes the image's layers at another chunk size into a store of hard links beside
 * the real one (the index is per blob, so one store holds one chunk size per layer), to measure the
 * lazy loader's trade-off between fetching more than is read and making more requests.
 *
 * Bytes over the link are the client end's receive counter (for `--link none`, the store's bytes
 * served). Disk writes are the kernel's per-process write accounting (/proc/<pid>/io write_bytes,
 * reaped children included) of the node and its layer daemon, or of this process for part b: the
 * host's own disk counters also count the other work on a shared machine, and are shown beside.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomFillSync } from 'node:crypto';
import { link as hardLink, mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { loadConfig } from '../../runtime/config.ts';
import { ensurePythonImage } from '../../runtime/images/build.ts';
import { ensureBusyboxImage } from '../../runtime/images/busybox.ts';
import type { LayerReadStats } from '../../runtime/images/cache.ts';
import { DEFAULT_CHUNK } from '../../runtime/images/chunks.ts';
import { MS_RDONLY, sysMount } from '../../runtime/images/fuse.ts';
import { httpDownload } from '../../runtime/images/http.ts';
import { type ImageManifest, ImageStore } from '../../runtime/images/store.ts';
import { run } from '../../runtime/proc.ts';
import { Paddock } from '../../sdk/index.ts';
import { type LocalCluster, startLocalCluster } from '../local.ts';
import { cleanUp, cleanUpOnSignals, numberArg, onCleanup, progress, runMain, UsageError } from './harness.ts';
import { clientRxBytes, createLink, type LinkRate, parseLinkRate, removeStaleLinks, servedBytes } from './link.ts';
import { percentile } from './stats.ts';

const USAGE = 'usage: images.ts [--n N] [--link 1gbit|10gbit|none] [--modes lazy,eager,local] [--no-tar] [--image python|busybox] [--chunk BYTES] [--readahead KIB] [--tasks K [--task-mib M]] [--json]';
/** A task environment (--tasks): modules of incompressible bytes, of which a task's calls import a few. */
const TASK_MODULES = 64;
const TASK_IMPORTS = 6;
const TASK_STEP = ['python3', '-c', `import sys; sys.path.insert(0, '/opt/env'); ${Array.from({ length: TASK_IMPORTS }, (_, j) => `import m${j * Math.floor(TASK_MODULES / TASK_IMPORTS)}`).join('; ')}; print('ok')`];

type Mode = 'lazy' | 'eager' | 'local';
const MODES: readonly Mode[] = ['lazy', 'eager', 'local'];

/** The recorded tool calls of one agent turn sequence. */
const SEQUENCES: Record<'python' | 'busybox', string[][]> = {
  python: [
    ['python3', '-c', 'import json, os, re, subprocess, unittest, email, http.client, sqlite3, decimal; print("ok")'],
    ['python3', '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '/work'],
    ['git', '-C', '/work', 'status', '--short'],
  ],
  // For the test at small size: the same shape of work with what busybox has.
  busybox: [
    ['sh', '-c', 'ls -lR /bin /etc >/dev/null && cat /work/calc.py >/dev/null && echo ok'],
    ['sh', '-c', 'grep -r def /work | wc -l'],
  ],
};
const TARGETS = { eagerOverLazy: 1.7, lazyWritesOverEager: 0.5, lazyOverLocal: 1.2, tarOverLayers: 1.76, tarWritesOverLayers: 5, lazyFetchShare: 0.25 };
const TAR_NAME = 'toolkit-workspace.tar.gz';

interface Options {
  n: number;
  json: boolean;
  link: LinkRate;
  modes: Mode[];
  tar: boolean;
  image: 'python' | 'busybox';
  /** Chunk size of the lazy loader's index for the image's layers (bytes). */
  chunk: number;
  /** The kernel's read-ahead on lazily loaded layers, KiB; undefined: its default. */
  readaheadKiB?: number;
  /** Distinct task environments (undefined: every sandbox runs the one image). */
  tasks?: number;
  /** Bytes of one task environment, MiB. */
  taskMiB: number;
}

interface ModeResult {
  wallMs: number;
  linkBytes: number;
  diskWriteBytes: number;
  hostDiskWriteBytes: number;
  fetchedBytes: number;
  /** Distinct bytes of the layers the kernel asked the lazy loader for (0 when nothing was lazy). */
  readBytes: number;
  firstExecP50Ms: number;
  firstExecP95Ms: number;
  failures: number;
}

interface DeliveryResult {
  wallMs: number;
  linkBytes: number;
  diskWriteBytes: number;
  hostDiskWriteBytes: number;
  fetchedBytes: number;
}

function parseArgs(argv: string[]): Options {
  const o: Options = { n: 64, json: false, link: '1gbit', modes: [...MODES], tar: true, image: 'python', chunk: DEFAULT_CHUNK, taskMiB: 128 };
  const value = (i: number, name: string): [string, number] => {
    const a = argv[i] as string;
    if (a === name) {
      const v = argv[i + 1];
      if (v === undefined) throw new UsageError(`${name}: a value is missing\n${USAGE}`);
      return [v, i + 1];
    }
    return [a.slice(name.length + 1), i];
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    const is = (name: string) => a === name || a.startsWith(`${name}=`);
    if (a === '--json') o.json = true;
    else if (a === '--no-tar') o.tar = false;
    else if (is('--n')) {
      ({ value: o.n, next: i } = numberArg(argv, i, '--n', USAGE));
    } else if (is('--link')) {
      const [v, j] = value(i, '--link');
      i = j;
      try {
        o.link = parseLinkRate(v);
      } catch (err) {
        throw new UsageError(`${(err as Error).message}\n${USAGE}`);
      }
    } else if (is('--modes')) {
      const [v, j] = value(i, '--modes');
      i = j;
      const ms = v.split(',').filter(Boolean);
      for (const m of ms) if (!(MODES as readonly string[]).includes(m)) throw new UsageError(`--modes: ${m} is not one of ${MODES.join(', ')}\n${USAGE}`);
      // local reads what eager left in its cache.
      if (ms.includes('local') && !ms.includes('eager')) throw new UsageError(`--modes: local needs eager (it runs on eager's filled cache)\n${USAGE}`);
      o.modes = MODES.filter((m) => ms.includes(m));
    } else if (is('--image')) {
      const [v, j] = value(i, '--image');
      i = j;
      if (v !== 'python' && v !== 'busybox') throw new UsageError(`--image: python or busybox, got ${v}\n${USAGE}`);
      o.image = v;
    } else if (is('--chunk')) {
      const [v, j] = value(i, '--chunk');
      i = j;
      o.chunk = Number(v);
      // The store's own bounds on a layer's chunk (store.ts checkManifest).
      if (!Number.isInteger(o.chunk) || o.chunk < 4096 || o.chunk > 16 * 1024 * 1024 || o.chunk % 4096 !== 0) throw new UsageError(`--chunk: a multiple of 4096 from 4096 to 16 MiB, got ${v}\n${USAGE}`);
    } else if (is('--readahead')) {
      const [v, j] = value(i, '--readahead');
      i = j;
      o.readaheadKiB = Number(v);
      if (!Number.isInteger(o.readaheadKiB) || o.readaheadKiB < 0) throw new UsageError(`--readahead: whole KiB (0: none), got ${v}\n${USAGE}`);
    } else if (is('--tasks')) {
      ({ value: o.tasks, next: i } = numberArg(argv, i, '--tasks', USAGE));
    } else if (is('--task-mib')) {
      const [v, j] = value(i, '--task-mib');
      i = j;
      o.taskMiB = Number(v);
      if (!Number.isInteger(o.taskMiB) || o.taskMiB < 1 || o.taskMiB > 4096) throw new UsageError(`--task-mib: whole MiB from 1 to 4096, got ${v}\n${USAGE}`);
    } else if (a === '-h' || a === '--help') {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    } else throw new UsageError(`unknown argument ${a}\n${USAGE}`);
  }
  if (o.image === 'busybox') o.tar = false;
  if (o.tasks !== undefined && o.image !== 'python') throw new UsageError(`--tasks: task environments are python modules; not with --image ${o.image}\n${USAGE}`);
  return o;
}

// ─── Readings ───────────────────────────────────────────────────────────────────────────────────

/** Sectors written to whole disks (not partitions, not loop or zram devices), in bytes. */
async function hostDiskWrites(): Promise<number> {
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

/** Bytes process `pid` (its threads and reaped children) caused to be written to storage. */
async function writeBytes(pid: number | 'self'): Promise<number> {
  const io = await readFile(`/proc/${pid}/io`, 'utf8').catch(() => '');
  return Number(/^write_bytes: (\d+)$/m.exec(io)?.[1] ?? 0);
}

/** The node's pid and its layer daemon's: where the layer cache's writes are accounted. */
async function nodeWriters(nodePid: number): Promise<number[]> {
  const kids = (await readFile(`/proc/${nodePid}/task/${nodePid}/children`, 'utf8').catch(() => '')).split(' ').filter(Boolean).map(Number);
  const out = [nodePid];
  for (const k of kids) {
    const cmd = await readFile(`/proc/${k}/cmdline`, 'utf8').catch(() => '');
    if (cmd.includes('lazyfs-main')) out.push(k);
  }
  return out;
}

async function sumWrites(pids: number[]): Promise<number> {
  let s = 0;
  for (const p of pids) s += await writeBytes(p);
  return s;
}

async function dropCaches(): Promise<void> {
  await run('sync', []);
  await writeFile('/proc/sys/vm/drop_caches', '3').catch(() => progress('cannot drop page caches (not root?): runs start warm'));
}

// ─── The outer process: link, store, and the benchmark inside the client namespace ─────────────

function waitExit(child: ChildProcess): Promise<number> {
  if (child.exitCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((r) => child.once('exit', (c, s) => r(c ?? (s ? 128 : 1))));
}

async function stopChild(child: ChildProcess, graceMs: number): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  child.kill('SIGTERM');
  const t = setTimeout(() => child.kill('SIGKILL'), graceMs);
  await waitExit(child);
  clearTimeout(t);
}

async function outer(o: Options, args: string[]): Promise<number> {
  cleanUpOnSignals();
  const stale = await removeStaleLinks();
  if (stale.length > 0) progress(`removed ${stale.length} network namespace(s) an earlier run left: ${stale.join(' ')}`);
  const imagesDir = loadConfig().imagesDir;
  const store = new ImageStore(imagesDir);
  // Built here, before the benchmark enters a namespace with no way out: debootstrap needs a mirror.
  progress(`${o.image} image in ${imagesDir}${o.image === 'python' ? ' (built once; ~3 min the first time)' : ''}`);
  const img = await (o.image === 'python' ? ensurePythonImage(store) : ensureBusyboxImage(store));
  let servedDir = imagesDir;
  if (img.layers.some((l) => (l.chunk ?? DEFAULT_CHUNK) !== o.chunk)) {
    servedDir = join(imagesDir, 'tmp', `bench-chunk-${process.pid}`);
    onCleanup('chunk store', () => rm(servedDir, { recursive: true, force: true }));
    progress(`re-indexing ${o.image}'s layers at ${o.chunk}-byte chunks in ${servedDir}`);
    const alt = new ImageStore(servedDir);
    await alt.init();
    const layers = [];
    for (const l of img.layers) {
      const tmp = alt.tmpPath('chunk');
      await hardLink(store.blobPath(l.digest), tmp);
      layers.push(await alt.importBlob(tmp, l.digest, o.chunk));
    }
    await alt.putManifest({ ...img, layers });
  }
  const filesDir = await mkdtemp(join(tmpdir(), 'paddock-bench-files-'));
  onCleanup('files', () => rm(filesDir, { recursive: true, force: true }));

  const link = o.link === 'none' ? undefined : await createLink(o.link);
  if (link) {
    onCleanup('link', () => link.close());
    progress(`link: ${o.link} (tbf) on a veth between network namespaces ${link.storeNs} (store, ${link.storeAddr}) and ${link.clientNs} (node, ${link.clientAddr})`);
  }
  const tsx = import.meta.resolve('tsx');
  const storeMain = fileURLToPath(new URL('./store-main.ts', import.meta.url));
  const storeArgv = [process.execPath, '--import', tsx, storeMain, servedDir, filesDir, link ? link.storeAddr : '127.0.0.1'];
  const [scmd, ...sargs] = link ? link.enter('store', storeArgv) : storeArgv;
  const storeProc = spawn(scmd as string, sargs, { stdio: ['pipe', 'pipe', 'inherit'] });
  onCleanup('store', () => stopChild(storeProc, 5000));
  const urls = await new Promise<{ store: string; files: string }>((resolve, reject) => {
    let buf = '';
    storeProc.stdout?.on('data', (d: Buffer) => {
      buf += d.toString();
      const nl = buf.indexOf('\n');
      if (nl >= 0) resolve(JSON.parse(buf.slice(0, nl)) as { store: string; files: string });
    });
    storeProc.once('exit', (c) => reject(new Error(`the bench store exited (${c}) before it listened`)));
  });
  progress(`store: ${urls.store} (tar.gz and counters: ${urls.files})`);

  const innerArgv = ['unshare', '--mount', '--propagation', 'private', process.execPath, ...process.execArgv, process.argv[1] as string, ...args];
  const [icmd, ...iargs] = link ? link.enter('client', innerArgv) : innerArgv;
  const inner = spawn(icmd as string, iargs, {
    stdio: 'inherit',
    env: {
      ...process.env,
      PADDOCK_BENCH_NS: '1',
      PADDOCK_IMAGES_DIR: servedDir,
      PADDOCK_BENCH_STORE: urls.store,
      PADDOCK_BENCH_FILES_URL: urls.files,
      PADDOCK_BENCH_FILES_DIR: filesDir,
      PADDOCK_BENCH_CLIENT_NS: link?.clientNs ?? '',
    },
  });
  // Registered last, so it runs first: the benchmark stops its nodes before the link goes.
  onCleanup('benchmark', () => stopChild(inner, 60_000));
  const code = await waitExit(inner);
  await cleanUp();
  return code;
}

// ─── The inner process: the experiments ─────────────────────────────────────────────────────────

interface Env {
  storeUrl: string;
  filesUrl: string;
  filesDir: string;
  /** Bytes over the link (or served, without one) so far. */
  linkBytes: () => Promise<number>;
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

/**
 * Task environment `t`: TASK_MODULES modules in /opt/env, each reading its own data file (a
 * TASK_MODULES-th of `bytes`) when imported (as a library's native code is), the bytes drawn at random so that
 * no two tasks share a chunk and nothing compresses.
 */
async function taskLayer(store: ImageStore, root: string, t: number, bytes: number): Promise<ImageManifest['layers'][number]> {
  const dir = join(root, `task-${t}`);
  const env = join(dir, 'opt', 'env');
  await mkdir(env, { recursive: true });
  try {
    const data = Buffer.allocUnsafe(Math.ceil(bytes / TASK_MODULES));
    for (let j = 0; j < TASK_MODULES; j++) {
      await writeFile(join(env, `m${j}.py`), `# task ${t}\nwith open(__file__[:-3] + '.bin', 'rb') as f:\n    DATA = f.read()\n`);
      await writeFile(join(env, `m${j}.bin`), randomFillSync(data));
    }
    return await store.buildLayer(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

let current: LocalCluster | undefined;

async function modeRun(o: { mode: 'lazy' | 'eager'; cacheDir: string; n: number; home: string; image: Options['image']; ws: string[]; sequence: string[][]; env: Env; readaheadKiB?: number; imageBytes: number }): Promise<ModeResult> {
  const cluster = await startLocalCluster({
    home: o.home,
    nodes: 1,
    prefix: `bimg${process.pid}${o.mode}${Math.random().toString(36).slice(2, 5)}n`,
    env: {
      PADDOCK_STORE_URL: o.env.storeUrl,
      PADDOCK_LAYER_MODE: o.mode,
      PADDOCK_LAYER_CACHE_DIR: o.cacheDir,
      PADDOCK_MAX_SANDBOXES: '4096',
      PADDOCK_HEARTBEAT_MS: '1000',
      // Every sandbox asks for a core: room for N of them on this node's two.
      PADDOCK_CPU_OVERCOMMIT: String(Math.max(16, Math.ceil(o.n / 2) + 1)),
      PADDOCK_STORE_TIMEOUT_MS: '30000',
      // Every task's layers at once (eager holds them all); the node's default budget is 10 GiB.
      PADDOCK_LAYER_CACHE_BYTES: String(Math.max(10 * 1024 ** 3, Math.ceil(o.imageBytes * 1.1))),
      ...(o.readaheadKiB === undefined ? {} : { PADDOCK_LAYER_READAHEAD_KB: String(o.readaheadKiB) }),
    },
  });
  current = cluster;
  const pdk = await Paddock.connect({ servers: cluster.url, timeoutMs: 600_000 });
  try {
    const node = cluster.nodes[0];
    if (!node?.proc.pid) throw new Error('the node has no pid');
    const writers = await nodeWriters(node.proc.pid);
    await dropCaches();
    const h0 = await hostDiskWrites();
    const w0 = await sumWrites(writers);
    const l0 = await o.env.linkBytes();
    const t0 = performance.now();
    let failures = 0;
    const firstExec: number[] = [];
    const sbs = await Promise.all(
      Array.from({ length: o.n }, async (_, i) => {
        const sb = await pdk.sandboxes.create({ image: o.image, workspace: o.ws[i % o.ws.length] as string, memoryMiB: 512 });
        for (const [k, cmd] of o.sequence.entries()) {
          // Generous: on a shared 2-core host 64 pytest runs at once took over 300 s each.
          const r = await sb.exec(cmd, { timeoutMs: 1_800_000 });
          if (k === 0) firstExec.push(performance.now() - t0);
          if (r.exitCode !== 0) {
            failures++;
            progress(`${cmd.join(' ').slice(0, 40)}: exit ${r.exitCode}: ${Buffer.from(r.stderr).toString().slice(0, 300)}`);
          }
        }
        return sb;
      }),
    );
    const wallMs = performance.now() - t0;
    const w1 = await sumWrites(writers);
    const l1 = await o.env.linkBytes();
    const h1 = await hostDiskWrites();
    const info = await pdk.nodes.info(node.id);
    const layers = info.layers as (typeof info.layers & Partial<LayerReadStats>) | undefined;
    await Promise.all(sbs.map((s) => s.kill()));
    return {
      wallMs,
      linkBytes: l1 - l0,
      diskWriteBytes: w1 - w0,
      hostDiskWriteBytes: h1 - h0,
      fetchedBytes: layers?.fetchedBytes ?? 0,
      readBytes: layers?.readBytes ?? 0,
      firstExecP50Ms: percentile(firstExec, 50),
      firstExecP95Ms: percentile(firstExec, 95),
      failures,
    };
  } finally {
    await pdk.close();
    await cluster.stop();
    current = undefined;
  }
}

/** GET `url` into `tar -xz` in `dir`: the archive is never written down. */
function fetchAndUnpack(url: string, dir: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const tar = spawn('tar', ['-xzf', '-', '-C', dir], { stdio: ['pipe', 'ignore', 'pipe'] });
    let err = '';
    tar.stderr.on('data', (d: Buffer) => {
      err += d.toString();
    });
    let n = 0;
    const req = request(url, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        tar.kill();
        reject(new Error(`GET ${url}: HTTP ${res.statusCode}`));
        return;
      }
      res.on('data', (c: Buffer) => {
        n += c.length;
      });
      res.pipe(tar.stdin);
    });
    req.on('error', reject);
    req.end();
    tar.on('close', (code) => (code === 0 ? resolve(n) : reject(new Error(`tar -xz: exit ${code}: ${err.trim()}`))));
  });
}

/** b) one run of N chroot "sandboxes" over either shared layers or per-sandbox tar.gz extractions. */
async function deliveryRun(o: { kind: 'layers' | 'tar'; n: number; root: string; base: string; layers: string[]; env: Env; sequence: string[][] }): Promise<DeliveryResult> {
  const dir = join(o.root, o.kind);
  await mkdir(join(dir, 'fetched'), { recursive: true });
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
  let fetched = 0;
  try {
    await dropCaches();
    const h0 = await hostDiskWrites();
    const w0 = await writeBytes('self');
    const l0 = await o.env.linkBytes();
    const t0 = performance.now();
    const baseDir = await mnt(o.base);
    // Layers: fetched over the link once for the node, mounted once, shared by every sandbox.
    const shared =
      o.kind === 'layers'
        ? await Promise.all(
            o.layers.map(async (hex) => {
              const file = join(dir, 'fetched', `${hex}.erofs`);
              const got = await httpDownload(`${o.env.storeUrl}/blobs/sha256/${hex}.erofs`, file, { idleMs: 30_000 });
              fetched += got;
              return mnt(file);
            }),
          )
        : [];
    let next = 0;
    const worker = async () => {
      for (let i = next++; i < o.n; i = next++) {
        const sb = join(dir, `sb${i}`);
        for (const d of ['upper', 'work', 'root', 'unpacked']) await mkdir(join(sb, d), { recursive: true });
        let lowers: string[];
        if (o.kind === 'tar') {
          const got = await fetchAndUnpack(`${o.env.filesUrl}/${TAR_NAME}`, join(sb, 'unpacked'));
          fetched += got;
          lowers = [join(sb, 'unpacked'), baseDir];
        } else lowers = [...shared].reverse().concat(baseDir);
        await run('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lowers.join(':')},upperdir=${join(sb, 'upper')},workdir=${join(sb, 'work')}`, join(sb, 'root')]);
        roots.push(join(sb, 'root'));
        for (const cmd of o.sequence) await run('chroot', [join(sb, 'root'), 'env', 'PATH=/usr/bin:/bin', 'HOME=/root', 'PYTHONDONTWRITEBYTECODE=1', ...cmd], { timeoutMs: 1_800_000 });
      }
    };
    await Promise.all(Array.from({ length: 4 }, worker));
    const wallMs = performance.now() - t0;
    const w1 = await writeBytes('self');
    const l1 = await o.env.linkBytes();
    const h1 = await hostDiskWrites();
    return { wallMs, linkBytes: l1 - l0, diskWriteBytes: w1 - w0, hostDiskWriteBytes: h1 - h0, fetchedBytes: fetched };
  } finally {
    for (const r of roots) await run('umount', ['-l', r], { allowFail: true });
    for (const m of mounted.reverse()) await run('umount', ['-l', m], { allowFail: true });
    await rm(dir, { recursive: true, force: true });
  }
}

const mib = (b: number) => `${(b / 1024 / 1024).toFixed(1)} MiB`;
const sec = (ms: number) => `${(ms / 1000).toFixed(2)} s`;
const pct = (x: number) => `${(100 * x).toFixed(1)}%`;

async function inner(o: Options): Promise<void> {
  cleanUpOnSignals();
  onCleanup('cluster', async () => {
    await current?.stop();
  });
  const clientNs = process.env.PADDOCK_BENCH_CLIENT_NS ?? '';
  const filesUrl = process.env.PADDOCK_BENCH_FILES_URL ?? '';
  const env: Env = {
    storeUrl: process.env.PADDOCK_BENCH_STORE ?? '',
    filesUrl,
    filesDir: process.env.PADDOCK_BENCH_FILES_DIR ?? '',
    linkBytes: clientNs ? () => clientRxBytes(clientNs) : () => servedBytes(`${filesUrl}/stats`),
  };
  const imagesDir = loadConfig().imagesDir;
  const store = new ImageStore(imagesDir);
  const img = await store.get(o.image);
  if (!img) throw new Error(`no ${o.image} image in ${imagesDir}`);
  const root = await mkdtemp(join(tmpdir(), 'paddock-bench-images-'));
  onCleanup('scratch', () => rm(root, { recursive: true, force: true }));
  const wsName = `bench-ws-${process.pid}`;
  onCleanup('workspace image', () => store.removeManifest(wsName));
  const ws = await workspaceDir(root);
  const wsLayer = await store.buildLayer(ws);
  await store.putManifest({ ...img, name: wsName, layers: [wsLayer], env: [], cwd: '/work' });
  // Every distinct byte the sandboxes' images hold: what eager pulls, what lazy's share is of.
  let imageBytes = img.layers.reduce((s, l) => s + l.size, 0) + wsLayer.size;
  let workspaces = [wsName];
  const sequence = o.tasks === undefined ? SEQUENCES[o.image] : [...SEQUENCES[o.image], TASK_STEP];
  if (o.tasks !== undefined) {
    progress(`${o.tasks} task environments of ${o.taskMiB} MiB`);
    workspaces = [];
    for (let t = 0; t < o.tasks; t++) {
      const layer = await taskLayer(store, root, t, o.taskMiB * 1024 * 1024);
      onCleanup(`task ${t}`, () => store.removeBlob(layer.digest));
      const name = `${wsName}-t${t}`;
      onCleanup(`task image ${t}`, () => store.removeManifest(name));
      await store.putManifest({ ...img, name, layers: [layer, wsLayer], env: [], cwd: '/work' });
      workspaces.push(name);
      imageBytes += layer.size;
    }
  }

  const results: Partial<Record<Mode, ModeResult>> = {};
  const lazyCache = join(root, 'cache-lazy');
  const eagerCache = join(root, 'cache-eager');
  for (const mode of o.modes) {
    progress(`a) ${mode}: ${o.n} sandboxes, ${mode === 'local' ? 'every layer already in the cache' : 'empty cache'}`);
    results[mode] = await modeRun({ mode: mode === 'eager' ? 'eager' : 'lazy', cacheDir: mode === 'lazy' ? lazyCache : eagerCache, n: o.n, home: join(root, `home-${mode}`), image: o.image, ws: workspaces, sequence, env, readaheadKiB: o.readaheadKiB, imageBytes });
  }

  let tar: DeliveryResult | undefined;
  let layers: DeliveryResult | undefined;
  const [baseRef, toolkitRef] = img.layers as [ImageManifest['layers'][number], ImageManifest['layers'][number] | undefined];
  if (o.tar && toolkitRef) {
    progress('b) packing toolkit + workspace as a tar.gz');
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
    await run('tar', ['-czf', join(env.filesDir, TAR_NAME), '-C', unpack, '.'], { timeoutMs: 600_000 });
    await rm(unpack, { recursive: true, force: true });
    const hex = (d: string) => d.replace(/^sha256:/, '');
    const common = { n: o.n, root, base: store.blobPath(baseRef.digest), layers: [hex(toolkitRef.digest), hex(wsLayer.digest)], env, sequence: SEQUENCES[o.image] };
    progress(`b) tar.gz: ${o.n} sandboxes, each fetching and extracting it`);
    tar = await deliveryRun({ ...common, kind: 'tar' });
    progress(`b) layers: ${o.n} sandboxes over EROFS layers fetched once and shared`);
    layers = await deliveryRun({ ...common, kind: 'layers' });
  }
  const tarBytes = tar ? (await stat(join(env.filesDir, TAR_NAME))).size : 0;

  report(o, { results, tar, layers, imageBytes, sequence, layerCount: img.layers.length + (o.tasks === undefined ? 1 : 2), toolkitBytes: (toolkitRef?.size ?? 0) + wsLayer.size, tarBytes });
  await cleanUp();
}

function report(o: Options, r: { results: Partial<Record<Mode, ModeResult>>; tar?: DeliveryResult; layers?: DeliveryResult; imageBytes: number; sequence: string[][]; layerCount: number; toolkitBytes: number; tarBytes: number }): void {
  const ratio = (a: number, b: number) => (b > 0 ? a / b : Number.POSITIVE_INFINITY);
  const check = (ok: boolean) => (ok ? 'meets' : 'MISSES');
  const { lazy, eager, local } = r.results;
  const lines = [
    `link: ${o.link === 'none' ? 'none (store on loopback)' : `${o.link}, tbf on a veth between two network namespaces`}; lazy chunks of ${o.chunk / 1024} KiB, kernel read-ahead ${o.readaheadKiB === undefined ? 'its default' : `${o.readaheadKiB} KiB`}`,
    o.tasks === undefined
      ? `a) ${o.n} sandboxes of ${o.image} (${mib(r.imageBytes)} in ${r.layerCount} layers), tool calls: ${r.sequence.map((c) => c.slice(0, 2).join(' ')).join('; ')}`
      : `a) ${o.n} sandboxes of ${o.image} + one of ${o.tasks} task environments of ${o.taskMiB} MiB (${mib(r.imageBytes)} of distinct images, ${r.layerCount} layers each), tool calls: ${r.sequence.map((c) => c.slice(0, 2).join(' ')).join('; ')} (${TASK_IMPORTS} of ${TASK_MODULES} modules)`,
    '   mode    wall      over the link   fetched      read      disk written   first exec p50 / p95   failures',
    ...MODES.filter((m) => r.results[m]).map((m) => {
      const x = r.results[m] as ModeResult;
      return `   ${m.padEnd(6)}  ${sec(x.wallMs).padStart(8)}  ${mib(x.linkBytes).padStart(12)}  ${mib(x.fetchedBytes).padStart(11)}  ${mib(x.readBytes).padStart(10)}  ${mib(x.diskWriteBytes).padStart(11)} (host ${mib(x.hostDiskWriteBytes)})  ${sec(x.firstExecP50Ms)} / ${sec(x.firstExecP95Ms)}   ${x.failures}`;
    }),
  ];
  if (lazy && eager) {
    lines.push(
      `   eager/lazy wall ${ratio(eager.wallMs, lazy.wallMs).toFixed(2)}× (target ≥ ${TARGETS.eagerOverLazy}×: ${check(ratio(eager.wallMs, lazy.wallMs) >= TARGETS.eagerOverLazy)})`,
      `   lazy/eager disk writes ${pct(ratio(lazy.diskWriteBytes, eager.diskWriteBytes))} (target ≤ 50%: ${check(ratio(lazy.diskWriteBytes, eager.diskWriteBytes) <= TARGETS.lazyWritesOverEager)})`,
    );
  }
  if (lazy && local) lines.push(`   lazy/local wall ${ratio(lazy.wallMs, local.wallMs).toFixed(2)}× (target ≤ ${TARGETS.lazyOverLocal}×: ${check(ratio(lazy.wallMs, local.wallMs) <= TARGETS.lazyOverLocal)})`);
  if (lazy) {
    lines.push(
      `   lazy fetched ${pct(ratio(lazy.fetchedBytes, r.imageBytes))} of the ${o.tasks === undefined ? 'image' : 'images'} (target ≤ 25%: ${check(ratio(lazy.fetchedBytes, r.imageBytes) <= TARGETS.lazyFetchShare)}); the kernel read ${pct(ratio(lazy.readBytes, r.imageBytes))} of it (fetched/read ${ratio(lazy.fetchedBytes, lazy.readBytes).toFixed(2)}×)`,
    );
  }
  const { tar, layers } = r;
  if (tar && layers) {
    lines.push(
      `b) toolkit + workspace for ${o.n} sandboxes: ${mib(r.toolkitBytes)} as layers, ${mib(r.tarBytes)} as tar.gz`,
      '   delivery  wall      over the link   disk written',
      `   tar.gz    ${sec(tar.wallMs).padStart(8)}  ${mib(tar.linkBytes).padStart(12)}  ${mib(tar.diskWriteBytes).padStart(11)} (host ${mib(tar.hostDiskWriteBytes)})`,
      `   layers    ${sec(layers.wallMs).padStart(8)}  ${mib(layers.linkBytes).padStart(12)}  ${mib(layers.diskWriteBytes).padStart(11)} (host ${mib(layers.hostDiskWriteBytes)})`,
      `   tar/layers wall ${ratio(tar.wallMs, layers.wallMs).toFixed(2)}× (target ≥ ${TARGETS.tarOverLayers}×: ${check(ratio(tar.wallMs, layers.wallMs) >= TARGETS.tarOverLayers)}), disk writes ${ratio(tar.diskWriteBytes, layers.diskWriteBytes).toFixed(1)}× (target ≥ ${TARGETS.tarWritesOverLayers}×: ${check(ratio(tar.diskWriteBytes, layers.diskWriteBytes) >= TARGETS.tarWritesOverLayers)})`,
    );
  }
  process.stdout.write(`${lines.join('\n')}\n`);
  if (o.json) {
    const round = (m: ModeResult | DeliveryResult) => Object.fromEntries(Object.entries(m).map(([k, v]) => [k, Math.round(v as number)]));
    const out: Record<string, unknown> = { link: o.link, n: o.n, image: o.image, tasks: o.tasks ?? null, taskMiB: o.tasks === undefined ? null : o.taskMiB, chunk: o.chunk, readaheadKiB: o.readaheadKiB ?? null, imageBytes: r.imageBytes };
    for (const m of MODES) if (r.results[m]) out[m] = round(r.results[m] as ModeResult);
    if (tar && layers) {
      out.tar = round(tar);
      out.layers = round(layers);
    }
    process.stdout.write(`${JSON.stringify(out)}\n`);
  }
}

runMain(async () => {
  const args = process.argv.slice(2);
  const o = parseArgs(args);
  if (process.env.PADDOCK_BENCH_NS === '1') await inner(o);
  else process.exitCode = await outer(o, args);
});
