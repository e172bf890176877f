/**
 * The simulated backend: sandboxes with virtual CPU, memory and disk, no processes. Each verb
 * waits a configurable latency and does its bookkeeping; exec interprets a small script
 * (script.ts); files live in memory (files.ts). It serves the backend contract test and scale
 * runs of hundreds of nodes against real NATS, so a sandbox is a few small fields until its files
 * are first written.
 *
 * A crash leaves nothing behind but the journal of the sandboxes that were live
 * (<nodeDir>/sim/live.journal, a line `+<id>` per create and `-<id>` per destroy): recover()
 * reports the ids still live in it and empties it, as a real backend reports the leftovers it
 * cleaned up. One line appended to an open file, not a marker file per sandbox: creating and
 * removing a file each was 13% of a simulated fleet's CPU in a burst of creates (ops/bench/scale.ts).
 */
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, rmSync, truncateSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { Limits, ProtocolError, type SandboxSpec, type SandboxStats } from '../../protocol/index.ts';
import type { Backend, ExecOptions, ExecOutcome, HibernateOutcome, SandboxFiles, Snapshotting } from '../backend.ts';
import { MemoryFiles } from './files.ts';
import { runScript } from './script.ts';

export const SimVerbs = ['create', 'exec', 'files', 'pause', 'resume', 'hibernate', 'restore', 'destroy', 'fork'] as const;
export type SimVerb = (typeof SimVerbs)[number];

const JOURNAL = 'live.journal';

export interface SimOptions {
  nodeDir: string;
  /** Milliseconds each verb takes (absent: no wait at all). */
  latencyMs?: Partial<Record<SimVerb, number>>;
  /** Resident memory of a fresh sandbox, as a share of its `memoryMiB` (stats, hibernate). */
  residentShare?: number;
}

interface SimSandbox {
  state: 'running' | 'paused' | 'hibernated';
  memoryMiB: number;
  diskBytes: number;
  env: Record<string, string>;
  cwd: string;
  /** Made on the first file call or write. */
  files?: MemoryFiles;
  /** Simulated CPU seconds: what its execs slept. */
  cpuSec: number;
}

/** `create=15,exec=1` → { create: 15, exec: 1 }. */
export function parseLatencies(v: string | undefined): Partial<Record<SimVerb, number>> {
  const out: Partial<Record<SimVerb, number>> = {};
  for (const part of (v ?? '').split(',').map((s) => s.trim()).filter(Boolean)) {
    const m = /^([a-z]+)=(\d+(?:\.\d+)?)$/.exec(part);
    if (!m || !(SimVerbs as readonly string[]).includes(m[1] as string)) throw new Error(`PADDOCK_SIM_LATENCY_MS=${v}: expected verb=ms pairs of ${SimVerbs.join(', ')}`);
    out[m[1] as SimVerb] = Number(m[2]);
  }
  return out;
}

export class SimBackend implements Backend, Snapshotting {
  readonly kind = 'sim' as const;
  private readonly boxes = new Map<string, SimSandbox>();
  private readonly snapshots = new Map<string, SimSandbox>();
  private readonly markers: string;
  private readonly journal: string;
  private fd: number | undefined;

  constructor(private readonly o: SimOptions) {
    this.markers = join(o.nodeDir, 'sim');
    mkdirSync(this.markers, { recursive: true });
    this.journal = join(this.markers, JOURNAL);
    // Written synchronously: a node killed right after answering a create still has it on record.
    this.fd = openSync(this.journal, 'a');
  }

  private note(line: string): void {
    if (this.fd !== undefined) writeSync(this.fd, line);
  }

  private wait(verb: SimVerb): Promise<void> | undefined {
    const ms = this.o.latencyMs?.[verb];
    return ms ? new Promise((r) => setTimeout(r, ms)) : undefined;
  }

  private box(id: string): SimSandbox {
    const b = this.boxes.get(id);
    if (!b) throw new ProtocolError('NOT_FOUND', `sandbox ${id} is not on this node`);
    return b;
  }

  private running(id: string): SimSandbox {
    const b = this.box(id);
    if (b.state !== 'running') throw new ProtocolError('INVALID_STATE', `sandbox ${id} is ${b.state}`);
    return b;
  }

  async create(id: string, spec: SandboxSpec): Promise<void> {
    if (this.boxes.has(id)) throw new ProtocolError('INVALID_REQUEST', `sandbox ${id} already exists`);
    await this.wait('create');
    this.add(id, spec);
  }

  private add(id: string, spec: SandboxSpec, from?: SimSandbox): SimSandbox {
    const b: SimSandbox = {
      state: 'running',
      memoryMiB: spec.memoryMiB,
      diskBytes: (spec.diskMiB ?? Limits.diskMiB.default) * 1024 * 1024,
      env: spec.env,
      cwd: spec.cwd ?? '/',
      cpuSec: 0,
    };
    if (from?.files) b.files = from.files.clone();
    this.boxes.set(id, b);
    this.note(`+${id}\n`);
    return b;
  }

  private filesOf(b: SimSandbox): MemoryFiles {
    b.files ??= new MemoryFiles(b.diskBytes);
    return b.files;
  }

