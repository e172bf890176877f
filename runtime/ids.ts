/**
 * A range of host uids and gids for each sandbox, so that root in one sandbox is a host user of its
 * own (and for each VMM, which runs as the first id of its range: runtime/microvm/jail.ts). The kernel keeps several counters per host user and not per user namespace: file
 * descriptors in flight over unix sockets (unix_inflight, bounded by the sender's RLIMIT_NOFILE),
 * and, above each namespace's own count, the sum of POSIX message-queue bytes and of pending
 * signals. With one range for every sandbox, one sandbox holding them made another's sendmsg fail
 * with ETOOMANYREFS and its mq_open with EMFILE/ENOMEM. With a range each, each sandbox's rlimits
 * bound its own.
 *
 * The ranges are shared by every node on the host (the bridge's `local` machines, a test's
 * cluster), so a node claims them in blocks: a block is held by an flock(2) on a file in
 * ID_LOCK_DIR, taken by `flock(1)` running `cat` on a pipe from the node. When the node ends, however
 * it ends, the pipe closes, `cat` exits and the lock goes with it: no stale claim outlives a node
 * and no cleanup is needed. A block holds BLOCK ranges; a node claims another when its free ones
 * run out and keeps what it claimed until it stops.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { chmod, stat } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { ProtocolError } from '../protocol/index.ts';

export interface IdRange {
  hostId: number;
  size: number;
}

/**
 * The first range of host ids a sandbox's 0…65535 map to; each sandbox has a range of its own
 * above it, so root in one sandbox is a host user no other sandbox shares. Far above the ranges
 * useradd hands out in /etc/subuid.
 */
export const SANDBOX_IDS: IdRange = { hostId: 1_000_000_000, size: 65536 };

const SIZE = SANDBOX_IDS.size;
/** (uid_t)-1 means "no id" to the kernel: the last usable id is one below it. */
const LAST_ID = 0xffff_fffe;
const RANGES = Math.floor((LAST_ID + 1 - SANDBOX_IDS.hostId) / SIZE);
const BLOCK = Number(process.env.PADDOCK_ID_BLOCK) || 256;
const BLOCKS = Math.floor(RANGES / BLOCK);
/** On the host's /run: every node of the host must see the same files (not one node's run directory). */
export const ID_LOCK_DIR = process.env.PADDOCK_ID_LOCK_DIR ?? '/run/paddock/id-blocks';

export class IdRanges {
  /** Ranges this node holds and no sandbox uses, oldest given back first: a range is reused as late as can be. */
  private readonly free: number[] = [];
  private readonly holders: ChildProcess[] = [];
  private readonly blocks = new Set<number>();
  private claiming?: Promise<void>;
  private closed = false;

  /** A range for one sandbox; claims another block when none is free. NO_CAPACITY when the host has none left. */
  async take(): Promise<IdRange> {
    while (this.free.length === 0) {
      if (this.closed) throw new ProtocolError('UNAVAILABLE', 'the node is stopping');
      this.claiming ??= this.claim().finally(() => {
        this.claiming = undefined;
      });
      await this.claiming;
    }
    return range(this.free.shift() as number);
  }

  /**
   * Takes `r` again for a sandbox a previous run of this node left running (its block's lock went
   * with that run): claims its block if no other node has since. false when one has, or when the
   * range is not one of the sandbox ranges: the sandbox cannot be kept.
   */
  async adopt(r: IdRange): Promise<boolean> {
    const k = (r.hostId - SANDBOX_IDS.hostId) / SIZE;
    if (!Number.isInteger(k) || k < 0 || k >= BLOCKS * BLOCK || r.size !== SIZE) return false;
    const b = Math.floor(k / BLOCK);
    if (!this.blocks.has(b) && !(await this.hold(b))) return false;
    const at = this.free.indexOf(k);
    if (at < 0) return false;
    this.free.splice(at, 1);
    return true;
  }

