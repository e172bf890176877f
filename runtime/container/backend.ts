/**
 * The container backend: crun over a root filesystem composed with OverlayFS from read-only EROFS
 * layers (mounted once per node and shared by all its sandboxes; mount(8) puts a loop device
 * under each layer file) and a per-sandbox writable layer. No daemon, socket or Paddock file goes inside: exec is `crun exec`, files are reached from
 * the host side through the overlay.
 *
 * Layout under the node directory:
 *   crun/                    crun's state (--root)
 *   layers/<hex>/            one read-only mount per EROFS layer in use
 *   sandboxes/<id>/          bundle: config.json, upper/, work/, rootfs/ (the overlay), crun.err
 */
import { spawn } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ProtocolError, type SandboxSpec } from '../../protocol/index.ts';
import type { Backend, ExecOptions, ExecOutcome } from '../backend.ts';
import { type CgroupMode, cgroupDir, detectCgroups, mounts, v1Hierarchies } from '../cgroups.ts';
import { RootFiles } from '../files.ts';
import type { ImageManifest, ImageStore, LayerRef } from '../images/store.ts';
import { run } from '../proc.ts';
import { execInContainer } from './exec.ts';
import { baseEnv, ociConfig } from './oci.ts';
import { CgroupSleep } from './sleep.ts';

export interface ContainerBackendOptions {
  nodeDir: string;
  nodeId: string;
  images: ImageStore;
  crun?: string;
}

export class ContainerBackend implements Backend {
  readonly kind = 'container' as const;
  readonly cgroupMode: CgroupMode;
  private readonly crun: string;
  private readonly crunRoot: string;
  private readonly layersDir: string;
  private readonly sandboxesDir: string;
  /** Layer digest → its mount point, once mounted (a promise, so concurrent creates mount once). */
  private readonly layerMounts = new Map<string, Promise<string>>();
  private execSeq = 0;
  private readonly hierarchies: string[];
  /**
   * Per sandbox: its base environment (`crun exec --env` replaces the config's, so we pass it
   * whole) and whether its processes run under SCHED_IDLE (best-effort QoS).
   */
  private readonly procs = new Map<string, { env: Record<string, string>; idle: boolean }>();
  private readonly sleeper: CgroupSleep;

  constructor(private readonly opts: ContainerBackendOptions) {
    this.crun = opts.crun ?? 'crun';
    this.crunRoot = join(opts.nodeDir, 'crun');
    this.layersDir = join(opts.nodeDir, 'layers');
    this.sandboxesDir = join(opts.nodeDir, 'sandboxes');
    this.cgroupMode = detectCgroups();
    this.hierarchies = this.cgroupMode === 'v2' ? [] : v1Hierarchies();
    this.sleeper = new CgroupSleep(this.cgroupMode);
    if (this.cgroupMode === 'hybrid') {
      throw new Error('cgroups are hybrid: crun needs /sys/fs/cgroup/unified unmounted; start the node through node-main.ts, which does it in a private mount namespace');
    }
  }

  /** The cgroup of a sandbox, below one parent per node so a node's leftovers are easy to find. */
  cgroupPath(id: string): string {
    return `/paddock/${this.opts.nodeId}/${id}`;
  }

  private dir(id: string) {
    return join(this.sandboxesDir, id);
  }

  async init(): Promise<void> {
    for (const d of [this.crunRoot, this.layersDir, this.sandboxesDir]) await mkdir(d, { recursive: true });
  }

  private layer(ref: LayerRef): Promise<string> {
    let p = this.layerMounts.get(ref.digest);
    if (!p) {
      p = (async () => {
        const target = join(this.layersDir, ref.digest.replace(/^sha256:/, ''));
        await mkdir(target, { recursive: true });
        if (!mounts().some((m) => m.target === target)) {
          await run('mount', ['-t', 'erofs', '-o', 'ro', this.opts.images.blobPath(ref.digest), target]);
        }
        return target;
      })();
      this.layerMounts.set(ref.digest, p);
      p.catch(() => this.layerMounts.delete(ref.digest));
    }
    return p;
  }

