/**
 * The node's side of runner.c: building the static binary once per host, the wire format of jobs
 * and answers (pure functions, unit-tested), and one running runner inside a pool member.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { ProtocolError } from '../../protocol/index.ts';
import { sourceFile } from '../source.ts';
import { buildStaticBinary } from '../static-binary.ts';

const SOURCE = sourceFile('runtime/fncall/runner.c');

/** The runner, built once per host and source version (static-binary.ts). */
export function buildRunner(dir: string): Promise<string> {
  return buildStaticBinary(SOURCE, dir, 'fn-runner', 'FnCall');
}

/** One program to run: what the runner needs to fork it. */
export interface RunnerJob {
  argv: string[];
  env: string[];
  cwd: string;
  stdin: Uint8Array;
  /** Cap on stdout + stderr together; past it the runner kills the program. */
  outputBytes: number;
  uid: number;
  gid: number;
  /** RLIMIT_CPU backstop in seconds (the node enforces the real limit on the cgroup). */
  cpuSec: number;
  nofile: number;
  stackMiB: number;
}

export interface RunnerAnswer {
  /** Raw wait(2) status. */
  status: number;
  truncated: boolean;
  /** Set when the program could not be started: the errno of its execve (or of the set-up before it). */
  execErrno?: number;
  cpuUs: number;
  maxRssKiB: number;
  wallUs: number;
  stdout: Buffer;
  stderr: Buffer;
}

const JOB_MAGIC = Buffer.from('FNJB');
const ANSWER_MAGIC = 'FNRS';
const READY_MAGIC = 'FNOK';
const ANSWER_HEAD = 60;

export function encodeJob(j: RunnerJob): Buffer {
  const fields = [j.stdin.length, j.outputBytes, j.uid, j.gid, j.cpuSec, j.nofile, 0, j.stackMiB, j.argv.length, j.env.length];
  const head = Buffer.alloc(8 + fields.length * 4);
  JOB_MAGIC.copy(head, 0);
  for (const [i, v] of fields.entries()) head.writeUInt32LE(v >>> 0, 8 + i * 4);
  const strings = Buffer.from(`${[j.cwd, ...j.argv, ...j.env].join('\0')}\0`);
  head.writeUInt32LE(head.length - 8 + strings.length + j.stdin.length, 4);
  return Buffer.concat([head, strings, j.stdin]);
}

export function decodeAnswer(frame: Buffer): RunnerAnswer {
  if (frame.length < ANSWER_HEAD || frame.toString('latin1', 0, 4) !== ANSWER_MAGIC) throw new Error('fn-runner: malformed answer');
  const flags = frame.readUInt32LE(12);
  const outLen = frame.readUInt32LE(52);
  const errLen = frame.readUInt32LE(56);
  const a: RunnerAnswer = {
    status: frame.readInt32LE(8),
    truncated: (flags & 1) !== 0,
    cpuUs: u64(frame, 20) + u64(frame, 28),
    maxRssKiB: u64(frame, 36),
    wallUs: u64(frame, 44),
    stdout: frame.subarray(ANSWER_HEAD, ANSWER_HEAD + outLen),
    stderr: frame.subarray(ANSWER_HEAD + outLen, ANSWER_HEAD + outLen + errLen),
  };
  if (flags & 2) a.execErrno = frame.readUInt32LE(16);
  return a;
}

/** A little-endian u64 that fits a double (times in µs, sizes in KiB): no BigInt on the hot path. */
function u64(b: Buffer, at: number): number {
  return b.readUInt32LE(at) + b.readUInt32LE(at + 4) * 2 ** 32;
}

/** Splits a byte stream into `MAGIC u32-length body` frames. */
export class FrameReader {
  private buf: Buffer = Buffer.alloc(0);
  constructor(private readonly onFrame: (frame: Buffer) => void) {}
  push(chunk: Buffer): void {
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    while (this.buf.length >= 8) {
      const len = this.buf.readUInt32LE(4);
      if (this.buf.length < 8 + len) return;
      const frame = this.buf.subarray(0, 8 + len);
      this.buf = this.buf.subarray(8 + len);
      this.onFrame(frame);
    }
  }
}

