/**
 * The layer builder behind `paddock image build`: directories, tarballs, git checkouts and Debian
 * package sets become content-addressed EROFS layers, and a declarative spec stacks them into an
 * image (base → toolkit → workspace). Each part is one layer, so changing the base rebuilds one
 * layer, not every image built on it.
 *
 * A spec (JSON):
 *   { "name": "python",
 *     "base":      { "suite": "bookworm", "variant": "minbase", "packages": [] }   // debootstrap
 *               |  { "image": "bookworm" } | { "dir": "…" } | { "tar": "….tar.gz" },
 *     "toolkit":   { "packages": ["python3", "python3-pytest", "git"] }            // apt-get on the base
 *               |  { "image": "…" } | { "dir": "…" } | { "tar": "…" },
 *     "workspace": { "dir": "…" } | { "tar": "…" } | { "git": { "url": "…", "ref": "main" } } | { "image": "…" },
 *     "env": ["K=V"], "cwd": "/work", "init": ["/bin/sleep", "infinity"], "cmd": ["python3"] }
 *
 * Debian packages come from the host's apt mirror; downloaded .debs are kept in PADDOCK_DEB_CACHE
 * (default /var/cache/paddock/debs), so a rebuild downloads nothing it already has.
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { ProtocolError } from '../../protocol/index.ts';
import { run } from '../proc.ts';
import { withHostLock } from './lock.ts';
import { IMAGE_NAME, type ImageManifest, type ImageStore, type LayerRef } from './store.ts';

/** `dir` with `content`: a digest of what is in it, which the recipe names instead of where it is (another clone, the same image). */
type Source = { image: string } | { dir: string; content?: string } | { tar: string } | { git: { url: string; ref?: string } };
export type BaseSource = Source | { suite: string; variant?: string; mirror?: string; packages?: string[] };
export type ToolkitSource = Source | { packages: string[] };

export interface BuildSpec {
  name: string;
  base: BaseSource;
  toolkit?: ToolkitSource;
  workspace?: Source;
  env?: string[];
  cwd?: string;
  user?: { uid: number; gid: number };
  init?: string[];
  cmd?: string[];
}

/**
 * Bumped whenever the builder itself makes different trees from the same spec (a file it now
 * removes, a step it adds): images built by an older builder are then rebuilt, not reused.
 */
const BUILDER_VERSION = 2;

/** What a built image was made from: its spec and the builder's version, as one digest. */
export function recipeOf(spec: BuildSpec): string {
  const where = (src: Source | undefined) => (src && 'content' in src && src.content ? { content: src.content } : src);
  const named = { ...spec, workspace: where(spec.workspace) };
  return createHash('sha256').update(JSON.stringify({ builder: BUILDER_VERSION, spec: named })).digest('hex');
}

/** The store's image built from `spec` as it is now; null when missing or made from another recipe. */
export async function currentImage(store: { get(name: string): Promise<ImageManifest | null> }, spec: BuildSpec): Promise<ImageManifest | null> {
  const m = await store.get(spec.name).catch(() => null);
  return m && m.recipe === recipeOf(spec) ? m : null;
}

export interface BuildOptions {
  store: ImageStore;
  /** Where progress goes (stderr by default); a TTY gets one updating line. */
  progress?: NodeJS.WritableStream & { isTTY?: boolean };
  debCache?: string;
  /** Also store each part as an image of its own: `<name>-base`, `<name>-toolkit`, `<name>-workspace`. */
  parts?: boolean;
}

export const DEFAULT_ENV = ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOME=/root', 'LANG=C.UTF-8'];

export function debCache(): string {
  return process.env.PADDOCK_DEB_CACHE || '/var/cache/paddock/debs';
}

export function debianMirror(): string {
  if (process.env.PADDOCK_DEBIAN_MIRROR) return process.env.PADDOCK_DEBIAN_MIRROR;
  // The mirror apt already uses on this host (deb822 or one-line sources).
  for (const f of ['/etc/apt/sources.list.d/debian.sources', '/etc/apt/sources.list']) {
    try {
      const text = readFileSync(f, 'utf8');
      const m = /^URIs:\s*(\S+\/debian)\/?\s*$/m.exec(text) ?? /^deb\s+(?:\[[^\]]*\]\s+)?(\S+\/debian)\/?\s+/m.exec(text);
      if (m?.[1]) return m[1];
    } catch {
      // next
    }
  }
  return 'http://deb.debian.org/debian';
}