  async create(id: string, spec: SandboxSpec, image: ImageManifest): Promise<void> {
    const dir = this.dir(id);
    const rootfs = join(dir, 'rootfs');
    try {
      await mkdir(dir);
      await Promise.all(['upper', 'work', 'rootfs'].map((d) => mkdir(join(dir, d))));
      const lowers = await Promise.all(image.layers.map((l) => this.layer(l)));
      // overlayfs lists the top layer first; manifests list the bottom first.
      const lowerdir = lowers.reverse().join(':');
      await run('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lowerdir},upperdir=${join(dir, 'upper')},workdir=${join(dir, 'work')}`, rootfs]);
      const config = ociConfig({ spec, image, rootfs, cgroupsPath: this.cgroupPath(id), cgroupMode: this.cgroupMode });
      await writeFile(join(dir, 'config.json'), JSON.stringify(config));
      const env = Object.fromEntries(baseEnv(image, spec).map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));
      this.procs.set(id, { env, idle: spec.qos === 'be' });
      await this.crunRun(id, dir, spec.qos === 'be');
    } catch (e) {
      await this.destroy(id).catch(() => {});
      if (e instanceof ProtocolError) throw e;
      throw new ProtocolError('BACKEND_FAILED', `create ${id}: ${(e as Error).message}`, { cause: e });
    }
  }

  /** A crun command line, under SCHED_IDLE for best-effort sandboxes (children inherit the policy). */
  private crunCmd(args: string[], idle: boolean): [string, string[]] {
    return idle ? ['chrt', ['--idle', '0', this.crun, ...args]] : [this.crun, args];
  }

  private async crunRun(id: string, dir: string, idle: boolean): Promise<void> {
    // The container's init inherits crun's stdio and keeps it open for its whole life, so crun's
    // stderr goes to a file rather than a pipe we would wait on forever.
    const errFile = join(dir, 'crun.err');
    const fd = openSync(errFile, 'w');
    try {
      const code = await new Promise<number>((resolve, reject) => {
        const [cmd, args] = this.crunCmd(['--root', this.crunRoot, 'run', '-d', '--bundle', dir, id], idle);
        const child = spawn(cmd, args, { stdio: ['ignore', 'ignore', fd] });
        child.on('error', reject);
        child.on('exit', (c) => resolve(c ?? 1));
      });
      if (code !== 0) {
        const msg = (await readFile(errFile, 'utf8').catch(() => '')).trim();
        throw new ProtocolError('BACKEND_FAILED', `crun run: ${msg || `exit ${code}`}`);
      }
    } finally {
      closeSync(fd);
    }
  }

  exec(id: string, opts: ExecOptions): Promise<ExecOutcome> {
    const pidFile = join(this.dir(id), `exec-${++this.execSeq}.pid`);
    const p = this.procs.get(id);
    const env = { ...p?.env, ...opts.env };
    const [crun, prefix] = this.crunCmd([], p?.idle ?? false);
    return execInContainer({ crun, prefix, root: this.crunRoot, id, pidFile }, { ...opts, env });
  }

  pause(id: string): Promise<void> {
    return this.freezeOrThaw(id);
  }

  resume(id: string): Promise<void> {
    return this.sleeper.thaw(this.cgroupPath(id));
  }

  async hibernate(id: string): Promise<{ bytes: number; swapped: boolean }> {
    const path = this.cgroupPath(id);
    await this.freezeOrThaw(id);
    try {
      return await this.sleeper.reclaim(path);
    } catch (e) {
      await this.sleeper.thaw(path).catch(() => {});
      throw new ProtocolError('BACKEND_FAILED', `hibernate ${id}: ${(e as Error).message}`, { cause: e });
    }
  }

  restore(id: string): Promise<void> {
    return this.sleeper.thaw(this.cgroupPath(id));
  }

