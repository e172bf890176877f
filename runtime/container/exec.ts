/**
 * One `crun exec`: spawn it, collect or stream its output under a cap, enforce the timeout, and
 * kill the whole process tree when any of those (or the caller) says stop.
 *
 * crun gives the exec'd process its own session, so its process group holds the tree the command
 * started; a process that calls setsid itself is caught by walking /proc children.
 */
import { writeFileSync } from 'node:fs';
import { readdir, readFile, rm } from 'node:fs/promises';
import { constants } from 'node:os';
import type { ExecOptions, ExecOutcome } from '../backend.ts';
import { ByteBudget } from '../limit.ts';
import type { Spawner } from '../spawner.ts';
import { procStat } from '../sync-read.ts';

/** strerror(ENOSPC), as glibc, musl and busybox print it. */
const ENOSPC_TEXT = 'No space left on device';

/** After the command exits, how long to wait for background children that still hold its pipes. */
const PIPE_GRACE_MS = 100;

async function readPid(pidFile: string): Promise<number | null> {
  const text = await readFile(pidFile, 'utf8').catch(() => '');
  const pid = Number.parseInt(text.trim(), 10);
  return Number.isInteger(pid) && pid > 1 ? pid : null;
}

async function descendants(pid: number, into: Set<number>): Promise<void> {
  const tasks = await readdir(`/proc/${pid}/task`).catch(() => [] as string[]);
  for (const tid of tasks) {
    const children = await readFile(`/proc/${pid}/task/${tid}/children`, 'utf8').catch(() => '');
    for (const c of children.split(' ')) {
      const n = Number.parseInt(c, 10);
      if (n > 1 && !into.has(n)) {
        into.add(n);
        await descendants(n, into);
      }
    }
  }
}

function kill(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // already gone
  }
}

/** Kills the process `pid` started and everything it forked. */
export async function killTree(pid: number): Promise<void> {
  const st = procStat(pid);
  // Its group first, in one syscall: a fork bomb cannot outrun it.
  if (st && st.pgid > 1) kill(-st.pgid);
  const tree = new Set<number>();
  await descendants(pid, tree);
  kill(pid);
  for (const p of tree) kill(p);
}

export interface CrunExecArgs {
  spawner: Spawner;
  crun: string;
  /** Under SCHED_IDLE (best-effort sandboxes). */
  idle: boolean;
  root: string;
  id: string;
  pidFile: string;
  /**
   * The container's own OCI `process` (capabilities, user, rlimits, noNewPrivileges): the exec goes
   * to crun as a process file built on it. `crun exec <cmd>` would give the command the
   * node's rlimits rather than the config's; the file carries them without a `prlimit` in front
   * (one exec less: ~0.7 ms of every exec, measured here).
   */
  process: Record<string, unknown>;
  /** stdin from this path (a FIFO the node writes to) instead of `opts.stdin`. */
  stdinPath?: string;
  /** Hand crun the sandbox init binary as fd 3 (`/proc/self/fd/3` inside: the terminal relay, init.c). */
  fd3?: boolean;
  /** Told the command's host pid once crun has started it (null: it never started). */
  onPid?: (pid: number | null) => void;
  /** Output past this budget holds the command's pipes until it refills (outputBudget). */
  output?: { budget: OutputBudget; sandbox: string };
}

/**
 * Output bandwidth, per sandbox and for the node as a whole. Every command's output reaches the
 * node through the one spawner channel and the one event loop every sandbox's calls share: four
 * sandboxes streaming 64 MiB each put a neighbour's exec at 3.4–4.1× its quiet latency (measured here).
 * Past a burst, a command's pipes are left unread (spawner.c `hold`) until its budgets refill, so
 * the command itself slows down: nothing is dropped, and ordinary output never meets the limit.
 */
export class OutputBudget {
  private readonly each: ByteBudget;
  private readonly all: ByteBudget;

  constructor(o: { sandboxMiBps: number; nodeMiBps: number }) {
    const MiB = 1024 * 1024;
    this.each = new ByteBudget(o.sandboxMiBps * MiB, 16 * MiB);
    this.all = new ByteBudget(o.nodeMiBps * MiB, 32 * MiB);
  }

  /** Spends `bytes` of the sandbox's and the node's budgets; how long (ms) its output should wait. */
  spend(sandbox: string, bytes: number): number {
    return Math.max(this.each.spend(sandbox, bytes), this.all.spend('', bytes));
  }
}

/** Sends `signal` to the process group `pid` leads (crun exec makes each command a session leader). */
export function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch {
    try {
      process.kill(pid, signal);
    } catch {
      // already gone
    }
  }
}

/** Its pid in the innermost pid namespace (the sandbox's), from /proc/<pid>/status. */
export async function nsPid(pid: number): Promise<number | undefined> {
  const s = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
  const m = /^NSpid:\s+(.*)$/m.exec(s);
  const last = m?.[1]?.trim().split(/\s+/).pop();
  return last ? Number(last) : undefined;
}

