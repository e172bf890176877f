/**
 * The node's side of spawner.c: runs the commands a node starts per sandbox and per exec
 * (`crun run`, `crun exec`, `crun delete`) through a small long-lived process instead of forking
 * the node for each (why: spawner.c). Started lazily and again after it dies; a death fails only
 * the commands in flight.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { accessSync, constants, statSync } from 'node:fs';
import { isAbsolute, join, resolve } from 'node:path';
import { ProtocolError } from '../protocol/index.ts';
import { sourceFile } from './source.ts';
import { buildStaticBinary } from './static-binary.ts';

/** What one request may hold (spawner.c FRAME_MAX and its string table). */
const MAX_FRAME_BYTES = 1 << 20;
const EMPTY = Buffer.alloc(0);
const MAX_FIELDS = 8000;

export const SPAWNER_SOURCE = sourceFile('runtime/spawner.c');

/** The sandbox's own mount namespace, with its writable layer and overlay root (hardening.ts ownMounts). */
export interface MountPlan {
  /** Where the tmpfs of the writable layer goes (created); overlay's upper and work dirs go in it. */
  disk: string;
  /** tmpfs options (size, inodes, mode). */
  tmpfsOptions: string;
  /** Owner of the upper dir, which is the sandbox's `/`: the first host id of the sandbox's range. */
  rootUid: number;
  /**
   * Ids in the sandbox's range; with more than 0 the spawner makes the sandbox's user namespace,
   * owned by rootUid, at `<disk>/userns` (spawner.c sandbox_userns), and root-owned files of
   * `layers` show as owned by rootUid + their id.
   */
  idCount: number;
  /** RLIMIT_MSGQUEUE and RLIMIT_SIGPENDING of the namespace's maker: they bound all of the sandbox's uids together (0: the node's own). */
  msgqueueBytes: number;
  sigpending: number;
  /** The namespace's /proc/sys/user limits, set by its maker before crun joins it: `name=value,…` ("" none). */
  ucounts: string;
  /** Read-only layers (top first), each seen at `<disk>/l<i>` through an idmapped clone; overlayOptions name them so. */
  layers: string[];
  overlayOptions: string;
  rootfs: string;
}

export interface SpawnRequest {
  argv: string[];
  /** The command's environment; the node's when absent. */
  env?: Record<string, string>;
  /** A file for stdin; /dev/null when absent. */
  stdinFile?: string;
  /** Files for stdout and stderr (created or truncated); /dev/null when absent. */
  stdoutFile?: string;
  stderrFile?: string;
  /** Collect stderr (at most 64 KiB) into the result instead of a file. */
  captureStderr?: boolean;
  /** Hand stdout and stderr to this as they come, instead of to files. */
  onOutput?: (stream: 'out' | 'err', chunk: Buffer) => void;
  /** Run under SCHED_IDLE (children inherit it). */
  idle?: boolean;
  /**
   * Run at oom_score_adj 500 (children inherit it): a sandbox's execs, so that in its memory cgroup
   * the OOM killer picks one of them before its init, which stays at 0 (crun exec ignores the
   * process file's oomScoreAdj, and only raising needs no privilege).
   */
  oomFirst?: boolean;
  /** Hand the command the fd the spawner was started with as fd 3. */
  passFd3?: boolean;
  mounts?: MountPlan;
  /** SIGKILL after this long (ms). */
  timeoutMs?: number;
}

export interface SpawnResult {
  /** Exit code, or 128 + signal. */
  code: number;
  /**
   * With `mounts`: the sandbox's disk (writable layer), held open by the spawner, readable as
   * /proc/<spawner pid>/fd/<fd> until `releaseDisk`. Absent when the spawner could not take it.
   */
  disk?: { pid: number; fd: number };
  /** Captured stderr (captureStderr), else empty. */
  stderr: string;
}