  /** Freezes, and thaws again if freezing fails halfway: a sandbox is never left half-frozen. */
  private async freezeOrThaw(id: string): Promise<void> {
    const path = this.cgroupPath(id);
    try {
      await this.sleeper.freeze(path);
    } catch (e) {
      await this.sleeper.thaw(path).catch(() => {});
      throw e instanceof ProtocolError ? e : new ProtocolError('BACKEND_FAILED', `pause ${id}: ${(e as Error).message}`, { cause: e });
    }
  }

  files(id: string): RootFiles {
    return new RootFiles(join(this.dir(id), 'rootfs'));
  }

  async destroy(id: string): Promise<void> {
    const dir = this.dir(id);
    this.procs.delete(id);
    // Frozen processes cannot die: thaw first, or `delete --force` waits on them.
    await this.sleeper.thaw(this.cgroupPath(id)).catch(() => {});
    // `delete --force` kills every process of the container and removes its cgroup.
    const del = await run(this.crun, ['--root', this.crunRoot, 'delete', '--force', id], { allowFail: true });
    if (del.code !== 0 && !/does not exist|not found|No such file/i.test(del.stderr)) {
      throw new ProtocolError('BACKEND_FAILED', `crun delete ${id}: ${del.stderr.trim()}`);
    }
    await this.removeCgroup(this.cgroupPath(id));
    const rootfs = join(dir, 'rootfs');
    if (mounts().some((m) => m.target === rootfs)) {
      const u = await run('umount', [rootfs], { allowFail: true });
      if (u.code !== 0) await run('umount', ['-l', rootfs]);
    }
    await rm(dir, { recursive: true, force: true });
  }

  /** Removes a cgroup crun left (it should not, but a crash between steps can). */
  private async removeCgroup(path: string): Promise<void> {
    const ctrls = this.cgroupMode === 'v2' ? [''] : this.hierarchies;
    for (const c of ctrls) {
      const d = cgroupDir(this.cgroupMode, path, c);
      await rmdir(d).catch(() => {});
    }
  }

  async recover(): Promise<string[]> {
    await this.init();
    const ids = new Set<string>(await readdir(this.sandboxesDir).catch(() => [] as string[]));
    const listed = await run(this.crun, ['--root', this.crunRoot, 'list', '--quiet'], { allowFail: true });
    for (const line of listed.stdout.split('\n')) if (line.trim()) ids.add(line.trim());
    for (const id of ids) await this.destroy(id);
    // Cgroups of sandboxes whose crun state was already gone, in any hierarchy.
    const parentPath = `/paddock/${this.opts.nodeId}`;
    const strays = new Set<string>();
    for (const h of this.cgroupMode === 'v2' ? [''] : this.hierarchies) {
      for (const d of await readdir(cgroupDir(this.cgroupMode, parentPath, h), { withFileTypes: true }).catch(() => [])) {
        if (d.isDirectory()) strays.add(d.name);
      }
    }
    for (const name of strays) {
      ids.add(name);
      await this.killCgroup(`${parentPath}/${name}`);
      await this.removeCgroup(`${parentPath}/${name}`);
    }
    return [...ids];
  }

  private async killCgroup(path: string): Promise<void> {
    const ctrl = this.cgroupMode === 'v2' ? '' : 'pids';
    const procs = await readFile(join(cgroupDir(this.cgroupMode, path, ctrl), 'cgroup.procs'), 'utf8').catch(() => '');
    for (const p of procs.split('\n')) {
      const pid = Number.parseInt(p, 10);
      if (pid > 1) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone
        }
      }
    }
    if (procs.trim()) await new Promise((r) => setTimeout(r, 50));
  }

  async close(): Promise<void> {
    for (const [digest, p] of this.layerMounts) {
      const target = await p.catch(() => null);
      if (target) await run('umount', [target], { allowFail: true });
      this.layerMounts.delete(digest);
    }
    await this.removeCgroup(`/paddock/${this.opts.nodeId}`);
    await this.removeCgroup('/paddock');
  }
}