  async exec(id: string, opts: ExecOptions): Promise<ExecOutcome> {
    const b = this.running(id);
    const started = performance.now();
    await this.wait('exec');
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    const seen = { out: 0, err: 0 };
    let truncated = false;
    let timedOut = false;
    const deadline = started + opts.timeoutMs;
    const emit = (s: 'out' | 'err', data: Buffer): boolean => {
      const room = opts.maxOutputBytes - seen[s];
      const part = data.length > room ? data.subarray(0, Math.max(0, room)) : data;
      if (part.length > 0) {
        seen[s] += part.length;
        if (!opts.discard) (s === 'out' ? out : err).push(part);
        opts.onOutput?.(s, part);
      }
      if (data.length > room) truncated = true;
      return !truncated;
    };
    const sleep = (ms: number) =>
      new Promise<void>((resolve, reject) => {
        const left = deadline - performance.now();
        const t = setTimeout(
          () => {
            opts.signal?.removeEventListener('abort', onAbort);
            if (ms > left) {
              timedOut = true;
              reject(new Halt());
            } else {
              b.cpuSec += ms / 1000;
              resolve();
            }
          },
          Math.max(0, Math.min(ms, left)),
        );
        const onAbort = () => {
          clearTimeout(t);
          reject(new Halt());
        };
        opts.signal?.addEventListener('abort', onAbort, { once: true });
      });
    let exitCode: number;
    let signal: string | undefined;
    try {
      if (opts.signal?.aborted) throw new Halt();
      exitCode = await runScript(opts, { files: this.filesOf(b), env: { ...b.env, ...opts.env }, cwd: opts.cwd ?? b.cwd, sleep }, emit);
      if (truncated) {
        exitCode = 137;
        signal = 'SIGKILL';
      }
    } catch (e) {
      if (!(e instanceof Halt)) throw e;
      exitCode = 137;
      signal = 'SIGKILL';
    }
    return {
      exitCode,
      ...(signal ? { signal } : {}),
      stdout: Buffer.concat(out),
      stderr: Buffer.concat(err),
      durationMs: Math.round((performance.now() - started) * 1000) / 1000,
      truncated,
      timedOut,
      verdict: timedOut ? 'TIMEOUT' : truncated ? 'OUTPUT_LIMIT' : 'OK',
    };
  }

  files(id: string): SandboxFiles {
    const b = this.running(id);
    const files = this.filesOf(b);
    const lat = this.o.latencyMs?.files;
    if (!lat) return files;
    const wait = () => new Promise((r) => setTimeout(r, lat));
    return {
      read: (...a) => wait().then(() => files.read(...a)),
      write: (...a) => wait().then(() => files.write(...a)),
      list: (...a) => wait().then(() => files.list(...a)),
      remove: (...a) => wait().then(() => files.remove(...a)),
    };
  }

  async pause(id: string): Promise<void> {
    const b = this.box(id);
    await this.wait('pause');
    b.state = 'paused';
  }

  async resume(id: string): Promise<void> {
    const b = this.box(id);
    await this.wait('resume');
    b.state = 'running';
  }

  async hibernate(id: string): Promise<HibernateOutcome> {
    const b = this.box(id);
    await this.wait('hibernate');
    b.state = 'hibernated';
    return { releasedBytes: this.resident(b) };
  }

  async restore(id: string): Promise<void> {
    const b = this.box(id);
    await this.wait('restore');
    b.state = 'running';
  }

  private resident(b: SimSandbox): number {
    return Math.round(b.memoryMiB * 1024 * 1024 * (this.o.residentShare ?? 0.05));
  }

  async stats(id: string): Promise<SandboxStats> {
    const b = this.box(id);
    return { cpuSec: b.cpuSec, memoryBytes: b.state === 'hibernated' ? 0 : this.resident(b), diskBytes: b.files?.used ?? 0, pids: b.state === 'hibernated' ? 0 : 1 };
  }

  async snapshot(id: string): Promise<{ snapshot: string; bytes: number }> {
    const b = this.box(id);
    const name = `${id}-${this.snapshots.size + 1}`;
    this.snapshots.set(name, { ...b, ...(b.files ? { files: b.files.clone() } : {}) });
    return { snapshot: name, bytes: this.resident(b) + (b.files?.used ?? 0) };
  }

  async restoreFrom(snapshot: string, newId: string, spec: SandboxSpec): Promise<void> {
    const s = this.snapshots.get(snapshot);
    if (!s) throw new ProtocolError('NOT_FOUND', `no snapshot ${snapshot}`);
    await this.wait('fork');
    this.add(newId, spec, s);
  }

  async fork(id: string, newId: string, spec: SandboxSpec): Promise<void> {
    const b = this.box(id);
    await this.wait('fork');
    this.add(newId, spec, b);
  }

  async destroy(id: string): Promise<void> {
    if (!this.boxes.delete(id)) return;
    await this.wait('destroy');
    this.note(`-${id}\n`);
  }

  async recover(): Promise<string[]> {
    const left = new Set<string>();
    // Marker files, one per sandbox, of a node directory an older build left.
    for (const f of readdirSync(this.markers)) {
      if (f === JOURNAL) continue;
      left.add(f);
      rmSync(join(this.markers, f), { force: true });
    }
    const lines = existsSync(this.journal) ? readFileSync(this.journal, 'utf8').split('\n') : [];
    for (const l of lines) {
      if (l.startsWith('+')) left.add(l.slice(1));
      else if (l.startsWith('-')) left.delete(l.slice(1));
    }
    truncateSync(this.journal, 0);
    return [...left];
  }

  async close(): Promise<void> {
    this.boxes.clear();
    this.snapshots.clear();
    if (this.fd !== undefined) closeSync(this.fd);
    this.fd = undefined;
  }
}

/** Ends a script early: cancelled or out of time. */
class Halt extends Error {}