/** Reads and checks a spec file. Relative paths in it are relative to the file. */
export function parseSpec(text: string, dir = process.cwd()): BuildSpec {
  let s: BuildSpec;
  try {
    s = JSON.parse(text) as BuildSpec;
  } catch (err) {
    throw new ProtocolError('INVALID_SPEC', `build spec: not JSON: ${(err as Error).message}`);
  }
  if (typeof s !== 'object' || s === null) throw new ProtocolError('INVALID_SPEC', 'build spec: not an object');
  if (typeof s.name !== 'string' || !IMAGE_NAME.test(s.name)) throw new ProtocolError('INVALID_SPEC', `build spec: bad name ${JSON.stringify(s.name)}`);
  if (typeof s.base !== 'object' || s.base === null) throw new ProtocolError('INVALID_SPEC', 'build spec: base is required');
  const abs = (src: Record<string, unknown> | undefined) => {
    if (!src) return;
    for (const k of ['dir', 'tar'] as const) if (typeof src[k] === 'string') src[k] = resolve(dir, src[k] as string);
  };
  abs(s.base as Record<string, unknown>);
  abs(s.toolkit as Record<string, unknown> | undefined);
  abs(s.workspace as Record<string, unknown> | undefined);
  return s;
}

/** One progress line: updated in place on a terminal, a line every few seconds elsewhere. */
class Progress {
  private last = 0;
  private readonly started = Date.now();
  constructor(
    private readonly out: (NodeJS.WritableStream & { isTTY?: boolean }) | undefined,
    private readonly name: string,
  ) {}
  show(msg: string, force = false): void {
    if (!this.out) return;
    const line = `[${this.name}] ${msg} (${Math.round((Date.now() - this.started) / 1000)} s)`;
    if (this.out.isTTY) this.out.write(`\r\x1b[K${line.slice(0, 150)}`);
    else if (force || Date.now() - this.last > 5000) {
      this.out.write(`${line}\n`);
      this.last = Date.now();
    }
  }
  done(msg: string): void {
    if (!this.out) return;
    this.out.write(`${this.out.isTTY ? '\r\x1b[K' : ''}[${this.name}] ${msg} (${Math.round((Date.now() - this.started) / 1000)} s)\n`);
  }
}

/** Runs a long command, feeding each output line to `onLine`; rejects with its tail on failure. */
function stream(cmd: string, args: string[], onLine: (line: string) => void, env?: Record<string, string>): Promise<void> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
    let tail = '';
    let buf = '';
    const feed = (d: Buffer) => {
      buf += d.toString();
      tail = (tail + d.toString()).slice(-3000);
      let i = buf.indexOf('\n');
      while (i >= 0) {
        onLine(buf.slice(0, i));
        buf = buf.slice(i + 1);
        i = buf.indexOf('\n');
      }
    };
    child.stdout.on('data', feed);
    child.stderr.on('data', feed);
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolvePromise() : reject(new ProtocolError('BACKEND_FAILED', `${cmd} ${args.slice(0, 3).join(' ')} failed (${code}): ${tail.trim().slice(-1500)}`))));
  });
}

/** Counts what debootstrap and apt-get say they are doing, for the progress line. */
function packageCounter(p: Progress, what: string): (line: string) => void {
  const n = { get: 0, unpack: 0, setup: 0 };
  return (line) => {
    if (/^I: Retrieving (?!Release|Packages|InRelease)|^Get:\d+/.test(line)) n.get++;
    else if (/^I: (Extracting|Unpacking)|^Unpacking /.test(line)) n.unpack++;
    else if (/^I: Configuring|^Setting up /.test(line)) n.setup++;
    else return;
    p.show(`${what}: ${n.get} downloaded, ${n.unpack} unpacked, ${n.setup} configured`);
  };
}

/** Removes what a package install leaves that no sandbox needs and every build would change. */
async function trimDebian(root: string): Promise<void> {
  // resolv.conf too: debootstrap copies the build host's, and a sandbox with no network must not
  // be told of a resolver (an egress policy that opens DNS writes its own).
  await run('sh', ['-c', 'rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/cache/apt/*.bin "$1"/var/lib/apt/lists/* "$1"/var/log/apt/* "$1"/tmp/* "$1"/etc/resolv.conf 2>/dev/null; true', 'sh', root]);
}

export async function debootstrap(target: string, o: { suite: string; variant?: string; mirror?: string; packages?: string[]; cache: string; progress: Progress }): Promise<void> {
  await mkdir(o.cache, { recursive: true });
  const args = [`--variant=${o.variant ?? 'minbase'}`, `--cache-dir=${o.cache}`];
  if (o.packages?.length) args.push(`--include=${o.packages.join(',')}`);
  args.push(o.suite, target, o.mirror ?? debianMirror());
  o.progress.show(`debootstrap ${o.suite}`, true);
  await stream('debootstrap', args, packageCounter(o.progress, `base ${o.suite}`));
  await trimDebian(target);
}