/** A command started through the spawner. */
export interface Spawned {
  /** Its end. Rejects (BACKEND_FAILED) only when it never ran: its setup, exec or fork failed. */
  exited: Promise<SpawnResult>;
  /** With onOutput: once both of its output pipes are closed (background children may hold them past its exit). */
  closed: Promise<void>;
  kill(signal?: number): void;
  /** Stops relaying its output (after its exit; a background child's output is dropped). */
  release(): void;
  /**
   * With onOutput: stops reading its output, or starts again. While held its pipes fill and the
   * command blocks on its next write: the node's flow control, one command at a time.
   */
  holdOutput(on: boolean): void;
}

export interface SpawnerOptions {
  /** An open fd the spawner keeps and passes on as fd 3 when asked (the sandbox init). */
  fd3?: number;
  /**
   * An absolute path (crun) the spawner runs from a sealed in-memory copy taken at its start
   * (spawner.c: it spares crun its own copy on every run). Requests name it by this path.
   */
  seal?: string;
  /**
   * A process that was none of its commands ended: an orphan it adopted as subreaper (a sandbox's
   * init, once `crun run -d` has exited). `code` is its exit code or 128 + signal.
   */
  onOrphanExit?: (pid: number, code: number) => void;
}

/** The absolute path of `program` along PATH (as execvp would find it), or undefined. */
export function resolveProgram(program: string, path = process.env.PATH ?? '/usr/bin:/bin'): string | undefined {
  if (program.includes('/')) return isAbsolute(program) ? program : resolve(program);
  for (const dir of path.split(':')) {
    const p = join(dir || '.', program);
    try {
      accessSync(p, constants.X_OK);
      if (statSync(p).isFile()) return isAbsolute(p) ? p : resolve(p);
    } catch {
      // not here
    }
  }
  return undefined;
}

interface Pending {
  resolve: (r: SpawnResult) => void;
  reject: (e: Error) => void;
  closed: () => void;
  onOutput?: SpawnRequest['onOutput'];
  timer?: NodeJS.Timeout;
  exited: boolean;
  disk?: { pid: number; fd: number };
}

/**
 * The spawner's messages to the node: "<seq> <type> <code> <length>\n" then <length> bytes
 * (spawner.c), cut from its stdout however the reads fall. A body is copied once, into a buffer of
 * its own: most span two reads (reads are 64 KiB, as are the spawner's output messages), and
 * joining each read to what was left of the last made a 128 KiB buffer per read, copied again for
 * the output. Per streamed MiB that was ~7 MiB of short-lived ArrayBuffers in the node.
 */
export class Frames {
  /** A header read so far (no newline yet), and a body being filled across reads. */
  private head: Buffer = EMPTY;
  private body: { head: string; into: Buffer; filled: number } | undefined;

  constructor(private readonly onMessage: (head: string, body: Buffer) => void) {}

  feed(d: Buffer): void {
    let at = 0;
    while (at < d.length) {
      const body = this.body;
      if (body) {
        const n = Math.min(body.into.length - body.filled, d.length - at);
        d.copy(body.into, body.filled, at, at + n);
        body.filled += n;
        at += n;
        if (body.filled < body.into.length) return;
        this.body = undefined;
        this.onMessage(body.head, body.into);
        continue;
      }
      const nl = d.indexOf(10, at);
      if (nl < 0) {
        this.head = Buffer.concat([this.head, d.subarray(at)]);
        return;
      }
      const head = (this.head.length ? Buffer.concat([this.head, d.subarray(at, nl)]) : d.subarray(at, nl)).toString();
      this.head = EMPTY;
      at = nl + 1;
      // The spawner is Paddock's own: a length that is not one reads as an empty body, as before.
      const len = Math.max(0, Number(head.split(' ')[3]) || 0);
      if (d.length - at >= len) {
        this.onMessage(head, Buffer.from(d.subarray(at, at + len)));
        at += len;
      } else {
        this.body = { head, into: Buffer.allocUnsafe(len), filled: 0 };
      }
    }
  }
}

