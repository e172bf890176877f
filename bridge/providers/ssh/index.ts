/**
 * The `ssh` provider: a machine is a host of a configured pool (bare metal, VMs someone else made)
 * that runs one Paddock node the bridge starts over OpenSSH's client. Nothing is installed on the
 * host but what the node command needs; the provider's whole state there is one directory per
 * machine, `<dir>/<id>/` (default `~/.paddock-bridge/<id>/`):
 *
 * - `machine.json`: its id, tags and start time (the tag store `list` reads back),
 * - `pid`: the node's pid (a session leader: `setsid`), `node.log`, and `home/` (its PADDOCK_HOME).
 *
 * A host runs at most one machine: a directory under `<dir>` occupies it until a release removes
 * the directory (a lock file there orders two bridges racing for the same host). The node does
 * not die with the ssh session or the bridge, so a successor bridge lists and adopts it.
 */
import { spawn } from 'node:child_process';
import { mkdir } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { ProvidedMachine, Provider, ProvisionRequest } from '../../provider.ts';

export interface SshHost {
  /** As configured (`user@host:port`): how people and errors name it. */
  spec: string;
  user?: string;
  host: string;
  port?: number;
}

export interface SshProviderOptions {
  hosts: SshHost[];
  /** The private key ssh offers (IdentitiesOnly); without it, ssh's own defaults. */
  identityFile?: string;
  /** The known_hosts file ssh checks host keys against (and, with `accept-new`, adds new ones to). */
  knownHostsFile: string;
  /**
   * `yes`: only hosts whose key is already in `knownHostsFile`; `accept-new`: a host never seen is
   * trusted on first use and pinned (a changed key is still refused).
   */
  hostKeyChecking: 'yes' | 'accept-new';
  /**
   * What runs a node in the foreground on the host (`paddock node`): a program and its arguments,
   * which sh `exec`s so that the pid the provider keeps is the node's (variables go in `env`).
   */
  nodeCommand: string;
  /** Environment of every machine's node, besides NATS_URL, PADDOCK_NODE_ID and PADDOCK_HOME. */
  env?: Record<string, string>;
  /** The provider's directory on each host; relative paths are under the login's $HOME. */
  dir?: string;
  connectTimeoutSec?: number;
  /** How long a release waits for the node to stop after SIGTERM before SIGKILL. */
  stopTimeoutSec?: number;
}

/** `user@host[:port]`, `host`, `[v6addr]:port`, comma separated. */
export function parseHosts(list: string): SshHost[] {
  return list
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)
    .map((spec) => {
      const at = spec.lastIndexOf('@');
      const user = at >= 0 ? spec.slice(0, at) : undefined;
      let rest = at >= 0 ? spec.slice(at + 1) : spec;
      let port: number | undefined;
      const m = /^\[([^\]]+)\](?::(\d+))?$/.exec(rest) ?? (/^([^:]+):(\d+)$/.exec(rest) as RegExpExecArray | null);
      if (m) {
        rest = m[1] ?? rest;
        port = m[2] ? Number(m[2]) : undefined;
      }
      if (!rest || (port !== undefined && !(port > 0 && port < 65536)) || (user !== undefined && !user)) {
        throw new Error(`PADDOCK_BRIDGE_SSH_HOSTS: ${JSON.stringify(spec)} is not user@host[:port]`);
      }
      // A host starting with '-' would be read by ssh as an option.
      if (rest.startsWith('-') || user?.startsWith('-')) throw new Error(`PADDOCK_BRIDGE_SSH_HOSTS: ${JSON.stringify(spec)}: a name cannot start with '-'`);
      return { spec, host: rest, ...(user ? { user } : {}), ...(port ? { port } : {}) };
    });
}