/**
 * Installs Debian packages on top of `baseDir` and leaves only the difference in `upper`: apt-get
 * runs in a chroot of an overlay whose upper directory becomes the toolkit layer (with overlay
 * whiteouts for whatever it removed from the base).
 */
export async function aptLayer(baseDir: string, upper: string, packages: string[], o: { cache: string; progress: Progress }): Promise<void> {
  const work = `${upper}.work`;
  const merged = `${upper}.merged`;
  for (const d of [upper, work, merged, join(o.cache, 'partial')]) await mkdir(d, { recursive: true });
  const script = `set -e
mount -t overlay overlay -o lowerdir="$1",upperdir="$2",workdir="$3" "$4"
mount -t proc proc "$4/proc"
mount --bind /dev "$4/dev"
mount --bind "$5" "$4/var/cache/apt/archives"
cp /etc/resolv.conf "$4/etc/resolv.conf" 2>/dev/null || true
shift 5
chroot "$M" apt-get -o Acquire::Retries=3 update
DEBIAN_FRONTEND=noninteractive chroot "$M" apt-get -o Acquire::Retries=3 install -y --no-install-recommends "$@"
`;
  o.progress.show(`toolkit: apt-get install ${packages.join(' ')}`, true);
  // A private mount namespace: every mount above vanishes with the shell, even if apt-get fails.
  await stream('unshare', ['--mount', '--propagation', 'private', 'sh', '-c', script, 'sh', baseDir, upper, work, merged, o.cache, ...packages], packageCounter(o.progress, 'toolkit'), { M: merged });
  await rm(work, { recursive: true, force: true });
  await rm(merged, { recursive: true, force: true });
  // The host's resolver config and apt's lists are build-time only.
  await run('sh', ['-c', 'rm -f "$1/etc/resolv.conf"; true', 'sh', upper]);
  await trimDebian(upper);
}

async function fromSource(src: Source, o: { store: ImageStore; scratch: string; progress: Progress; what: string }): Promise<{ layers: LayerRef[]; dir?: string; image?: ImageManifest }> {
  if ('image' in src) {
    const m = await o.store.get(src.image);
    if (!m) throw new ProtocolError('INVALID_SPEC', `${o.what}: no image ${src.image} in ${o.store.root}`);
    return { layers: m.layers, image: m };
  }
  let dir: string;
  if ('dir' in src) {
    if (!existsSync(src.dir)) throw new ProtocolError('INVALID_SPEC', `${o.what}: no directory ${src.dir}`);
    dir = src.dir;
  } else if ('tar' in src) {
    if (!existsSync(src.tar)) throw new ProtocolError('INVALID_SPEC', `${o.what}: no file ${src.tar}`);
    dir = join(o.scratch, `${o.what}-tar`);
    await mkdir(dir, { recursive: true });
    o.progress.show(`${o.what}: extracting ${src.tar}`, true);
    await run('tar', ['-xf', src.tar, '-C', dir, '--no-same-owner'], { timeoutMs: 600_000 });
  } else if ('git' in src) {
    dir = join(o.scratch, `${o.what}-git`);
    o.progress.show(`${o.what}: git clone ${src.git.url}`, true);
    await run('git', ['clone', '--quiet', '--depth', '1', ...(src.git.ref ? ['--branch', src.git.ref] : []), src.git.url, dir], { timeoutMs: 600_000 });
  } else {
    throw new ProtocolError('INVALID_SPEC', `${o.what}: expected one of image, dir, tar, git`);
  }
  o.progress.show(`${o.what}: mkfs.erofs`, true);
  return { layers: [await o.store.buildLayer(dir)], dir };
}

/**
 * One user of the deb cache at a time, host-wide: two builds of different stores at once (two test
 * files, or a node's first-start build beside a CLI build) both downloading into one cache made
 * apt and debootstrap fail on each other's partial files.
 */
function withCacheLock<T>(cache: string, fn: () => Promise<T>): Promise<T> {
  return withHostLock(join(cache, '.paddock-build.lock'), fn);
}

