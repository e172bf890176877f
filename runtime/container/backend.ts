/**
 * The container backend: crun over a root filesystem composed with OverlayFS from read-only EROFS
 * layers (mounted once per node and shared by all its sandboxes, straight from the layer file
 * through mount(2), no loop device) and a per-sandbox writable layer. No daemon, socket or Paddock
 * file goes inside: exec is `crun exec`, files are reached from the host side through the init's
 * /proc/<pid>/root. The writable layer and the overlay are mounted in a mount namespace of the
 * sandbox's own (hardening.ts): the node's mount table stays the same size at any density.
 *
 * Layout under the node directory:
 *   layers/<hex>/            one read-only mount per EROFS layer in use
 *   run → /dev/shm/paddock-run/<key>   on a tmpfs every mount namespace sees (hostRunDir)
 *   run/crun/                crun's state (--root)
 *   run/sandboxes/<id>/      bundle: config.json, init.pid, crun.err, exec pid and process files,
 *                            adopt.json (what a restarted node needs to take the sandbox up),
 *                            and disk/ (tmpfs: upper/, work/, l0… the layers idmapped to the
 *                            sandbox's host ids, userns: its user namespace) and rootfs/ (the
 *                            overlay), mounted only in the sandbox's namespaces
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, constants, mkdirSync, openSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { type FileHandle, lstat, mkdir, open, readdir, readFile, readlink, rm, rmdir, symlink, writeFile } from 'node:fs/promises';
import { Socket } from 'node:net';
import { constants as osConstants } from 'node:os';
import { join, resolve } from 'node:path';
import { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { diskMiBOf, type NetworkPolicy, ProtocolError, type SandboxSpec, type SandboxStats } from '../../protocol/index.ts';
import type { Adopting, Backend, ExecOptions, ExecOutcome, HibernateOutcome, KeptSandbox, PortForwarding, Processes, ProcessOptions, RunningProcess, SnapshotImages, SnapshotStore, Snapshotting } from '../backend.ts';
import { type CgroupMode, cgroupDir, detectCgroups, favorDynamicCgroups, isMountPoint, v1Hierarchies } from '../cgroups.ts';
import { RootFiles } from '../files.ts';
import { type IdRange, IdRanges, traversable } from '../ids.ts';
import { BUSYBOX_INIT } from '../images/busybox.ts';
import type { LayerManager } from '../images/layers.ts';
import { waitExecuted } from '../images/started.ts';
import type { ImageManifest, LayerRef } from '../images/store.ts';
import { NS_MARK } from '../namespace.ts';
import { Egress } from '../network/egress.ts';
import { run } from '../proc.ts';
import { sourceFile } from '../source.ts';
import { type MountPlan, resolveProgram, Spawner } from '../spawner.ts';
import { buildStaticBinary } from '../static-binary.ts';
import { procStat, readText } from '../sync-read.ts';
import { CgroupPool } from './cgroup-pool.ts';
import { execInContainer, killTree, nsPid, OutputBudget, signalGroup } from './exec.ts';
import { Hardening } from './hardening.ts';
import { baseEnv, DEFAULT_CFS_PERIOD_US, ociConfig } from './oci.ts';
import { CgroupSleep } from './sleep.ts';
import { buildSnapshotBlob, removeStage, snapshotImageName, stageUpper } from './snapshot.ts';
import { judged, LimitWatch } from './verdict.ts';

export interface ContainerBackendOptions {
  nodeDir: string;
  nodeId: string;
  /** Mounts layers once per node (lazily from the store, or from the node's cache). */
  layers: LayerManager;
  crun?: string;
  /**
   * Where the node's small C programs are built (static-binary.ts): the process spawner, which the
   * backend needs, and the sandbox init, without which images' own inits run as pid 1.
   */
  binDir: string;
  log?: Logger;
  /** Resolves a spec's images into the manifest its rootfs is composed of (the node's images). */
  resolve?: (spec: SandboxSpec) => Promise<ImageManifest>;
  /** The image store the node reads, for snapshots of sandboxes' files (absent: no snapshots). */
  store?: SnapshotImages;
}


/** What a snapshot of a sandbox's files keeps on the node beside the image it made (snapshots/<name>.json). */
interface SnapshotRecord {
  image: string;
  bytes: number;
  meta?: Record<string, unknown>;
}

export class ContainerBackend implements Backend, Snapshotting, SnapshotStore, PortForwarding, Processes, Adopting {
  readonly kind = 'container' as const;
  readonly cgroupMode: CgroupMode;
  private crun: string;
  private readonly runDir: string;
  /** Where runDir points (hostRunDir). */
  private readonly hostRun: string;
  private readonly crunRoot: string;
  private readonly layersDir: string;
  private readonly sandboxesDir: string;
  /** Layer digest → its mount point, once mounted (a promise, so concurrent creates mount once). */
  /** Layers each sandbox holds, released when it is destroyed. */
  private readonly layersOf = new Map<string, LayerRef[]>();
  private readonly idRanges = new IdRanges();
  private readonly idsOf = new Map<string, IdRange>();
  private execSeq = 0;
  /**
   * The sandboxes' pid 1 (init.c), open: handed to crun as fd 3, it is never a file inside a
   * sandbox. Without a C compiler on the node, sandboxes run their image's init as pid 1 instead
   * (busybox's reaps orphans late; `sleep infinity` never).
   */
  private initBinary?: FileHandle;
  /** Starts `crun run`, `crun exec` and `crun delete` (spawner.ts: forking the node for each held its event loop). */
  private spawn?: Spawner;
  /** Whether cgroup migrations skip their RCU wait (cgroups.ts favorDynamicCgroups). */
  dynamicCgroups = false;
  private readonly hierarchies: string[];
  /**
   * Per sandbox: its base environment (`crun exec --env` replaces the config's, so we pass it
   * whole), whether its processes run under SCHED_IDLE (best-effort QoS), and its init's pid (the
   * way into its root filesystem, which is mounted only in its own namespaces).
   */
  private readonly procs = new Map<string, SandboxProc>();
  /** Sandbox by its init's host pid, while it runs: the spawner says when an init ends (initEnded). */
  private readonly byInit = new Map<number, string>();
  /** Sandboxes of a previous run taken up by recover, for the node (kept). */
  private readonly keptList: KeptSandbox[] = [];
  /**
   * Inits of taken-up sandboxes, by host pid, with their start time: their parent, the old node's
   * spawner, died with it, so their end is seen by looking (watchAdopted).
   */
  private readonly adoptedInits = new Map<number, string>();
  private adoptWatch?: NodeJS.Timeout;
  /** Told when a sandbox's init ends by itself (an OOM kill, say): the sandbox is over. */
  onCrash?: (id: string, why: string) => void;
  private readonly sleeper: CgroupSleep;
  /** Empty cgroups of killed sandboxes for new ones (cgroup-pool.ts): v1 only, off with PADDOCK_CGROUP_POOL=0. */
  private readonly pool?: CgroupPool;
  /** User-namespace layers, the bounded writable layer, CPU pinning, lxcfs. */
  private readonly hardening: Hardening;
  private readonly egress: Egress;
  private readonly output = new OutputBudget({
    // Measured here (the adversarial streams case): four sandboxes streaming 64 MiB at once put a
    // neighbour's exec at 3.4× its quiet p50 unbounded, 3.6× at 64 MiB/s for the node, 1.4–3.3× at
    // 32 (more when the case ran after others), 1.4× at 16.
    sandboxMiBps: Number(process.env.PADDOCK_EXEC_OUTPUT_MIBPS) || 16,
    nodeMiBps: Number(process.env.PADDOCK_NODE_OUTPUT_MIBPS) || 16,
  });

