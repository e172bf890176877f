/**
 * The `local` provider: each machine is a real Paddock node process on this host, with its own
 * state directory, node id and cgroup (a share of CPU and memory), joining the same NATS. Real
 * machines in miniature, for the tests and the benchmark.
 *
 * A machine is a record file `<stateDir>/<id>/machine.json` (its tags, pid and the pid's start
 * time); the node process is started detached and does not die with the bridge, so a successor
 * bridge lists and adopts it. How to start a node is injected (ops knows the command line).
 */
import { spawn } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync } from 'node:fs';
import { mkdir, readdir, readFile, rename, rm, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { cgroupDir, detectCgroups } from '../../../runtime/cgroups.ts';
import type { ProvidedMachine, Provider, ProvisionRequest } from '../../provider.ts';

export interface LocalProviderOptions {
  /** Where machine records and each machine's PADDOCK_HOME live. */
  stateDir: string;
  /** The command line of a node that does not die with its parent. */
  command: () => { cmd: string; args: string[]; env: Record<string, string> };
  /** Environment of every machine's node (backends, capacity, images dir, heartbeat). */
  env?: Record<string, string>;
  /** The cgroup share of each machine: CPUs (a CFS quota) and memory (a hard limit) of its node process. */
  cpus?: number;
  memoryMiB?: number;
  /** Machines at most (a quota, like a cloud account's). */
  maxMachines?: number;
}

interface Record_ {
  id: string;
  tags: Record<string, string>;
  createdAt: number;
  pid: number;
  /** /proc/<pid>/stat start time: a pid reused by another process is not the machine. */
  start: string;
  home: string;
}

const CGROUP_PARENT = '/paddock-bridge';

/** Write then rename: a bridge listing machines never reads half a record. */
async function writeAtomic(file: string, text: string): Promise<void> {
  await writeFile(`${file}.tmp`, text);
  await rename(`${file}.tmp`, file);
}

/** The pid's start time, or undefined when it is gone or a zombie (whoever reaps it may be slow: a bridge SIGKILLed leaves its machines to pid 1). */
function startTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return fields[0] === 'Z' ? undefined : fields[19];
  } catch {
    return undefined;
  }
}

export class LocalProvider implements Provider {
  readonly name = 'local';
  private readonly mode = detectCgroups();
  /** Provisions under way in this process: a release of one waits for it, so nothing starts after its release. */
  private readonly inflight = new Map<string, Promise<unknown>>();

  constructor(private readonly o: LocalProviderOptions) {}

  describe(): Record<string, unknown> {
    return { provider: 'local', stateDir: this.o.stateDir, cpus: this.o.cpus ?? 1, memoryMiB: this.o.memoryMiB ?? 1024, maxMachines: this.o.maxMachines ?? null, cgroups: this.mode };
  }

  private cgroups(id: string): { dir: string; files: Record<string, string> }[] {
    const cpus = this.o.cpus ?? 1;
    const mem = String((this.o.memoryMiB ?? 1024) * 1024 * 1024);
    const path = `${CGROUP_PARENT}/${id}`;
    if (this.mode === 'v2') return [{ dir: cgroupDir('v2', path, ''), files: { 'cpu.max': `${Math.round(cpus * 100_000)} 100000`, 'memory.max': mem } }];
    return [
      { dir: cgroupDir(this.mode, path, 'cpu'), files: { 'cpu.cfs_period_us': '100000', 'cpu.cfs_quota_us': String(Math.round(cpus * 100_000)) } },
      { dir: cgroupDir(this.mode, path, 'memory'), files: { 'memory.limit_in_bytes': mem } },
    ];
  }

  provision(req: ProvisionRequest): Promise<ProvidedMachine> {
    const p = this.start(req);
    this.inflight.set(req.id, p);
    return p.finally(() => this.inflight.delete(req.id));
  }