/** What a wait(2) status says: an exit code, or the signal that ended the process. */
export function waitStatus(status: number): { exitCode: number; signal?: number } {
  const sig = status & 0x7f;
  if (sig === 0) return { exitCode: (status >> 8) & 0xff };
  return { exitCode: 128 + sig, signal: sig };
}

/** A runner running inside a member: one job at a time. */
export class Runner {
  private readonly proc: ChildProcess;
  private pending?: { resolve: (a: RunnerAnswer) => void; reject: (e: Error) => void };
  private ready!: Promise<void>;
  private stderrTail: string = '';
  /** Host pid of the runner (the node spares it when it clears a member's processes). */
  pid = 0;
  exited: boolean = false;

  private constructor(
    o: { crun: string; crunRoot: string; id: string; binary: string; pidFile: string },
    private readonly onExit: (why: string) => void,
  ) {
    const fd = openSync(o.binary, 'r');
    try {
      // crun executes /proc/self/fd/3 inside the container: the binary is never a file there.
      this.proc = spawn(o.crun, ['--root', o.crunRoot, 'exec', '--preserve-fds', '1', '--pid-file', o.pidFile, o.id, '/proc/self/fd/3'], { stdio: ['pipe', 'pipe', 'pipe', fd] });
    } finally {
      closeSync(fd);
    }
    this.ready = new Promise<void>((resolve, reject) => {
      let started = false;
      const reader = new FrameReader((frame) => {
        const magic = frame.toString('latin1', 0, 4);
        if (!started && magic === READY_MAGIC) {
          started = true;
          resolve();
          return;
        }
        const p = this.pending;
        this.pending = undefined;
        try {
          p?.resolve(decodeAnswer(frame));
        } catch (e) {
          p?.reject(e as Error);
        }
      });
      this.proc.stdout?.on('data', (d: Buffer) => reader.push(d));
      this.proc.stderr?.on('data', (d: Buffer) => {
        this.stderrTail = (this.stderrTail + d.toString()).slice(-2000);
      });
      this.proc.stdin?.on('error', () => {
        // The runner is gone; 'exit' below says so.
      });
      const gone = (why: string) => {
        if (this.exited) return;
        this.exited = true;
        const err = new ProtocolError('BACKEND_FAILED', `the FnCall runner stopped (${why})${this.stderrTail ? `: ${this.stderrTail.trim()}` : ''}`);
        if (!started) reject(err);
        this.pending?.reject(err);
        this.pending = undefined;
        this.onExit(why);
      };
      this.proc.on('error', (e) => gone(e.message));
      this.proc.on('exit', (code, signal) => gone(signal ?? `exit ${code}`));
    });
  }

  static async start(o: { crun: string; crunRoot: string; id: string; binary: string; pidFile: string }, onExit: (why: string) => void): Promise<Runner> {
    const r = new Runner(o, onExit);
    await r.ready;
    // crun writes the pid file once the process runs, which may be after its first words.
    const deadline = Date.now() + 10_000;
    for (let wait = 1; ; wait = Math.min(wait * 2, 50)) {
      r.pid = Number.parseInt(await readFile(o.pidFile, 'utf8').catch(() => ''), 10);
      if (r.pid > 1) break;
      if (r.exited || Date.now() > deadline) {
        r.stop();
        throw new ProtocolError('BACKEND_FAILED', 'the FnCall runner started but crun wrote no pid for it');
      }
      await new Promise((res) => setTimeout(res, wait));
    }
    return r;
  }

  run(job: RunnerJob): Promise<RunnerAnswer> {
    if (this.exited) return Promise.reject(new ProtocolError('BACKEND_FAILED', 'the FnCall runner has stopped'));
    if (this.pending) return Promise.reject(new ProtocolError('INTERNAL', 'the FnCall runner is busy'));
    return new Promise<RunnerAnswer>((resolve, reject) => {
      this.pending = { resolve, reject };
      this.proc.stdin?.write(encodeJob(job));
    });
  }

  /** Closing its stdin ends the runner (and any program it still runs). */
  stop(): void {
    this.proc.stdin?.end();
    if (!this.exited) setTimeout(() => this.proc.kill('SIGKILL'), 1000).unref();
  }
}