  constructor(private readonly opts: ContainerBackendOptions) {
    this.crun = opts.crun ?? 'crun';
    this.runDir = join(opts.nodeDir, 'run');
    this.hostRun = hostRunDir(opts.nodeDir);
    this.crunRoot = join(this.runDir, 'crun');
    this.layersDir = join(opts.nodeDir, 'layers');
    this.sandboxesDir = join(this.runDir, 'sandboxes');
    this.cgroupMode = detectCgroups();
    this.hierarchies = this.cgroupMode === 'v2' ? [] : v1Hierarchies();
    this.sleeper = new CgroupSleep(this.cgroupMode);
    if (this.cgroupMode === 'v1') {
      const pool = new CgroupPool(`/paddock/${opts.nodeId}`, this.hierarchies);
      if (pool.max > 0) this.pool = pool;
    }
    this.hardening = new Hardening(opts.nodeDir, { mode: this.cgroupMode, path: `/paddock/${opts.nodeId}.lxcfs` });
    this.egress = new Egress(opts.nodeId);
    if (this.cgroupMode === 'hybrid') {
      throw new Error('cgroups are hybrid: crun needs /sys/fs/cgroup/unified unmounted; start the node through ops/node-main.ts, which does it in a private mount namespace');
    }
  }

  /** The cgroup of a sandbox, below one parent per node so a node's leftovers are easy to find. */
  /** The crun binary and state root of this node's sandboxes (FnCall execs its runner with them). */
  get crunState(): { crun: string; root: string } {
    return { crun: this.crun, root: this.crunRoot };
  }

  cgroupPath(id: string): string {
    return `/paddock/${this.opts.nodeId}/${id}`;
  }

  private dir(id: string) {
    return join(this.sandboxesDir, id);
  }

  async init(): Promise<void> {
    // Mounts only inside the node's own mount namespace (ops/launch.ts), where they end with the node.
    if (process.env[NS_MARK]) {
      if (this.cgroupMode !== 'v2' && !this.dynamicCgroups) this.dynamicCgroups = await favorDynamicCgroups(join(this.opts.nodeDir, 'cgroup-favordynmods'));
    }
    await this.linkRunDir();
    for (const d of [this.crunRoot, this.layersDir, this.sandboxesDir]) await mkdir(d, { recursive: true });
    if (!this.initBinary) {
      const bin = await buildStaticBinary(INIT_SOURCE, this.opts.binDir, 'sandbox-init', 'The sandbox init').catch((err: unknown) => {
        this.opts.log?.warn({ err }, 'no sandbox init: sandboxes run their image init as pid 1');
        return undefined;
      });
      if (bin) this.initBinary = await open(bin, 'r');
    }
    if (!this.spawn) {
      // By absolute path: the spawner runs crun from a sealed copy (spawner.c), and a path search per run costs execve calls.
      const crun = resolveProgram(this.crun);
      if (!crun) throw new Error(`${this.crun} not found on PATH (apt-get install crun)`);
      this.crun = crun;
      this.spawn = await Spawner.build(this.opts.binDir, { fd3: this.initBinary?.fd, seal: crun, onOrphanExit: (pid, code) => this.initEnded(pid, code) });
    }
    // crun resolves the bundle's rootfs as the sandbox's root, an unprivileged uid.
    await traversable(this.sandboxesDir);
    if (!this.hardening.lxcfs) await this.hardening.startLxcfs();
  }

  /**
   * The per-sandbox runtime state (bundles, crun's state, a pid file and a process file per exec)
   * on a tmpfs: every create and exec makes and removes files there, and on this host's ext4 that
   * cost the node ~1 ms of CPU per sandbox (the inode allocator's recently-deleted scan). It must
   * outlive the node: a node killed by SIGKILL leaves its sandboxes running, and the next start
   * execs in them through crun's state and their bundles. A tmpfs in the node's own mount
   * namespace went with it, so the directory is on one every namespace of the host sees, and
   * `<node>/run` links to it.
   */
  private async linkRunDir(): Promise<void> {
    await mkdir(this.hostRun, { recursive: true, mode: 0o711 });
    const cur = await lstat(this.runDir).catch(() => undefined);
    if (cur?.isSymbolicLink() && (await readlink(this.runDir)) === this.hostRun) return;
    // A tmpfs an earlier version mounted here, in this namespace; or what is left of one.
    if (cur?.isDirectory() && (await isMountPoint(this.runDir))) await run('umount', ['-l', this.runDir], { allowFail: true });
    if (cur) await rm(this.runDir, { recursive: true, force: true });
    await symlink(this.hostRun, this.runDir);
  }

  /**
   * The sandbox's own range of host ids (ids.ts), taken at its first call and given back when
   * destroy has seen the last of its processes. FnCall asks before its create, to own its scratch
   * directories by the same ids.
   */
  async idsFor(id: string): Promise<IdRange> {
    let ids = this.idsOf.get(id);
    if (!ids) {
      ids = await this.idRanges.take();
      const raced = this.idsOf.get(id);
      if (raced) {
        this.idRanges.give(ids);
        return raced;
      }
      this.idsOf.set(id, ids);
    }
    return ids;
  }

  private async layer(id: string, ref: LayerRef): Promise<string> {
    const target = await this.opts.layers.acquire(ref);
    const held = this.layersOf.get(id) ?? [];
    held.push(ref);
    this.layersOf.set(id, held);
    return target;
  }