export class Spawner {
  private proc?: ChildProcess;
  private readonly pending = new Map<number, Pending>();
  private seq = 0;

  private constructor(
    private readonly binary: string,
    private readonly o: SpawnerOptions,
  ) {}

  /** Builds the spawner (static-binary.ts) into `binDir`; it starts on first use. */
  static async build(binDir: string, o: SpawnerOptions = {}): Promise<Spawner> {
    return new Spawner(await buildStaticBinary(SPAWNER_SOURCE, binDir, 'spawner', 'The process spawner'), o);
  }

  /** Runs a command to its end. */
  run(req: SpawnRequest): Promise<SpawnResult> {
    return this.start(req).exited;
  }

  start(req: SpawnRequest): Spawned {
    const seq = ++this.seq;
    const flags = `${req.oomFirst ? 'o' : ''}${req.idle ? 'i' : ''}${req.passFd3 ? '3' : ''}${req.mounts ? 'm' : ''}${req.captureStderr ? 'c' : ''}${req.onOutput ? 'p' : ''}-`;
    const m = req.mounts;
    const env = req.env ? Object.entries(req.env).map(([k, v]) => `${k}=${v}`) : [];
    const fields = [String(seq), 'run', flags, req.stdinFile ?? '', req.stdoutFile ?? '', req.stderrFile ?? '', ...(m ? [m.disk, m.tmpfsOptions, String(m.rootUid), m.overlayOptions, m.rootfs, String(m.idCount), String(m.msgqueueBytes), String(m.sigpending), m.ucounts, String(m.layers.length), ...m.layers] : []), String(req.argv.length), ...req.argv, String(env.length), ...env];
    let closed!: () => void;
    const closedP = new Promise<void>((r) => {
      closed = r;
    });
    const exited = new Promise<SpawnResult>((resolve, reject) => {
      if (fields.some((f) => f.includes('\0'))) {
        reject(new ProtocolError('BACKEND_FAILED', `spawn ${req.argv[0]}: an argument holds a NUL byte`));
        closed();
        return;
      }
      if (fields.length > MAX_FIELDS || fields.reduce((n, f) => n + Buffer.byteLength(f) + 1, 0) > MAX_FRAME_BYTES) {
        reject(new ProtocolError('BACKEND_FAILED', `spawn ${req.argv[0]}: the command line is too long for the spawner (at most ${MAX_FIELDS} strings, ${MAX_FRAME_BYTES} bytes)`));
        closed();
        return;
      }
      const proc = this.process();
      const p: Pending = { resolve, reject, closed, exited: false, ...(req.onOutput ? { onOutput: req.onOutput } : {}) };
      if (req.timeoutMs !== undefined) p.timer = setTimeout(() => this.send([String(seq), 'kill', '9']), req.timeoutMs);
      if (this.pending.size === 0) this.hold(proc, true);
      this.pending.set(seq, p);
      this.send(fields);
    });
    return {
      exited,
      closed: closedP,
      kill: (signal = 9) => {
        const p = this.pending.get(seq);
        if (p && !p.exited) this.send([String(seq), 'kill', String(signal)]);
      },
      holdOutput: (on: boolean) => {
        if (this.pending.has(seq)) this.send([String(seq), on ? 'hold' : 'go']);
      },
      release: () => {
        const p = this.pending.get(seq);
        if (!p?.exited) return;
        this.send([String(seq), 'close']);
        this.settle(seq)?.closed();
      },
    };
  }

  /** Closes a disk fd a `mounts` command's result named; nothing to do if that spawner is gone. */
  releaseDisk(disk: { pid: number; fd: number }): void {
    if (this.proc?.pid === disk.pid) this.send(['0', 'release', String(disk.fd)]);
  }

