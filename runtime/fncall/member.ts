/**
 * One warm pool member: a container sandbox made by ContainerBackend (so it has the isolation of
 * every sandbox: user namespace, seccomp, dropped capabilities, cgroups, no network), with a
 * read-only root, and a runner beside its init that forks each program.
 *
 * Why a reused container with a runner, and not a container or a `crun exec` per call — measured
 * on this 2-core VM, CPU time per python3 -c 'print(1)', which alone costs ~10 ms:
 *   - a fresh container sandbox per call (create, exec, kill): 52–66 ms in all (ops/bench/fncall.ts)
 *     — crun run and delete, overlay and tmpfs mounts, cgroups, every time;
 *   - `crun exec` per call into a warm container: +5 ms (perf stat: crun links and re-executes
 *     itself, joins seven namespaces, loads the seccomp filter) — 0.6× the floor's throughput at
 *     best, under the 0.7× target before Paddock does anything else;
 *   - a fork + exec by a runner already inside every namespace: +0.05 ms over the same exec on the
 *     host (/bin/true: 0.62 ms against 0.58 ms). FnCall's whole cost is then ~13–15 ms: the node,
 *     NATS and the SDK ~2 ms, and ~2 ms of slower path lookups through the overlay of idmapped
 *     EROFS layers (python's start makes hundreds; stat is 2.8 µs there against 1.3 µs on the host).
 * Between calls the member is made fresh again: every process but init and the runner is killed
 * (freeze → SIGKILL → thaw on the cgroup, so a fork bomb cannot outrun it) and the writable
 * directories are emptied. Programs run as an unprivileged uid with no capabilities, so they can
 * neither signal nor trace the runner (root in the sandbox) nor write anywhere but those
 * directories; SysV IPC and POSIX message queues are switched off (sysctls of the sandbox's IPC
 * namespace), so nothing outlives a call there either.
 *
 * Host layout: <fnDir>/<id>/ is a tmpfs (bounded) holding box/ (the code, read-only inside at
 * /box), work/ (/work, the working directory), tmp/ (/tmp) and shm/ (/dev/shm).
 *
 * The per-call file work (the code, the caller's files, emptying the directories, reading and
 * writing cgroup files) is done with synchronous calls on purpose: it all happens on tmpfs,
 * cgroupfs and procfs, where a call costs microseconds, while each fs/promises call is several
 * thread-pool round trips (readFile alone is open, fstat, read, close) — measured at ~40% of the
 * node's CPU per invocation before the change.
 */