  /**
   * `extra.image` is the manifest to run (else the spec's images, resolved); `extra.oci` may amend
   * the OCI config before crun sees it (FnCall: a read-only root, its own writable mounts, IPC
   * sysctls); everything else about the sandbox stays as for any other.
   */
  async create(id: string, spec: SandboxSpec, extra?: { image?: ImageManifest; oci?: (config: Record<string, unknown>) => void }): Promise<void> {
    const image = extra?.image ?? (await this.resolveImage(spec));
    const dir = this.dir(id);
    const rootfs = join(dir, 'rootfs');
    const started = Date.now();
    const diskMiB = diskMiBOf(spec);
    // The writable layer is RAM charged to the sandbox's memory (hardening.ts): past half of it,
    // filling the disk would leave its processes no memory, and the verdict would be MEMORY_LIMIT.
    if (diskMiB > spec.memoryMiB / 2) throw new ProtocolError('INVALID_SPEC', `diskMiB ${diskMiB}: the writable layer is memory on this node, at most half of memoryMiB (${spec.memoryMiB}); raise memoryMiB to at least ${2 * diskMiB}`, { detail: { field: 'diskMiB' } });
    try {
      // The bundle is on the node's run tmpfs (init): synchronous calls there never wait on a disk,
      // and each cost less than one round trip through libuv's thread pool, of which a create made
      // ~30 (measured at ~100 creates/s: ~25,000 thread switches per second in the node).
      mkdirSync(dir);
      mkdirSync(rootfs);
      const ids = await this.idsFor(id);
      const lowers = await Promise.all(image.layers.map((l) => this.layer(id, l)));
      const cpus = this.hardening.pin(id, spec.cpu);
      const config = ociConfig({ spec, image, rootfs, cgroupsPath: this.cgroupPath(id), cgroupMode: this.cgroupMode, ids, userns: this.hardening.userns(dir), cpus, lxcfs: this.hardening.lxcfs });
      extra?.oci?.(config);
      const reaper = this.initBinary !== undefined;
      if (reaper) (config.process as { args: string[] }).args = ['/proc/self/fd/3', ...(isIdleInit(image.init) ? [] : image.init)];
      this.pool?.take(this.cgroupPath(id));
      if (cpus !== undefined) await this.cpusetWithoutRebalance(id);
      const quota = deferCpuQuota(config);
      writeFileSync(join(dir, 'config.json'), JSON.stringify(config));
      const env = Object.fromEntries(baseEnv(image, spec).map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]));
      const proc: SandboxProc = { env, idle: spec.qos === 'be', cwd: spec.cwd ?? image.cwd, process: config.process as Record<string, unknown>, image };
      this.procs.set(id, proc);
      this.sleeper.started(this.cgroupPath(id));
      // overlayfs lists the top layer first; manifests list the bottom first.
      await this.crunRun(id, dir, spec.qos === 'be', this.hardening.ownMounts(dir, diskMiB, lowers.reverse(), rootfs, ids));
      // Lazily loaded layers can make the init's execve slow; exec cannot join it before it ends.
      proc.pid = await waitExecuted({ pidFile: join(dir, 'init.pid'), init: reaper ? ['init'] : image.init });
      if (proc.pid === undefined) throw new ProtocolError('BACKEND_FAILED', 'crun run left no init pid');
      proc.root = this.holdRoot(id, proc.pid);
      this.byInit.set(proc.pid, id);
      if (quota) await this.setCpuQuota(id, quota);
      // FnCall's members (`extra.oci`) are a pool of the node's own, made anew after a restart.
      if (!extra?.oci) this.writeAdoptRecord(id, { v: 1, spec, pid: proc.pid, start: procStat(proc.pid)?.start ?? '', ids, pins: this.hardening.pinsOf(id), env, idle: proc.idle, cwd: proc.cwd, process: proc.process, image });
      if (spec.network) await this.setNetwork(id, spec.network);
    } catch (e) {
      await this.destroy(id).catch(() => {});
      // A layer the store could not deliver explains an init that failed to start.
      const store = this.opts.layers.explain(image.layers, started);
      if (e instanceof ProtocolError && !store) throw e;
      throw new ProtocolError(e instanceof ProtocolError ? e.code : 'BACKEND_FAILED', `create ${id}: ${(e as Error).message}${store ? ` (layer store: ${store})` : ''}`, { cause: e });
    }
  }

  /**
   * Makes the sandbox's v1 cpuset ahead of crun, with `sched_load_balance` off. A new cpuset has it
   * on, and writing the CPUs of one that has it makes the kernel rebuild the scheduler domains,
   * which walks every cpuset and every task in them (dl_rebuild_rd_accounting): in perf at 3,200
   * live sandboxes that was ~5% of all CPU of a create. The root cpuset balances all CPUs, so the
   * sandbox's CPUs stay in the one domain either way: the flag changes nothing but the rebuild.
   */
  private async cpusetWithoutRebalance(id: string): Promise<void> {
    if (this.cgroupMode !== 'v1') return;
    const dir = cgroupDir(this.cgroupMode, this.cgroupPath(id), 'cpuset');
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, 'cpuset.sched_load_balance'), '0');
  }

  private async setCpuQuota(id: string, q: CpuQuota): Promise<void> {
    const path = this.cgroupPath(id);
    if (this.cgroupMode === 'v2') await writeFile(join(cgroupDir(this.cgroupMode, path, ''), 'cpu.max'), `${q.quota} ${q.period}`);
    else await writeFile(join(cgroupDir(this.cgroupMode, path, 'cpu'), 'cpu.cfs_quota_us'), String(q.quota));
  }

  private async crunRun(id: string, dir: string, idle: boolean, mounts: MountPlan): Promise<void> {
    // The container's init inherits crun's stdio and keeps it open for its whole life, so crun's
    // stderr goes to a file rather than a pipe we would wait on forever.
    const errFile = join(dir, 'crun.err');
    const init = this.initBinary !== undefined;
    // fd 3: the init's binary; fd 4: the sandbox's disk, which the init holds (spawner.c pass_disk).
    const argv = [this.crun, '--root', this.crunRoot, 'run', '-d', ...(init ? ['--preserve-fds', '2'] : []), '--pid-file', join(dir, 'init.pid'), '--bundle', dir, id];
    const { code, disk } = await this.spawner().run({ argv, env: { PATH: process.env.PATH ?? '/usr/bin:/bin' }, stderrFile: errFile, idle, passFd3: init, mounts });
    const p = this.procs.get(id);
    if (disk && p) p.disk = disk;
    else if (disk) this.spawner().releaseDisk(disk);
    if (code !== 0) {
      const msg = (await readFile(errFile, 'utf8').catch(() => '')).trim();
      throw new ProtocolError('BACKEND_FAILED', `start: ${msg || `exit ${code}`}`);
    }
  }

  private spawner(): Spawner {
    if (!this.spawn) throw new ProtocolError('BACKEND_FAILED', 'the container backend is not initialised (no process spawner)');
    return this.spawn;
  }

  exec(id: string, opts: ExecOptions): Promise<ExecOutcome> {
    const p = this.running(id);
    const pidFile = join(this.dir(id), `exec-${++this.execSeq}.pid`);
    const env = { ...p.env, ...opts.env };
    const watch = new LimitWatch(this.cgroupMode, this.cgroupPath(id));
    return judged(watch, this.rootOf(id), opts.signal, (signal) => execInContainer({ spawner: this.spawner(), crun: this.crun, idle: p.idle, root: this.crunRoot, id, pidFile, process: p.process, output: { budget: this.output, sandbox: id } }, { ...opts, cwd: opts.cwd ?? p.cwd, env, signal }));
  }

  /**
   * A background process: an exec with no timeout of its own whose stdin is a FIFO the node holds
   * open (O_RDWR, so opening it never waits for the other end) and writes through a non-blocking
   * pipe handle, so that a process that never reads cannot tie up a thread of the node. A
   * terminal is the same exec of the init's relay mode (init.c pty_main), with framed input.
   */
  async startProcess(id: string, o: ProcessOptions): Promise<RunningProcess> {
    const p = this.running(id);
    if (o.pty && !this.initBinary) throw new ProtocolError('BACKEND_FAILED', 'terminals need the sandbox init, which this node could not build (a C compiler with a static libc)');
    const base = join(this.dir(id), `proc-${++this.execSeq}`);
    const fifo = `${base}.in`;
    const mk = await this.spawner().run({ argv: ['mkfifo', '-m', '0600', fifo], captureStderr: true });
    if (mk.code !== 0) throw new ProtocolError('BACKEND_FAILED', `mkfifo: ${mk.stderr.trim() || `exit ${mk.code}`}`);
    const stdin = new Socket({ fd: openSync(fifo, constants.O_RDWR | constants.O_NONBLOCK), readable: false, writable: true });
    stdin.on('error', () => {});
    let cmd = o.cmd;
    if (o.pty && cmd.length === 0) {
      const bash = await this.files(id)
        .read('/bin/bash', 0, 1)
        .then(
          () => true,
          () => false,
        );
      cmd = [bash ? '/bin/bash' : '/bin/sh', '-l'];
    }
    const argv = o.pty ? ['/proc/self/fd/3', 'pty', String(o.pty.cols), String(o.pty.rows), ...cmd] : cmd;
    let told!: (pid: number | null) => void;
    const started = new Promise<number | null>((r) => {
      told = r;
    });
    const watch = new LimitWatch(this.cgroupMode, this.cgroupPath(id));
    const done = judged(watch, this.rootOf(id), o.signal, (signal) =>
      execInContainer(
        { spawner: this.spawner(), crun: this.crun, idle: p.idle, root: this.crunRoot, id, pidFile: `${base}.pid`, process: p.process, stdinPath: fifo, fd3: o.pty !== undefined, onPid: told, output: { budget: this.output, sandbox: id } },
        { cmd: argv, cwd: o.cwd ?? p.cwd, env: { ...p.env, ...o.env }, timeoutMs: o.timeoutMs ?? Number.POSITIVE_INFINITY, maxOutputBytes: o.maxOutputBytes ?? Number.POSITIVE_INFINITY, onOutput: o.onOutput, ...(o.flow ? { flow: o.flow } : {}), discard: true, signal },
      ),
    ).finally(() => {
      stdin.destroy();
      void rm(fifo, { force: true });
    });
    const hostPid = await started;
    let ended = false;
    void done.then(
      () => {
        ended = true;
      },
      () => {
        ended = true;
      },
    );
    const pid = hostPid ? await nsPid(hostPid) : undefined;
    const frame = (type: string, body: Uint8Array) => {
      const head = Buffer.alloc(5);
      head.write(type, 0);
      head.writeUInt32LE(body.length, 1);
      return Buffer.concat([head, body]);
    };
    return {
      cmd,
      ...(pid !== undefined ? { pid } : {}),
      done,
      write: async (data) => {
        if (stdin.destroyed || stdin.writableEnded) throw new ProtocolError('INVALID_STATE', 'its stdin is closed');
        if (stdin.writableLength > STDIN_QUEUE_MAX) throw new ProtocolError('BUSY', `it has not read the last ${stdin.writableLength} bytes of its stdin yet`, { detail: { retryAfterMs: 100 } });
        if (!o.pty) stdin.write(data);
        else for (let at = 0; at < data.length; at += 65536) stdin.write(frame('d', data.subarray(at, at + 65536)));
      },
      closeStdin: () => {
        stdin.end();
      },
      resize: (cols, rows) => {
        if (!o.pty || stdin.destroyed || stdin.writableEnded) return;
        const b = Buffer.alloc(4);
        b.writeUInt16LE(cols, 0);
        b.writeUInt16LE(rows, 2);
        stdin.write(frame('r', b));
      },
      kill: async (signal) => {
        if (!hostPid || ended) return;
        if (signal === 'SIGKILL') await killTree(hostPid);
        else signalGroup(hostPid, signal as NodeJS.Signals);
      },
    };
  }

  pause(id: string): Promise<void> {
    return this.freezeOrThaw(id);
  }

  resume(id: string): Promise<void> {
    return this.sleeper.thaw(this.cgroupPath(id));
  }

  private resolveImage(spec: SandboxSpec): Promise<ImageManifest> {
    if (!this.opts.resolve) throw new ProtocolError('INTERNAL', 'container backend opened without images');
    return this.opts.resolve(spec);
  }

  async hibernate(id: string): Promise<HibernateOutcome> {
    const path = this.cgroupPath(id);
    await this.freezeOrThaw(id);
    try {
      const r = await this.sleeper.reclaim(path);
      return { releasedBytes: r.bytes, swapped: r.swapped };
    } catch (e) {
      await this.sleeper.thaw(path).catch(() => {});
      throw new ProtocolError('BACKEND_FAILED', `hibernate ${id}: ${(e as Error).message}`, { cause: e });
    }
  }

  restore(id: string): Promise<void> {
    return this.sleeper.thaw(this.cgroupPath(id));
  }

  /** Memory and CPU from the sandbox's cgroup, processes from its pids controller. */
  async stats(id: string): Promise<SandboxStats> {
    if (!this.procs.has(id)) throw new ProtocolError('NOT_FOUND', `sandbox ${id} is not on this node`);
    const path = this.cgroupPath(id);
    const read = (ctrl: string, file: string) => readFile(join(cgroupDir(this.cgroupMode, path, ctrl), file), 'utf8').catch(() => undefined);
    const out: SandboxStats = {};
    if (this.cgroupMode === 'v2') {
      const [mem, cpu, pids] = await Promise.all([read('', 'memory.current'), read('', 'cpu.stat'), read('', 'pids.current')]);
      if (mem) out.memoryBytes = Number(mem);
      const usec = cpu ? /^usage_usec (\d+)$/m.exec(cpu)?.[1] : undefined;
      if (usec) out.cpuSec = Number(usec) / 1e6;
      if (pids) out.pids = Number(pids);
    } else {
      const [mem, cpu, pids] = await Promise.all([read('memory', 'memory.usage_in_bytes'), read('cpuacct', 'cpuacct.usage'), read('pids', 'pids.current')]);
      if (mem) out.memoryBytes = Number(mem);
      if (cpu) out.cpuSec = Number(cpu) / 1e9;
      if (pids) out.pids = Number(pids);
    }
    return out;
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

  /** Applies an egress policy (runtime/network/egress.ts); the first that opens anything gives the sandbox a link. */
  async setNetwork(id: string, policy: NetworkPolicy): Promise<void> {
    const { pid } = this.running(id);
    if (!pid) throw new ProtocolError('INVALID_STATE', `sandbox ${id} has no running init`);
    await this.egress.set(id, { pid }, policy, async (text) => {
      await this.files(id).write('/etc/resolv.conf', Buffer.from(text));
    });
    const rec = readAdoptRecord(this.dir(id));
    if (rec) this.writeAdoptRecord(id, { ...rec, network: policy });
  }

  private writeAdoptRecord(id: string, rec: AdoptRecord): void {
    const f = join(this.dir(id), 'adopt.json');
    writeFileSync(`${f}.new`, JSON.stringify(rec));
    renameSync(`${f}.new`, f);
  }

  files(id: string): RootFiles {
    // The root's own filesystem only: through the init's root, the container's /proc, /dev and /sys
    // are mounted too, and the node is real root.
    const root = this.rootOf(id);
    const owner = (this.idsOf.get(id) as IdRange).hostId;
    return new RootFiles(root, { uid: owner, gid: owner }, { oneFilesystem: true, charge: (fd, offset, length) => this.charge(id, [{ fd, offset, length }]), chargeMany: (ranges) => this.charge(id, ranges) });
  }

  /**
   * Allocates a range of a file in the sandbox's writable layer from a process in the sandbox's
   * memory cgroup (the spawner's `@charge`), so the node's write into it lands on the sandbox's
   * memory: its limit bounds what the files API can make it hold, as it bounds what it writes itself.
   */
  private async charge(id: string, ranges: Array<{ fd: number; offset: number; length: number }>): Promise<void> {
    const length = ranges.reduce((n, r) => n + r.length, 0);
    const procs = join(cgroupDir(this.cgroupMode, this.cgroupPath(id), this.cgroupMode === 'v2' ? '' : 'memory'), 'cgroup.procs');
    const { code } = await this.spawner().run({ argv: ['@charge', procs, ...ranges.flatMap((r) => [`/proc/${process.pid}/fd/${r.fd}`, String(r.offset), String(r.length)])] });
    if (code === 0) return;
    if (code === ENOSPC) throw new ProtocolError('DISK_LIMIT', `the sandbox's writable layer is full`);
    if (code === ENOMEM) throw new ProtocolError('MEMORY_LIMIT', `the sandbox's memory is full: its writable layer is memory`);
    throw new ProtocolError('BACKEND_FAILED', `allocating ${length} bytes in sandbox ${id}: errno ${code}`);
  }

  /**
   * An fd of the sandbox's `/` as its init sees it, held for the sandbox's life. Reached through a
   * pid at every use instead, a sandbox whose init died (an OOM kill, say) would leave a pid the
   * host may hand to any process — and the files API, which is real root, would then walk that
   * process's root. The fd stays on the container's root whatever happens to the pid. The pid is
   * checked once, here, to be in the sandbox's own cgroup.
   */
  private holdRoot(id: string, pid: number): number {
    let root: number | undefined;
    try {
      root = openSync(`/proc/${pid}/root`, constants.O_RDONLY | constants.O_DIRECTORY);
      if (readFileSync(`/proc/${pid}/cgroup`, 'utf8').includes(`:${this.cgroupPath(id)}\n`)) return root;
    } catch {
      // gone: said below
    }
    if (root !== undefined) closeSync(root);
    // The init writes why it could not start (an image init that does not exist, say) to crun's error file.
    const why = (readText(join(this.dir(id), 'crun.err')) ?? '').trim();
    throw new ProtocolError('BACKEND_FAILED', why ? `init: ${why}` : `the init of ${id} (pid ${pid}) is gone or not in its cgroup`);
  }

  /** The sandbox's `/` (overlayfs reports the writable layer's free space there too). */
  private rootOf(id: string): string {
    return `/proc/self/fd/${this.running(id).root}`;
  }

  /** A sandbox whose init runs (its root is held), or INVALID_STATE. */
  private running(id: string): SandboxProc & { root: number } {
    const p = this.procs.get(id);
    if (p?.ended) throw new ProtocolError('INVALID_STATE', `sandbox ${id} has crashed: ${p.ended}`);
    if (p?.root === undefined) throw new ProtocolError('INVALID_STATE', `sandbox ${id} has no running init`);
    return p as SandboxProc & { root: number };
  }

  /**
   * A sandbox's init ended while the sandbox was not being destroyed: nothing of it runs any more
   * (the kernel kills a pid namespace with its pid 1), so every exec would only fail. Said at once.
   */
  private initEnded(pid: number, code?: number): void {
    const id = this.byInit.get(pid);
    if (id === undefined) return;
    this.byInit.delete(pid);
    const p = this.procs.get(id);
    const sig = code !== undefined && code > 128 ? Object.entries(osConstants.signals).find(([, n]) => n === code - 128)?.[0] : undefined;
    // A taken-up sandbox's init is not the spawner's child: how it ended is its new parent's to know.
    const how = code === undefined ? '' : sig ? ` by ${sig}` : ` with exit code ${code}`;
    const oom = (code === undefined || sig === 'SIGKILL') && this.oomKilled(id);
    const why = `its init (pid 1) ended${how}${oom ? ' (the OOM killer chose it)' : ''}`;
    if (p) p.ended = why;
    this.opts.log?.warn({ sandbox: id, pid, code }, 'sandbox init ended');
    this.onCrash?.(id, why);
  }

  private oomKilled(id: string): boolean {
    const mem = this.cgroupMode === 'v2' ? 'memory.events' : 'memory.oom_control';
    return /oom_kill\s+[1-9]/.test(readText(join(cgroupDir(this.cgroupMode, this.cgroupPath(id), this.cgroupMode === 'v2' ? '' : 'memory'), mem)) ?? '');
  }

  async destroy(id: string): Promise<void> {
    const dir = this.dir(id);
    const p = this.procs.get(id);
    if (p?.root !== undefined) closeSync(p.root);
    // Held, the disk's tmpfs (charged to this sandbox) would outlive it.
    if (p?.disk) this.spawn?.releaseDisk(p.disk);
    if (p?.pid !== undefined) {
      this.byInit.delete(p.pid);
      this.adoptedInits.delete(p.pid);
    }
    this.procs.delete(id);
    await this.egress.remove(id);
    // Frozen processes cannot die: thaw first, or `delete --force` waits on them.
    await this.sleeper.thawForRemoval(this.cgroupPath(id)).catch(() => {});
    if (this.cgroupMode === 'v1') {
      // What `crun delete --force` would do, without starting it: kill what the container's cgroups
      // hold (its init among them: the rest of its pid namespace dies with it), remove the cgroups,
      // then crun's state. crun is a process of its own, ~15 ms of CPU where a fork+exec costs
      // milliseconds (page-table isolation, a paravirtualised MMU): most of what killing 3,200 cost.
      // A v1 sandbox has no cgroup namespace and no cgroupfs: it cannot make cgroups below its own.
      await this.emptyAndRemove(this.cgroupPath(id), true, this.pool);
      await rm(join(this.crunRoot, id), { recursive: true, force: true });
    } else {
      // Under cgroup v2 a sandbox may make cgroups of its own below its one: crun removes those.
      const del = await this.spawner().run({ argv: [this.crun, '--root', this.crunRoot, 'delete', '--force', id], captureStderr: true, timeoutMs: 60_000 });
      if (del.code !== 0 && !/does not exist|not found|No such file/i.test(del.stderr)) {
        throw new ProtocolError('BACKEND_FAILED', `crun delete ${id}: ${del.stderr.trim()}`);
      }
      await this.emptyAndRemove(this.cgroupPath(id));
    }
    // The overlay and the writable layer went with the container's mount namespace.
    this.hardening.unpin(id);
    // Only now: not one of its processes is left to be charged to these ids alongside a newcomer's.
    const ids = this.idsOf.get(id);
    this.idsOf.delete(id);
    if (ids) this.idRanges.give(ids);
    for (const ref of this.layersOf.get(id) ?? []) this.opts.layers.release(ref);
    this.layersOf.delete(id);
    await rm(dir, { recursive: true, force: true });
  }

  /**
   * Removes a sandbox's cgroup in every hierarchy, waiting for its tasks to leave. `crun delete
   * --force` signals the processes it finds, but with thousands of them (or a fork in flight)
   * some outlive it, and a dying task keeps its cgroups busy until it is reaped: a single rmdir
   * then failed with EBUSY and left the cgroups of a sandbox of 3,000 processes in all nine
   * hierarchies until the node restarted. So: kill what is left, retry, and give up only after
   * DESTROY_WAIT_MS, loudly.
   */
  private async emptyAndRemove(path: string, killFirst = false, pool?: CgroupPool): Promise<void> {
    const ctrls = this.cgroupMode === 'v2' ? [''] : this.hierarchies;
    const deadline = Date.now() + DESTROY_WAIT_MS;
    let left = ctrls.map((c) => cgroupDir(this.cgroupMode, path, c));
    const tasks = left.find((d) => d.includes('/pids/')) ?? (left[0] as string);
    if (killFirst) await killAll(tasks);
    // Kept for a later sandbox once no task is left (every hierarchy holds the same tasks).
    for (let wait = 5; pool; wait = Math.min(100, wait * 2)) {
      if ((readText(join(tasks, 'cgroup.procs')) ?? '').trim() === '') {
        // Kept: nothing left to remove below but what crun made in `unified`.
        if (pool.put(path)) left = [];
        break;
      }
      if (Date.now() > deadline) break;
      await killAll(tasks);
      await new Promise((r) => setTimeout(r, wait));
    }
    for (let wait = 5; ; wait = Math.min(100, wait * 2)) {
      const busy: string[] = [];
      for (const [i, d] of left.entries()) {
        const err = await rmdir(d).then(
          () => undefined,
          (e: NodeJS.ErrnoException) => e.code,
        );
        if (err !== 'EBUSY') continue;
        // Every hierarchy holds the same tasks: while the first is busy, so are the rest (nine
        // rmdirs a round, each a trip through the thread pool, were most of a kill's retries).
        if (i === 0) {
          busy.push(...left);
          break;
        }
        busy.push(d);
      }
      left = busy;
      if (left.length === 0) break;
      if (Date.now() > deadline) {
        throw new ProtocolError('BACKEND_FAILED', `cgroups of ${path} still hold tasks after ${DESTROY_WAIT_MS} ms: ${left.join(', ')}`);
      }
      // Every hierarchy holds the same tasks: one list to kill from (thousands of pids, each a syscall).
      await killAll(left.find((d) => d.includes('/pids/')) ?? (left[0] as string));
      await new Promise((r) => setTimeout(r, wait));
    }
    if (this.cgroupMode === 'v1') await rm(join('/sys/fs/cgroup/unified', path), { recursive: true, force: true });
  }

  /** Removes a cgroup crun left (it should not, but a crash between steps can). */
  private async removeCgroup(path: string): Promise<void> {
    const ctrls = this.cgroupMode === 'v2' ? [''] : this.hierarchies;
    for (const c of ctrls) {
      const d = cgroupDir(this.cgroupMode, path, c);
      await rmdir(d).catch(() => {});
    }
    // On a hybrid host crun still enters each container into the `0::` hierarchy, which inside the
    // node's namespace is a private tmpfs (ops/launch.ts): a directory and a 4 KiB cgroup.procs file per
    // sandbox that crun never removes. Left there, ~30,000 creates fill the 128 MiB tmpfs and every
    // create after fails with ENOSPC. (v1 here means no cgroup2 at `unified`: never a real cgroup.)
    if (this.cgroupMode === 'v1') await rm(join('/sys/fs/cgroup/unified', path), { recursive: true, force: true });
  }

  /**
   * What a previous run of this node left. A sandbox whose init still runs (a node killed by
   * SIGKILL leaves them running) is taken up as it is: its processes, memory and files, asleep if
   * its cgroup is frozen (kept). The rest is removed: sandboxes whose init is gone, ones made
   * halfway, and cgroups with no sandbox.
   */
  async recover(): Promise<string[]> {
    await this.init();
    await this.egress.recover();
    const ids = new Set<string>();
    for (const id of await readdir(this.sandboxesDir).catch(() => [] as string[])) {
      const kept = await this.takeBack(id).catch((err: unknown) => {
        this.opts.log?.warn({ err, sandbox: id }, 'a sandbox the previous run left could not be taken up');
        return false;
      });
      if (!kept) ids.add(id);
    }
    const keptIds = new Set(this.keptList.map((k) => k.id));
    const listed = await run(this.crun, ['--root', this.crunRoot, 'list', '--quiet'], { allowFail: true });
    for (const line of listed.stdout.split('\n')) if (line.trim() && !keptIds.has(line.trim())) ids.add(line.trim());
    for (const id of ids) await this.destroy(id);
    // Cgroups of sandboxes whose state was already gone, in any hierarchy.
    const parentPath = `/paddock/${this.opts.nodeId}`;
    const strays = new Set<string>();
    for (const h of this.cgroupMode === 'v2' ? [''] : this.hierarchies) {
      for (const d of await readdir(cgroupDir(this.cgroupMode, parentPath, h), { withFileTypes: true }).catch(() => [])) {
        if (d.isDirectory() && !keptIds.has(d.name)) strays.add(d.name);
      }
    }
    // A single kill-then-rmdir left the cgroups of a sandbox whose tasks were still dying (EBUSY)
    // until the next restart, seen in the fault test; these wait for them.
    for (const name of strays) {
      // The previous run's pool of empty cgroups (cgroup-pool.ts): no sandbox's.
      if (!/^pool-\d+$/.test(name)) ids.add(name);
      await this.emptyAndRemove(`${parentPath}/${name}`, true).catch((err: unknown) => this.opts.log?.warn({ err, sandbox: name }, 'could not remove the cgroups a previous run left'));
    }
    if (this.keptList.length === 0) this.hardening.stopPredecessor();
    else this.watchAdopted();
    return [...ids];
  }

  kept(): KeptSandbox[] {
    return [...this.keptList];
  }

  /**
   * Takes up sandbox `id` of a previous run if its init still runs (the same process: same pid
   * and start time, in the sandbox's cgroup) and its range of host ids can be held again. Whatever
   * it took is undone by the destroy that follows a false.
   */
  private async takeBack(id: string): Promise<boolean> {
    const rec = readAdoptRecord(this.dir(id));
    if (!rec) return false;
    const st = procStat(rec.pid);
    if (!st || st.start !== rec.start || st.state === 'Z') return false;
    if (!(await this.idRanges.adopt(rec.ids))) {
      this.opts.log?.warn({ sandbox: id, hostId: rec.ids.hostId }, "a sandbox the previous run left is not taken up: another node holds its host ids' block");
      return false;
    }
    this.idsOf.set(id, rec.ids);
    const proc: SandboxProc = { env: rec.env, idle: rec.idle, cwd: rec.cwd, process: rec.process, image: rec.image, pid: rec.pid, adopted: true };
    this.procs.set(id, proc);
    if (rec.pins) this.hardening.repin(id, rec.pins);
    proc.root = this.holdRoot(id, rec.pid);
    // The spawner that held its disk died with the old node; its init holds it too (spawner.c pass_disk).
    if (statSync(`/proc/${rec.pid}/fd/${INIT_DISK_FD}/upper`, { throwIfNoEntry: false })?.isDirectory()) proc.disk = { pid: rec.pid, fd: INIT_DISK_FD };
    this.byInit.set(rec.pid, id);
    this.adoptedInits.set(rec.pid, rec.start);
    await this.endRelayed(id);
    const path = this.cgroupPath(id);
    const frozen = await this.sleeper.isFrozen(path);
    if (!frozen) this.sleeper.started(path);
    // Its link, rules and DNS filter went with the previous run (egress.recover): made again.
    if (rec.network) await this.setNetwork(id, rec.network);
    this.keptList.push({ id, spec: rec.spec, state: frozen ? 'frozen' : 'running' });
    return true;
  }

  /**
   * Ends the execs and processes the previous run was running in sandbox `id` (their pid files are
   * left in its bundle), with their trees. Their output had no reader left, so each would end at
   * its next write anyway (SIGPIPE); and a command whose caller saw it fail must not go on changing
   * the sandbox unseen. What those commands started in sessions of their own runs on.
   */
  private async endRelayed(id: string): Promise<void> {
    const dir = this.dir(id);
    for (const f of await readdir(dir).catch(() => [] as string[])) {
      const m = /^((?:exec|proc)-\d+)\.pid$/.exec(f);
      if (!m) continue;
      const pid = Number.parseInt(readText(join(dir, f)) ?? '', 10);
      // Still that process: in the sandbox's cgroup (a pid the host gave to another is not).
      if (pid > 1 && (readText(`/proc/${pid}/cgroup`) ?? '').includes(`:${this.cgroupPath(id)}\n`)) await killTree(pid);
      for (const left of [f, `${f}.json`, `${f}.stdin`, `${m[1]}.in`]) await rm(join(dir, left), { force: true });
    }
  }

  /** Looks for taken-up inits that ended, every ADOPTED_WATCH_MS, until none is left. */
  private watchAdopted(): void {
    if (this.adoptWatch) return;
    this.adoptWatch = setInterval(() => {
      for (const [pid, start] of this.adoptedInits) {
        const st = procStat(pid);
        if (st && st.start === start && st.state !== 'Z') continue;
        this.adoptedInits.delete(pid);
        this.initEnded(pid);
      }
      if (this.adoptedInits.size === 0) {
        clearInterval(this.adoptWatch);
        this.adoptWatch = undefined;
      }
    }, ADOPTED_WATCH_MS);
    this.adoptWatch.unref();
  }

  // ─── ports (portfwd.c) ─────────────────────────────────────────────────────────────────

  /** One connection to `port` on the sandbox's loopback, through a portfwd process in its network namespace. */
  async connectPort(id: string, port: number): Promise<Duplex> {
    const p = this.running(id);
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new ProtocolError('INVALID_REQUEST', `port: must be an integer from 1 to 65535, not ${port}`, { detail: { field: 'port' } });
    const bin = await buildStaticBinary(PORTFWD_SOURCE, this.opts.binDir, 'portfwd', 'Port forwarding');
    const child = spawn(bin, [String(p.pid), String(port)], { stdio: ['pipe', 'pipe', 'pipe'] });
    const said = await new Promise<string>((resolve) => {
      let err = '';
      const onData = (d: Buffer) => {
        err += d.toString();
        if (err.includes('\n')) done(err.slice(0, err.indexOf('\n')));
      };
      const done = (line: string) => {
        child.stderr.off('data', onData);
        child.off('close', onClose);
        resolve(line);
      };
      // 'close', not 'exit': a child's exit may be seen before the last of its stderr is read, and
      // a "refused" read after it was taken for a failure (BACKEND_FAILED, a 502 at the gateway,
      // where NOT_FOUND was right: seen in a CI run under load).
      const onClose = () => done(err.trim() || 'error portfwd: ended');
      child.stderr.on('data', onData);
      child.once('close', onClose);
      child.once('error', (e) => done(`error spawn: ${e.message}`));
    });
    if (said !== 'ok') {
      child.kill('SIGKILL');
      if (said === 'refused') throw new ProtocolError('NOT_FOUND', `nothing listens on port ${port} in sandbox ${id} (127.0.0.1 and ::1)`, { detail: { port } });
      throw new ProtocolError('BACKEND_FAILED', `connect to port ${port} in sandbox ${id}: ${said.replace(/^error /, '')}`);
    }
    child.stderr.resume();
    // Not Duplex.from: it reads the end of the writable side (the process's stdin, closed when the
    // process exits) before the readable's as a premature close, and destroyed a connection whose
    // server had finished while its last bytes still waited for a slow reader.
    const out = child.stdout;
    const inp = child.stdin;
    const stream = new Duplex({
      read() {
        out.resume();
      },
      write(chunk: Buffer, _enc, cb) {
        inp.write(chunk, (err) => cb(err ?? null));
      },
      final(cb) {
        inp.end(() => cb());
      },
    });
    out.on('data', (d: Buffer) => {
      if (!stream.push(d)) out.pause();
    });
    out.once('end', () => stream.push(null));
    // A write after the process ended fails through its callback; the event needs a listener.
    inp.on('error', () => {});
    // Destroying it mid-way emits AbortError: an 'error' nobody listened for would end the node.
    stream.on('error', (err) => this.opts.log?.debug({ err, sandbox: id, port }, 'port connection ended with an error'));
    // The process is the connection: closing the stream ends it, and once it has ended (the server
    // closed) the stream closes after its last bytes have been read, not before.
    stream.once('close', () => child.kill('SIGKILL'));
    child.once('close', () => {
      if (stream.readableEnded) stream.destroy();
      else stream.once('end', () => stream.destroy());
    });
    return stream;
  }

  // ─── snapshots of files (snapshot.ts) ──────────────────────────────────────────────────

  private get snapshotsDir(): string {
    return join(this.opts.nodeDir, 'snapshots');
  }

  private images(): SnapshotImages {
    if (!this.opts.store) throw new ProtocolError('UNAVAILABLE', 'this node was opened without an image store: no snapshots of files');
    return this.opts.store;
  }

  /**
   * The sandbox's writable layer as one more layer in the image store, and an image of its layers
   * with that one on top (`snapshot-<name>`). The sandbox is frozen for the copy of its writable
   * layer only (stageUpper); the build and the upload run while it runs on.
   */
  async snapshot(id: string, opts: { name?: string; meta?: Record<string, unknown> } = {}): Promise<{ snapshot: string; bytes: number }> {
    const p = this.running(id);
    const store = this.images();
    if (!p.disk) throw new ProtocolError('UNAVAILABLE', `sandbox ${id}'s writable layer cannot be reached (${p.adopted ? 'it was taken up after its node restarted, and its init holds no disk' : "the node's process spawner restarted after it was created"}): its files cannot be snapshotted`, { detail: { what: 'the writable layer' } });
    const name = opts.name ?? `sn-${id}-${Date.now().toString(36)}`;
    const image = snapshotImageName(name);
    await mkdir(this.snapshotsDir, { recursive: true });
    const stage = join(this.snapshotsDir, `stage-${name}`);
    const blob = join(this.snapshotsDir, `blob-${name}.erofs`);
    const path = this.cgroupPath(id);
    try {
      await this.sleeper.freeze(path);
      try {
        await stageUpper(`/proc/${p.disk.pid}/fd/${p.disk.fd}/upper`, stage, this.idsOf.get(id) as IdRange);
      } finally {
        await this.sleeper.thaw(path);
      }
      await buildSnapshotBlob(stage, blob);
      const layer = await store.pushLayer(blob);
      const { recipe: _, ...base } = p.image;
      await store.put({ ...base, name: image, layers: [...p.image.layers, layer] });
      const rec: SnapshotRecord = { image, bytes: layer.size, ...(opts.meta ? { meta: opts.meta } : {}) };
      await writeFile(join(this.snapshotsDir, `${name}.json`), JSON.stringify(rec));
      return { snapshot: name, bytes: layer.size };
    } catch (e) {
      await store.remove(image).catch(() => {});
      await rm(join(this.snapshotsDir, `${name}.json`), { force: true });
      if (e instanceof ProtocolError) throw e;
      throw new ProtocolError('BACKEND_FAILED', `snapshot of ${id}: ${(e as Error).message}`, { cause: e });
    } finally {
      await removeStage(stage);
      await rm(blob, { force: true });
    }
  }

  /** A new sandbox on the image of a snapshot of files: taken here or on any node that reads the same store. */
  async restoreFrom(snapshot: string, newId: string, spec: SandboxSpec): Promise<void> {
    const image = await this.images().get(snapshotImageName(snapshot));
    if (!image) throw new ProtocolError('NOT_FOUND', `snapshot ${snapshot}: its image ${snapshotImageName(snapshot)} is not in the image store this node reads`, { detail: { field: 'fromSnapshot', snapshot } });
    await this.create(newId, spec, { image });
  }

  async fork(id: string, newId: string, spec: SandboxSpec): Promise<void> {
    const { snapshot } = await this.snapshot(id, { meta: { temporary: true } });
    try {
      await this.restoreFrom(snapshot, newId, spec);
    } finally {
      await this.deleteSnapshot(snapshot);
    }
  }

  async listSnapshots(): Promise<Array<{ snapshot: string; bytes: number; meta?: Record<string, unknown> }>> {
    const out: Array<{ snapshot: string; bytes: number; meta?: Record<string, unknown> }> = [];
    for (const f of await readdir(this.snapshotsDir).catch(() => [] as string[])) {
      if (f.startsWith('stage-') || f.startsWith('blob-')) {
        // A snapshot cut short by the node's end.
        await removeStage(join(this.snapshotsDir, f));
        continue;
      }
      if (!f.endsWith('.json')) continue;
      const rec = JSON.parse(await readFile(join(this.snapshotsDir, f), 'utf8').catch(() => '{}')) as Partial<SnapshotRecord>;
      out.push({ snapshot: f.slice(0, -5), bytes: rec.bytes ?? 0, ...(rec.meta ? { meta: rec.meta } : {}) });
    }
    return out;
  }

  /**
   * Forgets the snapshot's image. Its layer stays in the store for sandboxes still running on it
   * until the store's garbage collection (`paddock image gc`), like any image's.
   */
  async deleteSnapshot(name: string): Promise<void> {
    const image = snapshotImageName(name);
    const store = this.images();
    if (await store.get(image)) await store.remove(image);
    await rm(join(this.snapshotsDir, `${name}.json`), { force: true });
  }

  async close(): Promise<void> {
    clearInterval(this.adoptWatch);
    this.adoptWatch = undefined;
    await this.initBinary?.close().catch(() => {});
    this.initBinary = undefined;
    await this.egress.close();
    await this.hardening.close();
    this.idRanges.close();
    // The layers themselves are unmounted by their LayerManager, which the node closes after this.
    this.pool?.drain();
    await this.removeCgroup(`/paddock/${this.opts.nodeId}`);
    await this.removeCgroup('/paddock');
    // Every sandbox is gone: nothing of the runtime state is left to take up.
    await rm(this.runDir, { force: true });
    await rm(this.hostRun, { recursive: true, force: true });
  }
}