  private async start(req: ProvisionRequest): Promise<ProvidedMachine> {
    if (this.o.maxMachines !== undefined && (await this.records()).length >= this.o.maxMachines) {
      throw new Error(`the local provider's quota of ${this.o.maxMachines} machines is used up`);
    }
    const dir = join(this.o.stateDir, req.id);
    const home = join(dir, 'home');
    await mkdir(home, { recursive: true });
    // Listed from now on, before the process exists: a list or release meanwhile sees it.
    await writeAtomic(join(dir, 'machine.json'), JSON.stringify({ id: req.id, tags: req.tags, createdAt: Date.now(), pid: 0, start: '', home } satisfies Record_));
    if (this.mode === 'v2') await writeFile('/sys/fs/cgroup/cgroup.subtree_control', '+cpu +memory').catch(() => {});
    const groups = this.cgroups(req.id);
    for (const g of groups) {
      await mkdir(g.dir, { recursive: true });
      if (this.mode === 'v2') await writeFile(join(g.dir, '..', 'cgroup.subtree_control'), '+cpu +memory').catch(() => {});
      for (const [f, v] of Object.entries(g.files)) await writeFile(join(g.dir, f), v);
    }
    const { cmd, args, env } = this.o.command();
    // A file, not a pipe: the node keeps logging after the bridge that started it is gone.
    const log = openSync(join(dir, 'node.log'), 'a');
    // The process enters its share before it execs the node: the cgroup is the machine, so a bridge
    // killed at any point leaves nothing that a release (which empties the cgroup) cannot find.
    const enter = groups.map((g) => `echo $$ > '${join(g.dir, 'cgroup.procs')}'`).join(' && ');
    const proc = spawn('/bin/sh', ['-c', `${enter} && exec "$@"`, 'sh', cmd, ...args], {
      detached: true,
      stdio: ['ignore', log, log],
      env: { ...process.env, ...env, ...this.o.env, NATS_URL: req.natsUrl, PADDOCK_HOME: home, PADDOCK_NODE_ID: req.id, PADDOCK_PLACEMENT: '0' },
    });
    closeSync(log);
    const pid = proc.pid;
    if (pid === undefined) throw new Error(`could not start ${cmd} for machine ${req.id}`);
    proc.unref();
    const createdAt = Date.now();
    const rec: Record_ = { id: req.id, tags: req.tags, createdAt, pid, start: startTime(pid) ?? '', home };
    await writeAtomic(join(dir, 'machine.json'), JSON.stringify(rec));
    return { id: req.id, tags: req.tags, createdAt, where: `pid ${pid}` };
  }

  /** Whether anything runs in the machine's share: what `list` calls alive. */
  private occupied(id: string): boolean {
    const g = this.cgroups(id)[0];
    try {
      return g !== undefined && readFileSync(join(g.dir, 'cgroup.procs'), 'utf8').trim() !== '';
    } catch {
      return false;
    }
  }

  async release(id: string): Promise<void> {
    await this.inflight.get(id)?.catch(() => {});
    const dir = join(this.o.stateDir, id);
    const groups = this.cgroups(id).filter((g) => existsSync(g.dir));
    const procs = async () => {
      const g = groups[0];
      if (!g) return [];
      return (await readFile(join(g.dir, 'cgroup.procs'), 'utf8').catch(() => '')).split('\n').filter(Boolean).map(Number);
    };
    const signal = async (sig: NodeJS.Signals) => {
      for (const p of await procs()) {
        try {
          process.kill(p, sig);
        } catch {}
      }
    };
    // SIGTERM first: the node kills its sandboxes and leaves the node table in order.
    await signal('SIGTERM');
    for (let i = 0; i < 300 && (await procs()).length > 0; i++) await sleep(100);
    await signal('SIGKILL');
    for (const g of groups) {
      for (let i = 0; i < 100; i++) {
        if (await rmdir(g.dir).then(() => true, () => !existsSync(g.dir))) break;
        await sleep(100);
      }
    }
    await rm(dir, { recursive: true, force: true });
  }

  private async records(): Promise<Record_[]> {
    const names = await readdir(this.o.stateDir).catch(() => [] as string[]);
    const out: Record_[] = [];
    for (const n of names) {
      const r = await readFile(join(this.o.stateDir, n, 'machine.json'), 'utf8').then(
        (t) => {
          try {
            return JSON.parse(t) as Record_;
          } catch {
            return undefined;
          }
        },
        () => undefined,
      );
      if (r) out.push(r);
    }
    return out;
  }

  async list(tags: Record<string, string>): Promise<ProvidedMachine[]> {
    return (await this.records())
      .filter((r) => Object.entries(tags).every(([k, v]) => r.tags[k] === v))
      .map((r) => {
        const alive = this.occupied(r.id);
        return { id: r.id, tags: r.tags, createdAt: r.createdAt, where: `pid ${r.pid}`, ...(alive ? {} : { gone: true }) };
      });
  }
}