  /** The spawner's pid while it runs. */
  get pid(): number | undefined {
    return this.proc?.pid;
  }

  /** Ends the spawner; commands it started go on. */
  close(): void {
    this.proc?.stdin?.end();
    this.proc = undefined;
  }

  private send(fields: string[]): void {
    const body = Buffer.from(`${fields.join('\0')}\0`);
    const head = Buffer.alloc(4);
    head.writeUInt32LE(body.length);
    this.proc?.stdin?.write(Buffer.concat([head, body]));
  }

  private process(): ChildProcess {
    if (this.proc) return this.proc;
    const stdio: ('pipe' | 'inherit' | number)[] = ['pipe', 'pipe', 'inherit'];
    const args: string[] = [];
    if (this.o.fd3 !== undefined) {
      stdio.push(this.o.fd3);
      args.push('fd3');
    }
    if (this.o.seal) args.push(`seal=${this.o.seal}`);
    const proc = spawn(this.binary, args, { stdio });
    this.proc = proc;
    const frames = new Frames((head, body) => this.message(head, body));
    proc.stdout?.on('data', (d: Buffer) => frames.feed(d));
    // A write to a spawner that just died: its exit below fails what was in flight.
    proc.stdin?.on('error', () => {});
    const gone = (why: string) => {
      if (this.proc === proc) this.proc = undefined;
      const err = new ProtocolError('BACKEND_FAILED', `the process spawner ${why}; the command's outcome is unknown`);
      for (const seq of [...this.pending.keys()]) {
        const p = this.settle(seq);
        p?.reject(err);
        p?.closed();
      }
    };
    proc.on('error', (e) => gone(`failed: ${e.message}`));
    proc.on('exit', (code, signal) => gone(`exited (${signal ?? code})`));
    this.hold(proc, false);
    return proc;
  }

  /** Keeps the event loop alive while commands are in flight, and only then: an idle spawner must not keep a process from exiting. */
  private hold(proc: ChildProcess | undefined, on: boolean): void {
    if (!proc) return;
    for (const h of [proc, proc.stdin, proc.stdout] as unknown as ({ ref?: () => void; unref?: () => void } | null)[]) {
      if (on) h?.ref?.();
      else h?.unref?.();
    }
  }

  private settle(seq: number): Pending | undefined {
    const p = this.pending.get(seq);
    if (!p) return undefined;
    this.pending.delete(seq);
    clearTimeout(p.timer);
    if (this.pending.size === 0) this.hold(this.proc, false);
    return p;
  }

  private message(head: string, body: Buffer): void {
    const [seqS, type, codeS] = head.split(' ');
    const seq = Number(seqS);
    if (seq === 0 && type === 'd') {
      this.o.onOrphanExit?.(Number(body.toString()), Number(codeS));
      return;
    }
    const p = this.pending.get(seq);
    if (!p) return;
    if (type === 'o' || type === 'E') {
      // Its own buffer (Frames): a view would keep the whole read buffer alive for as long as the output is kept.
      p.onOutput?.(type === 'o' ? 'out' : 'err', body);
      return;
    }
    if (type === 'z') {
      this.settle(seq)?.closed();
      return;
    }
    if (type === 'k') {
      if (this.proc?.pid !== undefined) p.disk = { pid: this.proc.pid, fd: Number(codeS) };
      return;
    }
    p.exited = true;
    clearTimeout(p.timer);
    // A relayed command's output may go on after its exit: its entry stays until z or release.
    if (!p.onOutput) {
      this.settle(seq);
      p.closed();
    }
    if (type === 'e') {
      // It never ran: a disk it sent before its setup failed is nobody's.
      if (p.disk) this.releaseDisk(p.disk);
      p.reject(new ProtocolError('BACKEND_FAILED', body.toString().trim()));
    }
    else p.resolve({ code: Number(codeS), stderr: body.toString(), ...(p.disk ? { disk: p.disk } : {}) });
  }
}