/**
 * The node's runtime directory on the host's /dev/shm (a tmpfs in every mount namespace), named
 * from the node's directory: two nodes of one host never share one, and a restart finds its own.
 */
function hostRunDir(nodeDir: string): string {
  const key = createHash('sha256').update(resolve(nodeDir)).digest('hex').slice(0, 16);
  return join(process.env.PADDOCK_RUN_DIR ?? '/dev/shm/paddock-run', key);
}

/** What a restarted node needs to take a running sandbox up again (`<bundle>/adopt.json`). */
interface AdoptRecord {
  v: 1;
  spec: SandboxSpec;
  pid: number;
  /** Its init's start time (procStat): a pid the host has since given to another process does not match. */
  start: string;
  ids: IdRange;
  pins?: number[];
  env: Record<string, string>;
  idle: boolean;
  cwd: string;
  process: Record<string, unknown>;
  image: ImageManifest;
  /** The egress policy it has now (setNetwork). */
  network?: NetworkPolicy;
}

function readAdoptRecord(dir: string): AdoptRecord | undefined {
  try {
    const rec = JSON.parse(readFileSync(join(dir, 'adopt.json'), 'utf8')) as AdoptRecord;
    return rec.v === 1 && Number.isInteger(rec.pid) && rec.pid > 1 && typeof rec.start === 'string' && rec.start !== '' ? rec : undefined;
  } catch {
    return undefined;
  }
}