import { randomBytes } from 'node:crypto';
import { chmodSync, chownSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { mkdir, rm, rmdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { Limits, ProtocolError, validateSpec } from '../../protocol/index.ts';
import { type CgroupMode, cgroupDir, mounts } from '../cgroups.ts';
import type { ContainerBackend } from '../container/backend.ts';
import { CgroupSleep } from '../container/sleep.ts';
import { counter } from '../container/verdict.ts';
import type { ImageManifest } from '../images/store.ts';
import { run } from '../proc.ts';
import { BOX, WORK } from './languages.ts';
import { Runner, type RunnerAnswer, waitStatus } from './runner.ts';

/** Programs run as this uid and gid inside the sandbox (no such user needs to exist in the image). */
export const PROGRAM_ID = 1000;
const MiB = 1024 * 1024;
/**
 * Added to a call's memory limit on the member's cgroup: the runtime's own page cache (python's
 * modules, cc1) is charged there too, and a program at its limit must not be starved by it. The
 * verdict still holds the program to its limit: peak RSS above it is MEMORY_LIMIT.
 */
const MEMORY_HEADROOM_MIB = 48;
/** How often a running program's CPU time and pids counter are looked at (short programs never are). */
const CHECK_MS = 100;
/** After the node kills a program, how long the runner may take to report it. */
const KILL_GRACE_MS = 5000;

export interface MemberOptions {
  backend: ContainerBackend;
  /** The runner binary on the host (runner.ts buildRunner). */
  runner: string;
  /** Parent of the members' scratch directories. */
  dir: string;
  /** Size of the member's scratch tmpfs: what a program may write to /work, /tmp and /dev/shm together. */
  diskMiB: number;
  pidsLimit: number;
  onRunnerExit: (m: Member, why: string) => void;
}

export interface RunLimits {
  timeMs: number;
  wallMs: number;
  memoryMiB: number;
  outputBytes: number;
}

export interface RunSpec {
  argv: string[];
  env: Record<string, string>;
  stdin: Uint8Array;
  limits: RunLimits;
}

/** What happened to one program: the runner's report and the limit the node enforced, if any. */
export interface RunOutcome {
  exitCode: number;
  signal?: number;
  stdout: Buffer;
  stderr: Buffer;
  cpuMs: number;
  wallMs: number;
  maxRssBytes: number;
  /** The limit that ended or condemned it, as seen by the node. */
  limit?: 'time' | 'memory' | 'output' | 'pids';
  /**
   * For a time limit, which clock ran out, as the node saw it. The runner's own wall time starts
   * later than the node's (it forks the program after the job arrives), so it cannot tell.
   */
  timeBy?: 'cpu' | 'wall';
  /** The program could not be started: errno of its execve (ENOENT: no such program). */
  execErrno?: number;
}

interface Counters {
  cpuNs: number;
  pidsMax: number;
  oomKills: number;
}

export class Member {
  readonly id: string;
  uses = 0;
  /** When it went idle (the pool trims idle members above its warm size). */
  idleSince = Date.now();
  private runner?: Runner;
  private initPid = 0;
  private readonly scratch: string;
  /** Host ids of its root and of its programs' user: the member's own range (runtime/ids.ts). */
  private hostRoot = -1;
  private hostProgram = -1;
  private readonly sleeper: CgroupSleep;
  private readonly cgroup: string;
  private readonly mode: CgroupMode;
  private base: Counters = { cpuNs: 0, pidsMax: 0, oomKills: 0 };
  private memoryBytes = 0;
  /** Tasks of the member at rest: its init (and whatever the image's init keeps) and the runner. */
  private restTasks = 2;
  /** Its processes at rest, which resets spare. */
  private keep = new Set<number>();
  private destroyed: boolean = false;
  private destroying?: Promise<void>;

  private constructor(
    private readonly o: MemberOptions,
    readonly image: string,
    readonly manifest: ImageManifest,
  ) {
    this.id = `fn-${image.replace(/[^a-z0-9]/g, '').slice(0, 24)}-${randomBytes(6).toString('hex')}`;
    this.scratch = join(o.dir, this.id);
    this.mode = o.backend.cgroupMode;
    this.cgroup = o.backend.cgroupPath(this.id);
    this.sleeper = new CgroupSleep(this.mode);
  }

  /** Makes a member: scratch tmpfs, container, runner. All or nothing. */
  static async create(o: MemberOptions, image: string, manifest: ImageManifest): Promise<Member> {
    const m = new Member(o, image, manifest);
    try {
      await m.setUp();
      return m;
    } catch (e) {
      await m.destroy().catch(() => {});
      throw e instanceof ProtocolError ? e : new ProtocolError('BACKEND_FAILED', `FnCall member for ${image}: ${(e as Error).message}`, { cause: e });
    }
  }

  private async setUp(): Promise<void> {
    const s = this.scratch;
    await mkdir(s, { recursive: true });
    const inodes = Math.max(4096, this.o.diskMiB * 64);
    await run('mount', ['-t', 'tmpfs', '-o', `size=${this.o.diskMiB}m,nr_inodes=${inodes},mode=0711,nosuid,nodev`, 'paddock-fn', s]);
    for (const d of ['box', 'work', 'tmp', 'shm']) await mkdir(join(s, d));
    this.hostRoot = (await this.o.backend.idsFor(this.id)).hostId;
    this.hostProgram = this.hostRoot + PROGRAM_ID;
    this.fixDirs(true);
    const spec = validateSpec({ image: this.image, cpu: 1, memoryMiB: Limits.fn.memoryMiB.max + MEMORY_HEADROOM_MIB, pidsLimit: this.o.pidsLimit, diskMiB: 16, ttlSec: Limits.ttlSec.max });
    await this.o.backend.create(this.id, spec, { image: this.manifest, oci: (c) => this.amend(c) });
    this.memoryBytes = spec.memoryMiB * MiB;
    const { crun, root } = this.o.backend.crunState;
    const st = await run(crun, ['--root', root, 'state', this.id]);
    this.initPid = (JSON.parse(st.stdout) as { pid?: number }).pid ?? 0;
    this.runner = await Runner.start({ crun, crunRoot: root, id: this.id, binary: this.o.runner, pidFile: join(s, 'runner.pid') }, (why) => this.o.onRunnerExit(this, why));
    if (this.mode === 'v2') await writeFile(this.file('memory', 'memory.swap.max'), '0').catch(() => {});
    this.restTasks = this.tasks();
    this.keep = new Set([this.initPid, this.runner.pid, ...this.procs()]);
    this.base = this.counters();
  }

  /** The member's OCI config on top of a sandbox's: read-only root, its own writable places, no IPC. */
  private amend(c: Record<string, unknown>): void {
    (c.root as { readonly: boolean }).readonly = true;
    const bind = (destination: string, sub: string, ro: boolean) => ({ destination, type: 'bind', source: join(this.scratch, sub), options: ['rbind', ro ? 'ro' : 'rw', 'nosuid', 'nodev'] });
    const mounts = (c.mounts as Array<{ destination: string }>).filter((m) => m.destination !== '/dev/shm');
    mounts.push(bind(BOX, 'box', true), bind(WORK, 'work', false), bind('/tmp', 'tmp', false), bind('/dev/shm', 'shm', false));
    c.mounts = mounts;
    const linux = c.linux as Record<string, unknown>;
    // Objects in an IPC namespace outlive the processes that made them: allow none.
    linux.sysctl = { ...(linux.sysctl as object | undefined), 'kernel.shmmni': '0', 'kernel.msgmni': '0', 'kernel.sem': '0 0 0 0', 'fs.mqueue.queues_max': '0' };
    // Not pinned to one CPU (the CFS quota of one core stays): a member runs one short program
    // after another, and pinned it waits for its CPU while another is free. Measured on this
    // 2-core VM with other work running: python print(1) throughput 0.67–0.79× the floor pinned,
    // 0.82–0.99× unpinned.
    const cpu = (linux.resources as { cpu?: { cpus?: string } } | undefined)?.cpu;
    if (cpu) delete cpu.cpus;
  }

  /** Owners and modes of the scratch directories (a program owns /work and could chmod it). */
  private fixDirs(all: boolean): void {
    const s = this.scratch;
    chownSync(join(s, 'work'), this.hostProgram, this.hostProgram);
    chmodSync(join(s, 'work'), 0o755);
    if (!all) return;
    for (const d of ['box', 'tmp', 'shm']) chownSync(join(s, d), this.hostRoot, this.hostRoot);
    chmodSync(join(s, 'box'), 0o755);
    chmodSync(join(s, 'tmp'), 0o1777);
    chmodSync(join(s, 'shm'), 0o1777);
  }

  private file(ctrl: string, name: string): string {
    return join(cgroupDir(this.mode, this.cgroup, this.mode === 'v2' ? '' : ctrl), name);
  }

  private cpuNs(): number {
    if (this.mode === 'v2') return counter(readFileSync(this.file('cpu', 'cpu.stat'), 'utf8'), 'usage_usec') * 1000;
    return Number(readFileSync(this.file('cpuacct', 'cpuacct.usage'), 'utf8').trim());
  }

  private pidsMax(): number {
    return counter(readOr(this.file('pids', 'pids.events')), 'max');
  }

  /** Tasks the pids controller counts, zombies included. */
  private tasks(): number {
    return Number(readOr(this.file('pids', 'pids.current')).trim() || 0);
  }

  private oomKills(): number {
    return counter(readOr(this.mode === 'v2' ? this.file('memory', 'memory.events') : this.file('memory', 'memory.oom_control')), 'oom_kill');
  }

  private counters(): Counters {
    return { cpuNs: this.cpuNs(), pidsMax: this.pidsMax(), oomKills: this.oomKills() };
  }

  /** The cgroup's memory limit for the next program (swap included where the kernel counts it). */
  private setMemory(mib: number): void {
    const bytes = (mib + MEMORY_HEADROOM_MIB) * MiB;
    if (bytes === this.memoryBytes) return;
    if (this.mode === 'v2') {
      writeFileSync(this.file('memory', 'memory.max'), String(bytes));
    } else {
      const mem = this.file('memory', 'memory.limit_in_bytes');
      const sw = this.file('memory', 'memory.memsw.limit_in_bytes');
      const writeSw = () => {
        try {
          writeFileSync(sw, String(bytes));
        } catch (e) {
          // No swap accounting on this kernel: nothing to keep in step.
          if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
        }
      };
      // memsw may never be below the memory limit: raise it first, lower it last.
      if (bytes > this.memoryBytes) {
        writeSw();
        writeFileSync(mem, String(bytes));
      } else {
        writeFileSync(mem, String(bytes));
        writeSw();
      }
    }
    this.memoryBytes = bytes;
  }

  /** Puts the code (and, after a compile, the binary) in /box, read-only to the program. */
  putBox(name: string, data: Uint8Array, mode = 0o644): void {
    writeFileSync(join(this.scratch, 'box', name), data, { mode });
  }

  /** Moves what the compiler left in /work into /box. */
  promote(name: string): boolean {
    const from = join(this.scratch, 'work', name);
    const to = join(this.scratch, 'box', name);
    try {
      renameSync(from, to);
    } catch {
      return false;
    }
    chownSync(to, 0, 0);
    chmodSync(to, 0o755);
    return true;
  }

  /** Writes the caller's files into /work, owned by the program's user. */
  putWork(files: Array<{ path: string; data: Uint8Array }>): void {
    const work = join(this.scratch, 'work');
    for (const f of files) {
      const target = join(work, f.path);
      const parent = dirname(target);
      const made = parent === work ? undefined : mkdirSync(parent, { recursive: true });
      // The directories mkdir made (from `made` down to `parent`) belong to the program too.
      if (made) for (let d = parent; d.startsWith(made); d = dirname(d)) chownSync(d, this.hostProgram, this.hostProgram);
      writeFileSync(target, f.data, { mode: 0o644 });
      chownSync(target, this.hostProgram, this.hostProgram);
    }
  }

  /** Runs one program to its end, or until a limit ends it. The member must be reset before the next. */
  async run(spec: RunSpec): Promise<RunOutcome> {
    const runner = this.runner;
    if (!runner || runner.exited) throw new ProtocolError('BACKEND_FAILED', `FnCall member ${this.id} has no runner`);
    const lim = spec.limits;
    this.setMemory(lim.memoryMiB);
    this.uses++;
    const started = performance.now();
    let limit: RunOutcome['limit'];
    let timeBy: RunOutcome['timeBy'];
    let timer: NodeJS.Timeout | undefined;
    let grace: NodeJS.Timeout | undefined;
    let finished = false;
    const answer = runner.run({
      argv: spec.argv,
      env: Object.entries(spec.env).map(([k, v]) => `${k}=${v}`),
      cwd: WORK,
      stdin: spec.stdin,
      outputBytes: lim.outputBytes,
      uid: PROGRAM_ID,
      gid: PROGRAM_ID,
      cpuSec: Math.ceil(lim.timeMs / 1000) + 1,
      nofile: 1024,
      // Deep recursion is normal in judged code: the stack may use the whole memory limit.
      stackMiB: lim.memoryMiB,
    });
    const stopped = new Promise<never>((_, reject) => {
      const kill = async (why: NonNullable<RunOutcome['limit']>) => {
        limit ??= why;
        await this.killPrograms();
        if (finished) return;
        grace = setTimeout(() => reject(new ProtocolError('BACKEND_FAILED', `FnCall member ${this.id}: the program did not end after it was killed`)), KILL_GRACE_MS);
      };
      const check = async () => {
        if (finished) return;
        const elapsed = performance.now() - started;
        const cpuNs = this.cpuNs();
        const pidsMax = this.pidsMax();
        const cpuMs = (cpuNs - this.base.cpuNs) / 1e6;
        if (cpuMs >= lim.timeMs || elapsed >= lim.wallMs) {
          timeBy ??= cpuMs >= lim.timeMs ? 'cpu' : 'wall';
          return kill('time');
        }
        // A fork bomb never ends by itself: end it when it first hits the pids limit.
        if (pidsMax > this.base.pidsMax) return kill('pids');
        timer = setTimeout(tick, Math.max(5, Math.min(CHECK_MS, lim.timeMs - cpuMs, lim.wallMs - elapsed)));
      };
      const tick = () => {
        check().catch((e: unknown) => {
          if (!finished) reject(e);
        });
      };
      timer = setTimeout(tick, Math.max(1, Math.min(CHECK_MS, lim.timeMs, lim.wallMs)));
    });
    let a: RunnerAnswer;
    try {
      a = await Promise.race([answer, stopped]);
    } finally {
      finished = true;
      clearTimeout(timer);
      clearTimeout(grace);
    }
    const st = waitStatus(a.status);
    const o: RunOutcome = {
      exitCode: st.exitCode,
      stdout: a.stdout,
      stderr: a.stderr,
      cpuMs: a.cpuUs / 1000,
      wallMs: a.wallUs / 1000,
      maxRssBytes: a.maxRssKiB * 1024,
    };
    if (st.signal !== undefined) o.signal = st.signal;
    if (a.execErrno !== undefined) o.execErrno = a.execErrno;
    if (a.truncated) limit ??= 'output';
    // The memory cgroup kills with SIGKILL; a program that failed some other way may have lost a child to it.
    if (st.exitCode !== 0 && this.oomKills() > this.base.oomKills) limit = 'memory';
    if (o.maxRssBytes > lim.memoryMiB * MiB) limit = 'memory';
    if (limit === undefined && (o.cpuMs > lim.timeMs || o.wallMs > lim.wallMs)) {
      limit = 'time';
      timeBy = o.cpuMs > lim.timeMs ? 'cpu' : 'wall';
    }
    if (limit) o.limit = limit;
    if (limit === 'time' && timeBy) o.timeBy = timeBy;
    return o;
  }

  /** Host pids in the member's cgroup other than those it had at rest (init, runner). */
  private procs(): number[] {
    return readFileSync(this.file('pids', 'cgroup.procs'), 'utf8')
      .split('\n')
      .map((l) => Number.parseInt(l, 10))
      .filter((p) => p > 1);
  }

  private strays(): number[] {
    return this.procs().filter((p) => !this.keep.has(p));
  }

  /** Kills every process but init and the runner: frozen first, so nothing forks in between. */
  private async killPrograms(): Promise<void> {
    await this.sleeper.freeze(this.cgroup);
    try {
      for (const pid of this.strays()) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
    } finally {
      await this.sleeper.thaw(this.cgroup);
    }
  }

  /**
   * Makes the member fresh for the next program: no process of the last one left, empty /work,
   * /tmp and /dev/shm (and /box unless `keepBox`: the tests of one invocation share their code).
   */
  async reset(keepBox = false): Promise<void> {
    for (let i = 0, wait = 1; ; i++, wait = Math.min(wait * 2, 50)) {
      const strays = this.strays();
      // Killed processes leave zombies until the runner (their subreaper) reaps them, and
      // zombies still count against the pids limit: wait for the count, not just the list.
      const tasks = this.tasks();
      if (strays.length === 0 && tasks <= this.restTasks) break;
      if (i >= 60) throw new ProtocolError('BACKEND_FAILED', `FnCall member ${this.id}: ${strays.length} processes survive SIGKILL, ${tasks} tasks counted`);
      if (strays.length > 0) await this.killPrograms();
      await new Promise((r) => setTimeout(r, wait));
    }
    for (const d of keepBox ? ['work', 'tmp', 'shm'] : ['box', 'work', 'tmp', 'shm']) empty(join(this.scratch, d));
    this.fixDirs(false);
    this.base = this.counters();
  }

  get alive(): boolean {
    return !this.destroyed && !!this.runner && !this.runner.exited;
  }

  /** Removes everything: runner, container (its processes, mounts, cgroups), scratch tmpfs. Idempotent. */
  destroy(): Promise<void> {
    this.destroying ??= this.teardown();
    return this.destroying;
  }

  private async teardown(): Promise<void> {
    this.destroyed = true;
    this.runner?.stop();
    await this.o.backend.destroy(this.id);
    if (mounts().some((m) => m.target === this.scratch)) {
      const u = await run('umount', [this.scratch], { allowFail: true });
      if (u.code !== 0) await run('umount', ['-l', this.scratch]);
    }
    await rmdir(this.scratch).catch(() => rm(this.scratch, { recursive: true, force: true }));
  }
}

/** Removes everything inside `dir` (not following symlinks; host root passes any mode). */
function empty(dir: string): void {
  for (const n of readdirSync(dir)) rmSync(join(dir, n), { recursive: true, force: true });
}

function readOr(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}