  /** Gives a range back once nothing of its sandbox runs any more. */
  give(r: IdRange): void {
    const k = (r.hostId - SANDBOX_IDS.hostId) / SIZE;
    if (Number.isInteger(k) && this.blocks.has(Math.floor(k / BLOCK))) this.free.push(k);
  }

  /** Blocks held, for the node's info and the tests. */
  get heldBlocks(): number[] {
    return [...this.blocks].sort((a, b) => a - b);
  }

  /** Lets go of every block (the node stops). */
  close(): void {
    this.closed = true;
    for (const h of this.holders) h.kill('SIGKILL');
    this.holders.length = 0;
    this.blocks.clear();
    this.free.length = 0;
  }

  /**
   * Takes block `b`'s lock and its ranges. false when another node holds it, or when this one
   * closed (or took it another way) while the lock was being taken: that lock is let go again.
   */
  private async hold(b: number): Promise<boolean> {
    mkdirSync(ID_LOCK_DIR, { recursive: true, mode: 0o700 });
    const holder = await lock(join(ID_LOCK_DIR, String(b)));
    if (!holder) return false;
    if (this.closed || this.blocks.has(b)) {
      holder.kill('SIGKILL');
      return !this.closed && this.blocks.has(b);
    }
    this.holders.push(holder);
    this.blocks.add(b);
    for (let k = b * BLOCK; k < (b + 1) * BLOCK; k++) this.free.push(k);
    return true;
  }

  /** Claims the first free block, starting from one that depends on this process (nodes started together rarely collide). */
  private async claim(): Promise<void> {
    const start = process.pid % BLOCKS;
    for (let i = 0; i < BLOCKS; i++) {
      const b = (start + i) % BLOCKS;
      if (this.blocks.has(b)) continue;
      if ((await this.hold(b)) || this.closed) return;
    }
    throw new ProtocolError('NO_CAPACITY', `no range of host uids left on this host: all ${BLOCKS} blocks of ${BLOCK} are held by its nodes`);
  }
}

function range(k: number): IdRange {
  return { hostId: SANDBOX_IDS.hostId + k * SIZE, size: SIZE };
}

/**
 * `flock --nonblock <file> cat`, holding the lock while cat runs: a byte written to it coming back
 * says the lock is taken; an exit first says another node holds it. undefined when it is held.
 */
function lock(file: string): Promise<ChildProcess | undefined> {
  return new Promise((resolve, reject) => {
    const p = spawn('flock', ['--nonblock', '--conflict-exit-code', '75', file, 'cat'], { stdio: ['pipe', 'pipe', 'pipe'] });
    let err = '';
    const done = (v: ChildProcess | undefined, e?: Error) => {
      p.removeAllListeners('exit');
      p.stdout?.removeAllListeners('data');
      if (e) reject(e);
      else resolve(v);
    };
    p.stderr?.on('data', (d: Buffer) => {
      err += d.toString();
    });
    p.on('error', (e) => done(undefined, new ProtocolError('BACKEND_FAILED', `flock(1), which holds this node's host uid ranges: ${e.message}`)));
    p.on('exit', (code) => (code === 75 ? done(undefined) : done(undefined, new ProtocolError('BACKEND_FAILED', `flock ${file}: exit ${code}: ${err.trim()}`))));
    p.stdout?.once('data', () => {
      // Held for the node's life, without keeping the node's event loop alive.
      p.unref();
      for (const s of [p.stdin, p.stdout, p.stderr] as unknown as ({ unref?: () => void } | null)[]) s?.unref?.();
      done(p);
    });
    p.stdin?.on('error', () => {});
    p.stdin?.write('1\n');
  });
}

/**
 * Makes every directory from `dir` up searchable by others (only `x`: nothing becomes listable or
 * readable), for a path a sandbox's or a VMM's own host user must reach.
 */
export async function traversable(dir: string): Promise<void> {
  for (let d = resolve(dir); ; d = dirname(d)) {
    const st = await stat(d);
    if ((st.mode & 0o001) === 0) await chmod(d, (st.mode & 0o7777) | 0o001);
    if (d === dirname(d)) break;
  }
}