/** The fd at which a sandbox's init holds its disk (spawner.c pass_disk). */
const INIT_DISK_FD = 4;

/** How often the inits of taken-up sandboxes are looked at (a read of /proc/<pid>/stat each). */
const ADOPTED_WATCH_MS = 1000;

const INIT_SOURCE = sourceFile('runtime/container/init.c');
const PORTFWD_SOURCE = sourceFile('runtime/container/portfwd.c');
/** Input a process has not read yet that the node holds for it at most; past it `write` is BUSY. */
const STDIN_QUEUE_MAX = 1024 * 1024;

/**
 * Image inits that only keep a container alive: the sandbox init does that by itself, so they are
 * not started (one process less per idle sandbox).
 */
const IDLE_INITS: readonly string[][] = [BUSYBOX_INIT, ['/bin/sleep', 'infinity'], ['sleep', 'infinity']];

function isIdleInit(init: string[]): boolean {
  const s = JSON.stringify(init);
  return IDLE_INITS.some((idle) => JSON.stringify(idle) === s);
}

interface SandboxProc {
  env: Record<string, string>;
  idle: boolean;
  cwd: string;
  /** The OCI config's `process`, which every exec's process file starts from. */
  process: Record<string, unknown>;
  pid?: number;
  /** Its root directory, open (holdRoot). */
  root?: number;
  /** Why its init ended by itself (initEnded), when it did. */
  ended?: string;
  /** The image its root is composed of. */
  image: ImageManifest;
  /** Its writable layer's disk, held open by the spawner (snapshots read the upper dir through it). */
  disk?: { pid: number; fd: number };
  /** Taken up from a previous run of the node (recover). */
  adopted?: boolean;
}


