/**
 * `paddock image …`: build layers and images, move them between stores, list and collect them,
 * serve a store, and read a node's layer cache counters. Without --store, the store is the running
 * Paddock's (named in its node records), so `image ls` lists what the nodes can use; with no
 * Paddock running, the local one.
 */

import { existsSync, readFileSync, statSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { ErrorCodes, type NodeLayerStats, type NodeRecord, ProtocolError } from '../../protocol/index.ts';
import { loadConfig } from '../../runtime/config.ts';
import { ensureDesktopImage } from '../../runtime/fullvm/image.ts';
import { type BuildSpec, buildImage, DEFAULT_ENV, ensurePythonImage, parseSpec } from '../../runtime/images/build.ts';
import type { LayerStore } from '../../runtime/images/layer-store.ts';
import { copyImage, LocalLayerStore, openStore } from '../../runtime/images/remote.ts';
import { StoreServer } from '../../runtime/images/server.ts';
import { type ImageManifest, ImageStore } from '../../runtime/images/store.ts';
import { parseFlags } from './args.ts';
import { connect, type GlobalFlags, human, out, UsageError } from './common.ts';

export const IMAGE_USAGE = `Usage: paddock image <command>

  build <dir|file.tar[.gz]> --name NAME [--cwd DIR] [--env K=V]...
                           one directory or tarball → one EROFS layer → image NAME
  build <spec.json> [--parts]
                           a declarative image: base (debootstrap suite + packages, image, dir,
                           tar), toolkit (packages, dir, tar, image), workspace (dir, tar, git,
                           image); --parts also stores NAME-base, NAME-toolkit, NAME-workspace
  build --python           the bookworm + python3 + pytest + git image (cached; parts stored too)
  build --desktop          the full VMs' desktop: Xorg, IceWM, xterm, Dillo, Mousepad, PCManFM, xdotool
  push <name> --to STORE   copy an image (and the layers STORE lacks) from the local store
  pull <name> --from STORE copy an image into the local store; layers are checked against their digests
  ls [--store STORE] [--json]          images of a store
  rm <name> [--store STORE]            forget an image (its layers stay until gc)
  gc [--store STORE] [--grace-ms MS] [--force] [--json]
                           remove layers no image names, no running sandbox reads, and older than
                           the grace (default 1 h); a node that does not say what its sandboxes
                           read makes gc refuse, unless --force
  serve [--listen HOST:PORT] [--dir DIR]
                           serve a directory as a layer store over HTTP until Ctrl-C
  stats [NODE] [--json]    a node's layer cache: bytes fetched per layer, hits, misses, evictions

STORE is a directory, http://host:port (a Paddock store), or rclone:<remote>:<path> (S3, GCS,
WebDAV… through rclone). The local store is $PADDOCK_IMAGES_DIR (default $PADDOCK_HOME/images);
--store defaults to $PADDOCK_STORE_URL, else the store the running Paddock's nodes read
(found through NATS), else the local store. build and pull write to the local store and then
push to the running Paddock's store when there is one.
`;

export interface ImageCliIo {
  out: (s: string) => void;
  err: NodeJS.WritableStream & { isTTY?: boolean };
  /** Connects to Paddock for `stats` and to find its store (the caller knows the NATS URL and timeouts). */
  connect?: () => Promise<{ nodes: { list(): Promise<NodeRecord[]>; info(node: string): Promise<unknown> }; close(): Promise<void> }>;
}

export class ImageUsageError extends Error {}

function localDir(): string {
  return loadConfig().imagesDir;
}

type PaddockLink = Awaited<ReturnType<NonNullable<ImageCliIo['connect']>>>;

/** `f` on a connection to the running Paddock; `none` when there is no Paddock to connect to. */
async function withPaddock<T>(io: Pick<ImageCliIo, 'connect'>, none: T, f: (pdk: PaddockLink) => Promise<T>): Promise<T> {
  if (!io.connect) return none;
  let pdk: PaddockLink;
  try {
    pdk = await io.connect();
  } catch {
    return none;
  }
  try {
    return await f(pdk);
  } finally {
    await pdk.close().catch(() => {});
  }
}

/** The store the live nodes read, when a Paddock answers (first node's, if they differ). */
export function runningStore(io: Pick<ImageCliIo, 'connect'>): Promise<string | undefined> {
  return withPaddock(io, undefined, async (pdk) => {
    const now = Date.now();
    return (await pdk.nodes.list().catch(() => [])).find((r) => now - r.ts < 3 * r.heartbeatMs && r.store)?.store;
  });
}

/**
 * The layers running sandboxes read, as every node not marked lost says (mounted, or attached to
 * a VM): a collection must keep them whatever names them. A node that does not answer may have
 * sandboxes on layers no image names any more: gc then refuses (UNAVAILABLE) unless `force`.
 */
export function layersInUse(io: Pick<ImageCliIo, 'connect'>, force: boolean): Promise<{ digests: string[]; note?: string }> {
  return withPaddock(io, { digests: [], note: 'no Paddock answers: the collection goes by images alone' }, async (pdk) => {
    let records: NodeRecord[];
    try {
      records = await pdk.nodes.list();
    } catch {
      return { digests: [], note: 'this NATS has no node table: the collection goes by images alone' };
    }
    const used = new Set<string>();
    const silent: string[] = [];
    for (const r of records) {
      if (r.lostAt !== undefined) continue;
      try {
        const l = ((await pdk.nodes.info(r.node)) as { layers?: NodeLayerStats }).layers;
        // A mount no sandbox uses is only kept warm for the next create, which no manifest asks for.
        const mounted = new Set<string>();
        for (const m of l?.mounted ?? []) {
          mounted.add(m.digest);
          if (m.sandboxes > 0) used.add(m.digest);
        }
        // A layer in use and not mounted is attached to a VM as a disk.
        for (const x of l?.layers ?? []) if (x.users > 0 && !mounted.has(x.digest)) used.add(x.digest);
      } catch {
        silent.push(r.node);
      }
    }
    if (silent.length > 0 && !force) {
      throw new ProtocolError('UNAVAILABLE', `gc: node(s) ${silent.join(', ')} did not say which layers their sandboxes read; they are not marked lost, so they may still run some. Try again, or pass --force to collect anyway`);
    }
    return { digests: [...used], ...(silent.length > 0 ? { note: `--force: node(s) ${silent.join(', ')} did not answer; layers only their sandboxes read may be removed` } : {}) };
  });
}

async function storeFor(flag: string | undefined, io: ImageCliIo): Promise<LayerStore> {
  return openStore(flag ?? process.env.PADDOCK_STORE_URL ?? (await runningStore(io)) ?? localDir());
}

/** After a local build or pull: the running Paddock's nodes see the image at their next heartbeat. */
export async function publish(m: ImageManifest, io: Pick<ImageCliIo, 'connect' | 'err'>): Promise<void> {
  const target = process.env.PADDOCK_STORE_URL ?? (await runningStore(io));
  if (!target) return;
  const to = openStore(target);
  try {
    await copyImage(m.name, new LocalLayerStore(localDir()), to);
    io.err.write(`${m.name}: in the running Paddock's store ${to.location}\n`);
  } finally {
    await to.close();
  }
}

/** Runs one `paddock image` command; resolves to the exit status. */
export async function imageCommand(argv: string[], io: ImageCliIo): Promise<number> {
  const [cmd, ...rest] = argv;
  const { values, positionals } = parseFlags(
    rest,
    {
      name: { type: 'string' },
      cwd: { type: 'string' },
      env: { type: 'string', multiple: true },
      parts: { type: 'boolean' },
      python: { type: 'boolean' },
      desktop: { type: 'boolean' },
      to: { type: 'string' },
      from: { type: 'string' },
      store: { type: 'string' },
      json: { type: 'boolean' },
      force: { type: 'boolean' },
      'grace-ms': { type: 'string' },
      listen: { type: 'string' },
      dir: { type: 'string' },
    },
    (m) => new ImageUsageError(m),
  );
  switch (cmd) {
    case 'build': {
      const store = new ImageStore(localDir());
      if (values.python || values.desktop) {
        const m = values.desktop ? await ensureDesktopImage(store, { progress: io.err }) : await ensurePythonImage(store, { progress: io.err });
        await publish(m, io);
        io.out(`${m.name} ${m.layers.map((l) => l.digest.slice(7, 19)).join(' ')}\n`);
        return 0;
      }
      const src = positionals[0];
      if (!src) throw new ImageUsageError('build: give a directory, a tarball or a spec file (or --python, --desktop)');
      const path = resolve(src);
      if (!existsSync(path)) throw new ImageUsageError(`build: no such file or directory ${src}`);
      let spec: BuildSpec;
      if (path.endsWith('.json')) {
        spec = parseSpec(readFileSync(path, 'utf8'), dirname(path));
      } else {
        if (!values.name) throw new ImageUsageError('build: --name is required for a directory or tarball');
        const base = statSync(path).isDirectory() ? { dir: path } : { tar: path };
        spec = { name: values.name, base, env: [...DEFAULT_ENV, ...(values.env ?? [])], cwd: values.cwd ?? '/' };
      }
      const m = await buildImage(spec, { store, progress: io.err, parts: values.parts });
      await publish(m, io);
      io.out(`${m.name} ${m.layers.map((l) => l.digest.slice(7, 19)).join(' ')}\n`);
      return 0;
    }
    case 'push':
    case 'pull': {
      const name = positionals[0];
      if (!name) throw new ImageUsageError(`${cmd}: which image?`);
      const remoteLoc = cmd === 'push' ? values.to : values.from;
      if (!remoteLoc) throw new ImageUsageError(`${cmd}: --${cmd === 'push' ? 'to' : 'from'} STORE is required`);
      const local = new LocalLayerStore(values.dir ?? localDir());
      const remote = openStore(remoteLoc);
      try {
        const [from, to] = cmd === 'push' ? [local, remote] : [remote, local];
        const m = await copyImage(name, from, to, (l, copied) => io.err.write(`${copied ? 'copied' : 'present'} ${l.digest} (${human(l.size)})\n`));
        if (cmd === 'pull' && values.dir === undefined) await publish(m, io);
        io.out(`${m.name}: ${m.layers.length} layer(s) in ${to.location}\n`);
      } finally {
        await remote.close();
      }
      return 0;
    }
    case 'ls': {
      const s = await storeFor(values.store, io);
      try {
        const names = await s.list();
        const rows = [];
        for (const n of names) {
          const m = await s.get(n);
          if (m) rows.push({ name: n, layers: m.layers.length, bytes: m.layers.reduce((a, l) => a + l.size, 0), digests: m.layers.map((l) => l.digest) });
        }
        if (values.json) io.out(`${JSON.stringify(rows)}\n`);
        else {
          io.out(`${'IMAGE'.padEnd(28)} ${'LAYERS'.padStart(6)} ${'SIZE'.padStart(10)}  TOP LAYER\n`);
          for (const r of rows) io.out(`${r.name.padEnd(28)} ${String(r.layers).padStart(6)} ${human(r.bytes).padStart(10)}  ${(r.digests.at(-1) ?? '').slice(0, 19)}\n`);
        }
      } finally {
        await s.close();
      }
      return 0;
    }
    case 'rm': {
      if (positionals.length === 0) throw new ImageUsageError('rm: which image?');
      const s = await storeFor(values.store, io);
      try {
        for (const n of positionals) await s.remove(n);
      } finally {
        await s.close();
      }
      return 0;
    }
    case 'gc': {
      const grace = values['grace-ms'] === undefined ? 3600_000 : Number(values['grace-ms']);
      if (!Number.isFinite(grace) || grace < 0) throw new ImageUsageError('gc: --grace-ms must be a non-negative number');
      const inUse = await layersInUse(io, values.force === true);
      if (inUse.note) io.err.write(`paddock image gc: ${inUse.note}\n`);
      const s = await storeFor(values.store, io);
      try {
        const r = await s.gc(grace, inUse.digests);
        if (values.json) io.out(`${JSON.stringify({ ...r, inUse: inUse.digests.length })}\n`);
        else io.out(`removed ${r.removed.length} layer(s), ${human(r.freedBytes)} freed; ${r.kept} kept (${inUse.digests.length} read by running sandboxes)\n`);
      } finally {
        await s.close();
      }
      return 0;
    }
    case 'serve': {
      const store = new ImageStore(values.dir ?? localDir());
      await store.init();
      const server = new StoreServer(store);
      const listen = values.listen ?? '127.0.0.1:0';
      const i = listen.lastIndexOf(':');
      const url = await server.listen(listen.slice(0, i) || '127.0.0.1', Number(listen.slice(i + 1) || 0));
      io.out(`serving ${store.root} at ${url}\n`);
      await new Promise<void>((r) => {
        process.once('SIGINT', () => r());
        process.once('SIGTERM', () => r());
      });
      await server.close();
      return 0;
    }
    case 'stats': {
      if (!io.connect) throw new ImageUsageError('stats: needs a Paddock to talk to');
      const pdk = await io.connect();
      try {
        let node = positionals[0];
        if (!node) {
          const live = (await pdk.nodes.list()).filter((r) => Date.now() - r.ts < 3 * r.heartbeatMs);
          if (live.length !== 1) throw new ImageUsageError(`stats: name a node (live: ${live.map((r) => r.node).join(', ') || 'none'})`);
          node = (live[0] as { node: string }).node;
        }
        const info = (await pdk.nodes.info(node)) as { layers?: NodeLayerStats };
        const l = info.layers;
        if (!l) throw new ImageUsageError(`stats: node ${node} reports no layer cache`);
        if (values.json) {
          io.out(`${JSON.stringify(l)}\n`);
          return 0;
        }
        io.out(`node ${node}: ${l.mode} from ${l.store}; cache ${human(l.cachedBytes)} of ${human(l.budgetBytes)}, ${l.evictions} eviction(s)\n`);
        io.out(`fetched ${human(l.fetchedBytes)}; chunk hits ${l.hits}, misses ${l.misses}\n`);
        io.out(`${'LAYER'.padEnd(20)} ${'SIZE'.padStart(10)} ${'CACHED'.padStart(10)} ${'FETCHED'.padStart(10)} ${'HITS'.padStart(7)} ${'MISSES'.padStart(7)} USERS\n`);
        for (const x of l.layers) {
          io.out(`${x.digest.slice(0, 19).padEnd(20)} ${human(x.size).padStart(10)} ${human(x.cachedBytes).padStart(10)} ${human(x.fetchedBytes).padStart(10)} ${String(x.hits).padStart(7)} ${String(x.misses).padStart(7)} ${x.users}\n`);
        }
      } finally {
        await pdk.close();
      }
      return 0;
    }
    default:
      io.out(IMAGE_USAGE);
      if (cmd === undefined || cmd === 'help' || cmd === '--help' || cmd === '-h') return 0;
      throw new ImageUsageError(`unknown image command '${cmd}'`);
  }
}

/** `image …` from the command line: its flags are its own; a usage error exits 2. */
export async function imageCli(g: GlobalFlags, rest: string[]): Promise<number> {
  try {
    return await imageCommand(rest, { out, err: process.stderr, connect: () => connect(g) });
  } catch (err) {
    if (err instanceof ImageUsageError) throw new UsageError(`image: ${err.message}`);
    if (err instanceof ProtocolError && ErrorCodes[err.code].fault === 'user') throw new UsageError(`image: ${err.message}`);
    throw err;
  }
}