/** One argument for the remote shell, whatever it holds. */
function q(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

// Every script gets the provider's directory as $1 and runs under POSIX sh (`sh -s`), whatever
// the login shell is. `alive PID ID` is true only for the machine's own node: not a zombie (left
// to a slow reaper once its ssh session is gone) and not a later process that reused the pid.
const PRELUDE = `set -u
case $1 in /*) b=$1 ;; *) b=$HOME/$1 ;; esac
shift
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  [ -r "/proc/$1/stat" ] || return 0
  [ "$(sed 's/^.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ] || return 1
  [ -r "/proc/$1/environ" ] || return 0
  tr '\\000' '\\n' < "/proc/$1/environ" | grep -qx "PADDOCK_NODE_ID=$2"
}
`;

/** Exit status of the provision script when the host already runs a machine. */
const BUSY = 75;

const PROVISION = `${PRELUDE}id=$1 record=$2 cmd=$3
shift 3
mkdir -p "$b" || exit 1
exec 9>>"$b/.lock"
if command -v flock >/dev/null 2>&1; then flock -w 30 9 || { echo "could not lock $b/.lock" >&2; exit 1; }; fi
for m in "$b"/*/; do
  [ -d "$m" ] || continue
  echo "it runs machine $(basename "$m")" >&2
  exit ${BUSY}
done
d=$b/$id
mkdir -p "$d/home" || exit 1
printf '%s\\n' "$record" > "$d/machine.json.tmp" && mv "$d/machine.json.tmp" "$d/machine.json" || exit 1
cd "$d" || exit 1
# Its own session: the node outlives this ssh session and the bridge, and a release can end
# whatever it left (its process group) after it stopped.
env "$@" PADDOCK_HOME="$d/home" setsid sh -c "exec $cmd" </dev/null >>"$d/node.log" 2>&1 9>&- &
pid=$!
echo "$pid" > "$d/pid"
# A command that cannot run at all fails here, with its words, instead of at the join deadline.
sleep 1
if ! alive "$pid" "$id"; then
  echo "the node exited at once: $(tail -n 5 "$d/node.log" | tr '\\n' ' ')" >&2
  exit 1
fi
echo "$pid"
`;

const LIST = `${PRELUDE}for m in "$b"/*/; do
  [ -f "\${m}machine.json" ] || continue
  id=$(basename "$m")
  pid=$(cat "\${m}pid" 2>/dev/null) || pid=0
  a=0
  [ "$pid" -gt 0 ] 2>/dev/null && alive "$pid" "$id" && a=1
  printf '%s %s %s\\n' "$a" "$pid" "$(head -n 1 "\${m}machine.json")"
done
exit 0
`;

const RELEASE = `${PRELUDE}id=$1 wait=$2
d=$b/$id
[ -d "$d" ] || exit 0
pid=$(cat "$d/pid" 2>/dev/null) || pid=0
if [ "$pid" -gt 0 ] 2>/dev/null && alive "$pid" "$id"; then
  # SIGTERM first: the node kills its sandboxes and leaves the node table in order.
  kill -TERM "$pid" 2>/dev/null
  i=0
  while alive "$pid" "$id" && [ "$i" -lt "$wait" ]; do sleep 0.1; i=$((i + 1)); done
  kill -KILL -- "-$pid" 2>/dev/null
  kill -KILL "$pid" 2>/dev/null
fi
rm -rf "$d" || exit 1
exit 0
`;

interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

const SAFE_ID = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

function matches(have: Record<string, string>, want: Record<string, string>): boolean {
  return Object.entries(want).every(([k, v]) => have[k] === v);
}

export class SshProvider implements Provider {
  readonly name = 'ssh';
  private readonly dir: string;
  /** Which host each machine this process knows of runs on: for release and describe. */
  private readonly hostOf = new Map<string, SshHost>();
  /** Hosts a provision of this process is trying: a second one picks another. */
  private readonly claimed = new Set<string>();
  /** Provisions under way in this process: a release of one waits for it, so nothing starts after its release. */
  private readonly inflight = new Map<string, Promise<unknown>>();
  /** The last ssh failure per host (cleared by a success): what `bridge status` shows. */
  private readonly unreachable = new Map<string, string>();

  constructor(private readonly o: SshProviderOptions) {
    if (o.hosts.length === 0) throw new Error('the ssh provider needs at least one host (PADDOCK_BRIDGE_SSH_HOSTS)');
    this.dir = o.dir ?? '.paddock-bridge';
  }

  describe(): Record<string, unknown> {
    const where: Record<string, string[]> = {};
    for (const [id, h] of this.hostOf) where[h.spec] = [...(where[h.spec] ?? []), id];
    return {
      provider: 'ssh',
      hosts: this.o.hosts.map((h) => ({ host: h.spec, machines: where[h.spec] ?? [], ...(this.unreachable.has(h.spec) ? { unreachable: this.unreachable.get(h.spec) } : {}) })),
      dir: this.dir,
      nodeCommand: this.o.nodeCommand,
      hostKeyChecking: this.o.hostKeyChecking,
      knownHosts: this.o.knownHostsFile,
    };
  }

  /** Runs `script` with `args` under sh on `h`, the script on stdin (no quoting of its text). */
  private async run(h: SshHost, script: string, args: string[], timeoutMs: number): Promise<RunResult> {
    if (this.o.hostKeyChecking === 'accept-new') await mkdir(dirname(this.o.knownHostsFile), { recursive: true, mode: 0o700 });
    const connect = this.o.connectTimeoutSec ?? 5;
    const opts = [
      '-T',
      '-o', 'BatchMode=yes',
      '-o', `ConnectTimeout=${connect}`,
      '-o', 'ForwardAgent=no',
      '-o', 'ForwardX11=no',
      '-o', 'ClearAllForwardings=yes',
      '-o', `StrictHostKeyChecking=${this.o.hostKeyChecking}`,
      '-o', `UserKnownHostsFile=${this.o.knownHostsFile}`,
      // A host that vanishes mid-command ends the command within seconds instead of at TCP's pace.
      '-o', 'ServerAliveInterval=5',
      '-o', 'ServerAliveCountMax=3',
      '-o', 'LogLevel=ERROR',
      ...(this.o.identityFile ? ['-i', this.o.identityFile, '-o', 'IdentitiesOnly=yes'] : []),
      ...(h.port ? ['-p', String(h.port)] : []),
      ...(h.user ? ['-l', h.user] : []),
    ];
    const remote = ['sh', '-s', '--', q(this.dir), ...args.map(q)].join(' ');
    return new Promise((resolve) => {
      const p = spawn('ssh', [...opts, '--', h.host, remote], { stdio: ['pipe', 'pipe', 'pipe'] });
      let stdout = '';
      let stderr = '';
      p.stdout.on('data', (d: Buffer) => {
        stdout += d.toString();
      });
      p.stderr.on('data', (d: Buffer) => {
        stderr = (stderr + d.toString()).slice(-4000);
      });
      const timer = setTimeout(() => {
        stderr += `(no answer within ${timeoutMs} ms)`;
        p.kill('SIGKILL');
      }, timeoutMs + connect * 1000);
      let settled = false;
      const settle = (code: number | null) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        // ssh's own failures (cannot connect, host key, auth) are 255; the script's are its own.
        // A kill (the timeout) or an ssh that cannot run counts as ssh's failure too.
        const r = { code: code === null || code < 0 ? 255 : code, stdout, stderr: stderr.trim() };
        if (r.code === 255) this.unreachable.set(h.spec, r.stderr || 'ssh failed');
        else this.unreachable.delete(h.spec);
        resolve(r);
      };
      p.on('error', (err) => {
        stderr += `could not run ssh: ${String(err)}`;
        settle(null);
      });
      p.on('close', settle);
      p.stdin.on('error', () => {});
      p.stdin.end(script);
    });
  }

  provision(req: ProvisionRequest): Promise<ProvidedMachine> {
    const p = this.start(req);
    this.inflight.set(req.id, p);
    return p.finally(() => this.inflight.delete(req.id));
  }

  private async start(req: ProvisionRequest): Promise<ProvidedMachine> {
    // The id becomes a directory name and an environment value on the host.
    if (!SAFE_ID.test(req.id)) throw new Error(`machine id ${JSON.stringify(req.id)}: letters, digits, '.', '_' and '-' only`);
    const createdAt = Date.now();
    const record = JSON.stringify({ id: req.id, tags: req.tags, createdAt });
    const env = { PADDOCK_FN: '0', ...this.o.env, NATS_URL: req.natsUrl, PADDOCK_NODE_ID: req.id, PADDOCK_PLACEMENT: '0' };
    const envArgs = Object.entries(env).map(([k, v]) => `${k}=${v}`);
    const why: string[] = [];
    for (const h of this.o.hosts) {
      if (this.claimed.has(h.spec)) {
        why.push(`${h.spec}: another start of this bridge is trying it`);
        continue;
      }
      this.claimed.add(h.spec);
      try {
        const r = await this.run(h, PROVISION, [req.id, record, this.o.nodeCommand, ...envArgs], 40_000);
        if (r.code === 0) {
          this.hostOf.set(req.id, h);
          return { id: req.id, tags: req.tags, createdAt, where: `${h.spec} pid ${r.stdout.trim()}` };
        }
        if (r.code === BUSY) {
          why.push(`${h.spec}: ${r.stderr}`);
          continue;
        }
        if (r.code === 255) {
          why.push(`${h.spec}: unreachable: ${r.stderr || 'ssh failed'}`);
          continue;
        }
        // The host took the machine and its node failed: its directory stays for the release the
        // bridge sends after a failure, and the next host is not tried (the command is the same there).
        this.hostOf.set(req.id, h);
        throw new Error(`ssh provider: machine ${req.id} on ${h.spec}: ${r.stderr || `exit ${r.code}`}`);
      } finally {
        this.claimed.delete(h.spec);
      }
    }
    throw new Error(`ssh provider: no host of the pool can take machine ${req.id}: ${why.join('; ')}`);
  }

  async release(id: string): Promise<void> {
    await this.inflight.get(id)?.catch(() => {});
    if (!SAFE_ID.test(id)) return;
    let h = this.hostOf.get(id);
    if (!h) {
      // Not started or listed by this process: wherever a list finds it. Not found on any host
      // that answers is released as far as anyone can tell (unreachable hosts show in describe()).
      await this.list({});
      h = this.hostOf.get(id);
      if (!h) return;
    }
    const wait = this.o.stopTimeoutSec ?? 30;
    const r = await this.run(h, RELEASE, [id, String(wait * 10)], (wait + 15) * 1000);
    if (r.code !== 0) {
      // The bridge tries a few times more and then gives up; the machine stays listed for a later one.
      throw new Error(`ssh provider: could not release machine ${id} on ${h.spec}${r.code === 255 ? ' (unreachable)' : ''}: ${r.stderr || `exit ${r.code}`}`);
    }
    this.hostOf.delete(id);
  }

  async list(tags: Record<string, string>): Promise<ProvidedMachine[]> {
    const perHost = await Promise.all(
      this.o.hosts.map(async (h) => {
        const r = await this.run(h, LIST, [], 20_000);
        // A host that does not answer is skipped (describe() says why): its machines are neither adopted nor released.
        if (r.code !== 0) return [];
        for (const [id, x] of this.hostOf) if (x === h && !this.inflight.has(id)) this.hostOf.delete(id);
        const out: ProvidedMachine[] = [];
        for (const line of r.stdout.split('\n').filter(Boolean)) {
          const m = /^([01]) (\d+) (.*)$/.exec(line);
          if (!m) continue;
          let rec: { id?: string; tags?: Record<string, string>; createdAt?: number };
          try {
            rec = JSON.parse(m[3] ?? '');
          } catch {
            continue;
          }
          if (!rec.id || !rec.tags) continue;
          // Ours to release, whatever the tags asked for.
          this.hostOf.set(rec.id, h);
          out.push({ id: rec.id, tags: rec.tags, createdAt: rec.createdAt ?? 0, where: `${h.spec} pid ${m[2]}`, ...(m[1] === '1' ? {} : { gone: true }) });
        }
        return out;
      }),
    );
    return perHost.flat().filter((m) => matches(m.tags, tags));
  }
}