interface CpuQuota {
  quota: number;
  period: number;
}

/**
 * Takes the CPU quota out of an OCI config, to be written once the container runs. crun's own setup
 * of the container (namespaces, the copy of the node's mount table, pivot_root, seccomp, the exec of
 * init) runs inside the sandbox's cgroup and costs a few ms of CPU, more as the node's mount table
 * grows; under a small quota (cpu 0.01 = 1 ms per 100 ms period) the kernel throttles it over many
 * periods — measured here: every period of a starting 0.01-CPU container throttled, `crun run`
 * 375 ms instead of ~20 ms, and worse with every sandbox on the node. No code of the sandbox's user
 * runs before create returns, and by then the quota is in place.
 *
 * The period goes too when it is the kernel's default, which a new cgroup has already: every write
 * of a CFS bandwidth setting walks every task group on the host (__cfs_schedulable), and at 3,200
 * live sandboxes crun's write of the period was ~3% of its CPU per create.
 */
function deferCpuQuota(config: Record<string, unknown>): CpuQuota | undefined {
  const cpu = (config.linux as { resources?: { cpu?: { quota?: number; period?: number } } } | undefined)?.resources?.cpu;
  if (cpu?.quota === undefined || cpu.period === undefined) return undefined;
  const q = { quota: cpu.quota, period: cpu.period };
  delete cpu.quota;
  if (cpu.period === DEFAULT_CFS_PERIOD_US) delete cpu.period;
  return q;
}

/** Per-sandbox limits of its user namespace (/proc/sys/user). */
const ENOSPC = osConstants.errno.ENOSPC;
const ENOMEM = osConstants.errno.ENOMEM;

/** How long destroy waits for a sandbox's tasks to leave its cgroups (thousands of processes take a moment to die). */
const DESTROY_WAIT_MS = 30_000;

/** SIGKILLs every task listed in a cgroup directory (cgroup.procs: processes, in any hierarchy); whether it listed any. */
async function killAll(dir: string): Promise<boolean> {
  const procs = readText(join(dir, 'cgroup.procs')) ?? '';
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
  return procs.trim() !== '';
}