export async function execInContainer(a: CrunExecArgs, opts: ExecOptions): Promise<ExecOutcome> {
  // The pid, process and stdin files are on the node's run tmpfs: written synchronously (see backend create).
  const processFile = `${a.pidFile}.json`;
  const env = Object.entries(opts.env ?? {}).map(([k, v]) => `${k}=${v}`);
  writeFileSync(processFile, JSON.stringify({ ...a.process, args: opts.cmd, env, cwd: opts.cwd ?? '/', terminal: false }));
  const args = [a.crun, '--root', a.root, 'exec', ...(a.fd3 ? ['--preserve-fds', '1'] : []), '--pid-file', a.pidFile, '--process', processFile, a.id];
  const stdinFile = a.stdinPath ?? (opts.stdin && opts.stdin.length > 0 ? `${a.pidFile}.stdin` : undefined);
  if (stdinFile && !a.stdinPath && opts.stdin) writeFileSync(stdinFile, opts.stdin);

  const started = performance.now();
  return new Promise<ExecOutcome>((resolve) => {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    const seen = { out: 0, err: 0 };
    let truncated = false;
    let timedOut = false;
    let stopping = false;
    let finished = false;
    let exitCode: number | null = null;
    let graceTimer: NodeJS.Timeout | undefined;

    let noSpace = false;
    let outputTimer: NodeJS.Timeout | undefined;
    /** Held for the caller's window (opts.flow); off once the command has exited or is being stopped. */
    let flowHeld = false;
    let flowOff = false;
    let holding = false;
    // The pipes are held while the output budget or the caller's window says so, for either.
    const applyHold = () => {
      const want = outputTimer !== undefined || flowHeld;
      if (want === holding) return;
      holding = want;
      child.holdOutput(want);
    };
    const flowDone = () => {
      flowOff = true;
      flowHeld = false;
      applyHold();
    };
    const onData = (which: 'out' | 'err', chunk: Buffer) => {
      if (which === 'err' && !noSpace && chunk.includes(ENOSPC_TEXT)) noSpace = true;
      const buf = which === 'out' ? out : err;
      const room = opts.maxOutputBytes - seen[which];
      if (room <= 0) {
        if (chunk.length > 0 && !truncated) {
          truncated = true;
          stop();
        }
        return;
      }
      const part = chunk.length > room ? chunk.subarray(0, room) : chunk;
      seen[which] += part.length;
      if (!opts.discard) buf.push(part);
      opts.onOutput?.(which, part);
      // Every chunk is spent; one already held, or read after the exit, is not held again.
      const waitMs = a.output ? a.output.budget.spend(a.output.sandbox, chunk.length) : 0;
      if (waitMs > 0 && outputTimer === undefined && exitCode === null) {
        outputTimer = setTimeout(() => {
          outputTimer = undefined;
          applyHold();
        }, waitMs);
        applyHold();
      }
      const flow = opts.flow;
      if (flow && !flowOff && !flowHeld && exitCode === null && flow.held()) {
        flowHeld = true;
        applyHold();
        flow.whenOpen(() => {
          if (!flowHeld) return;
          flowHeld = false;
          applyHold();
        });
      }
      if (chunk.length > room) {
        truncated = true;
        stop();
      }
    };
    const child = a.spawner.start({ argv: args, onOutput: onData, idle: a.idle, oomFirst: true, ...(a.fd3 ? { passFd3: true } : {}), ...(stdinFile ? { stdinFile } : {}) });
    if (a.onPid) {
      const told = a.onPid;
      void (async () => {
        for (;;) {
          const pid = await readPid(a.pidFile);
          if (pid || exitCode !== null || finished) return told(pid);
          await new Promise((r) => setTimeout(r, 5));
        }
      })();
    }

    function stop() {
      if (stopping) return;
      stopping = true;
      // A command being killed must be able to end: what it wrote is read, window or not.
      flowDone();
      void (async () => {
        // The pid file appears once crun has started the process; a stop that comes earlier waits for it.
        for (let i = 0; i < 50; i++) {
          const pid = await readPid(a.pidFile);
          if (pid) {
            await killTree(pid);
            break;
          }
          if (exitCode !== null) break;
          await new Promise((r) => setTimeout(r, 10));
        }
        child.kill(9);
      })();
    }

    // A background process may have no timeout of its own (Infinity): setTimeout would fire at once past 2^31 ms.
    const timer =
      opts.timeoutMs < 2 ** 31
        ? setTimeout(() => {
            timedOut = true;
            stop();
          }, opts.timeoutMs)
        : undefined;
    const onAbort = () => stop();
    opts.signal?.addEventListener('abort', onAbort, { once: true });

    const finish = () => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      clearTimeout(graceTimer);
      clearTimeout(outputTimer);
      opts.signal?.removeEventListener('abort', onAbort);
      child.release();
      void rm(a.pidFile, { force: true });
      void rm(processFile, { force: true });
      if (stdinFile && !a.stdinPath) void rm(stdinFile, { force: true });
      const code = exitCode ?? 1;
      let signal: string | undefined;
      if (code > 128 && code < 128 + 65) {
        // crun reports a process killed by signal N as exit 128+N, like a shell (and so does the spawner for crun itself).
        signal = Object.entries(constants.signals).find(([, n]) => n === code - 128)?.[0];
      }
      const outcome: ExecOutcome = {
        exitCode: code,
        stdout: Buffer.concat(out),
        stderr: Buffer.concat(err),
        durationMs: Math.round((performance.now() - started) * 1000) / 1000,
        truncated,
        timedOut,
      };
      if (signal) outcome.signal = signal;
      if (noSpace) outcome.noSpace = true;
      resolve(outcome);
    };

    child.exited.then(
      (r) => {
        exitCode = r.code;
        // What it wrote before it ended is read now: held, it would wait in the pipes past the grace below.
        if (outputTimer !== undefined) {
          clearTimeout(outputTimer);
          outputTimer = undefined;
        }
        flowDone();
        // Background children may keep the pipes open: give them a moment, then return anyway.
        graceTimer = setTimeout(finish, PIPE_GRACE_MS);
      },
      (e: Error) => {
        err.push(Buffer.from(`crun exec: ${e.message}\n`));
        exitCode = 127;
        finish();
      },
    );
    void child.closed.then(() => {
      if (exitCode !== null) finish();
    });
  });
}