/** Builds an image from a spec: one layer per part; returns the stored manifest. */
export async function buildImage(spec: BuildSpec, o: BuildOptions): Promise<ImageManifest> {
  const progress = new Progress(o.progress ?? process.stderr, spec.name);
  await o.store.init();
  const scratch = await mkdtemp(join(o.store.root, 'tmp', `build-${spec.name.replace(/[^a-z0-9]/g, '_')}-`));
  const cache = o.debCache ?? debCache();
  try {
    let baseDir: string | undefined;
    let baseLayers: LayerRef[];
    let baseImage: ImageManifest | undefined;
    if ('suite' in spec.base) {
      baseDir = join(scratch, 'base');
      const base = spec.base;
      const dir = baseDir;
      await withCacheLock(cache, () => debootstrap(dir, { ...base, cache, progress }));
      progress.show('base: mkfs.erofs', true);
      baseLayers = [await o.store.buildLayer(baseDir)];
    } else {
      const b = await fromSource(spec.base, { store: o.store, scratch, progress, what: 'base' });
      baseLayers = b.layers;
      baseDir = b.dir;
      baseImage = b.image;
    }
    let toolkitLayers: LayerRef[] = [];
    if (spec.toolkit) {
      if ('packages' in spec.toolkit) {
        if (!baseDir) throw new ProtocolError('INVALID_SPEC', 'toolkit: packages need a base built here (suite) or given as a directory');
        const upper = join(scratch, 'toolkit');
        const { packages } = spec.toolkit;
        const dir = baseDir;
        await withCacheLock(cache, () => aptLayer(dir, upper, packages, { cache, progress }));
        progress.show('toolkit: mkfs.erofs', true);
        toolkitLayers = [await o.store.buildLayer(upper)];
      } else toolkitLayers = (await fromSource(spec.toolkit, { store: o.store, scratch, progress, what: 'toolkit' })).layers;
    }
    const workspaceLayers = spec.workspace ? (await fromSource(spec.workspace, { store: o.store, scratch, progress, what: 'workspace' })).layers : [];
    const defaults = {
      env: spec.env ?? baseImage?.env ?? DEFAULT_ENV,
      cwd: spec.cwd ?? baseImage?.cwd ?? '/',
      user: spec.user ?? baseImage?.user ?? { uid: 0, gid: 0 },
      init: spec.init ?? baseImage?.init ?? ['/bin/sleep', 'infinity'],
    };
    if (o.parts) {
      await o.store.putManifest({ name: `${spec.name}-base`, layers: baseLayers, ...defaults, cwd: baseImage?.cwd ?? '/' });
      if (toolkitLayers.length) await o.store.putManifest({ name: `${spec.name}-toolkit`, layers: toolkitLayers, ...defaults, env: spec.env ?? [], cwd: '/' });
      if (workspaceLayers.length) await o.store.putManifest({ name: `${spec.name}-workspace`, layers: workspaceLayers, ...defaults, env: [], cwd: spec.cwd ?? '/' });
    }
    const manifest: ImageManifest = { name: spec.name, layers: [...baseLayers, ...toolkitLayers, ...workspaceLayers], ...defaults, recipe: recipeOf(spec) };
    if (spec.cmd) manifest.cmd = spec.cmd;
    const stored = await o.store.putManifest(manifest);
    const bytes = stored.layers.reduce((s, l) => s + l.size, 0);
    progress.done(`built: ${stored.layers.length} layer(s), ${(bytes / 1024 / 1024).toFixed(1)} MiB`);
    return stored;
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}

/** The realistic image of the benchmarks: Debian bookworm minbase + python3 + pytest + git. */
export const PYTHON_SPEC: BuildSpec = {
  name: 'python',
  base: { suite: 'bookworm', variant: 'minbase' },
  // Not python3-pip/python3-venv yet: in this chroot build dpkg left python3-pip-whl and
  // python3.11-venv unconfigured (seen on a fresh machine); they wait until that is understood.
  toolkit: { packages: ['python3', 'python3-pytest', 'git'] },
  env: [...DEFAULT_ENV, 'PYTHONDONTWRITEBYTECODE=1'],
  cwd: '/',
  init: ['/bin/sleep', 'infinity'],
  cmd: ['python3'],
};

/**
 * The `python` image, built once per image store (about a minute and ~60 MB of downloads the first
 * time; the .debs stay in the deb cache). Its parts are stored too: `python-base` (bookworm
 * minbase) and `python-toolkit` (python3, pytest, git), for composing. An image built
 * from an older recipe is rebuilt.
 */
export async function ensurePythonImage(store: ImageStore, o: Omit<BuildOptions, 'store'> = {}): Promise<ImageManifest> {
  const have = await currentImage(store, PYTHON_SPEC);
  if (have) return have;
  // Two builders at once would both download: the second waits for the first's image.
  await store.init();
  return withHostLock(
    join(store.root, 'tmp', 'python.lock'),
    () => buildImage(PYTHON_SPEC, { ...o, store, parts: true }),
    () => currentImage(store, PYTHON_SPEC),
  );
}
