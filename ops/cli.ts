/**
 * The `paddock` command line: bring Paddock up on this host (`up`, `node`) and drive sandboxes
 * through the SDK (`create`, `exec`, `ps`, `rm`, `info`, `files`). Remote failures arrive as
 * PaddockError; the fault of their code picks the exit status (2: the caller's, 1: the platform's).
 */
import { spawn } from 'node:child_process';
import { mkdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { createConnection, Socket } from 'node:net';
import { constants, hostname } from 'node:os';
import { basename, join } from 'node:path';
import { type ParseArgsConfig, parseArgs } from 'node:util';
import { DEFAULT_HOME, natsUrlFile } from '../protocol/discovery.ts';
import { type BackendKind, Backends, ErrorCodes, isToken, Limits, ProtocolError } from '../protocol/index.ts';
import { exportCommand } from '../chronus/cli.ts';
import { CHRONUS_ENV_DOC } from '../chronus/config.ts';
import { ENV_DOC, sanitizeId } from '../runtime/config.ts';
import { ImageUsageError, imageCommand } from '../runtime/images/cli.ts';
import { fnCommand, FnUsageError } from '../runtime/fncall/cli.ts';
import { nodeCommand } from './launch.ts';
import { type CreateSpec, type FileEntry, NotFoundError, Paddock, PaddockError, type Sandbox, type SandboxInfo } from '../sdk/index.ts';
import { type NodeProcess, startNode } from './local.ts';
import { type EmbeddedNats, startNats } from './nats.ts';

const SELF = basename(process.argv[1] ?? '') === 'cli.ts' ? `node --import tsx ${process.argv[1]}` : 'paddock';

const USAGE = `Usage: paddock [--nats URL] [--timeout MS] <command> [options]

Run Paddock on this host:
  up                       start an embedded nats-server (or join $NATS_URL) and one node;
                           Ctrl-C stops both and kills their sandboxes
  node                     run one node in the foreground, joining $NATS_URL

Drive sandboxes:
  create [--image busybox] [--backend container] [--cpu N] [--memory MiB] [--ttl SEC]
         [--label k=v]... [--env K=V]... [--group G] [--json]
                           create a sandbox; prints its id (its record with --json)
  exec <id> [--timeout MS] [--cwd DIR] [--env K=V]... [--stdin] -- <cmd> [args...]
                           run a command, streaming its output; exits with its exit code.
                           --timeout kills the command after MS ms (default ${Limits.exec.timeoutMs.default});
                           --stdin sends this command's piped stdin to it
  ps [--label k=v]... [--group G] [--all] [--json]
                           list live sandboxes (--all: ended ones too)
  rm <id>...               kill sandboxes
  info <id> [--json]       show one sandbox
  files get <id> <path> [dest|-]   copy a file out of a sandbox (default: to stdout)
  files put <id> <src|-> <path>    copy a local file (- = stdin) into a sandbox
  files ls <id> <dir> [--json]     list a directory of a sandbox
  chronus export <rolloutId> [file|-]
                           write a rollout's trajectory (its command log) as JSONL, one line
                           per step (default: to stdout)
  image <build|push|pull|ls|rm|gc|serve|stats> ...
                           layer images and stores ('paddock image help')
  fn run <file> [--language L] [--time-limit MS] [--memory MiB] [--json] < input
                           run a program once on any node (FnCall) and print its output and
                           verdict; fn build: the images its languages need ('paddock fn help')
  help                     this text

Global options:
  --nats URL               NATS to talk to (default: $NATS_URL, else the URL \`paddock up\`
                           wrote to $PADDOCK_HOME/nats.url)
  --timeout MS             how long to wait for answers (for exec: the command's time limit)
  -h, --help               this text

Exit status: 0 on success; exec: the command's exit code; 2 when the request was at fault
(bad arguments, unknown sandbox, invalid spec); 1 otherwise.

Environment (up, node):
${Object.entries({ ...ENV_DOC, ...CHRONUS_ENV_DOC })
  .map(([k, v]) => `  ${k.padEnd(26)} ${v}`)
  .join('\n')}
`;

/** Bad arguments: exit 2, with the usage text when the command line itself made no sense. */
class UsageError extends Error {
  constructor(
    message: string,
    readonly showUsage = false,
  ) {
    super(message);
  }
}

type Options = NonNullable<ParseArgsConfig['options']>;

const GLOBAL = {
  nats: { type: 'string' },
  timeout: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} satisfies Options;

const COMMANDS = {
  up: {},
  node: {},
  create: {
    image: { type: 'string' },
    backend: { type: 'string' },
    cpu: { type: 'string' },
    memory: { type: 'string' },
    ttl: { type: 'string' },
    label: { type: 'string', multiple: true },
    env: { type: 'string', multiple: true },
    group: { type: 'string' },
    json: { type: 'boolean' },
  },
  exec: {
    cwd: { type: 'string' },
    env: { type: 'string', multiple: true },
    stdin: { type: 'boolean' },
  },
  ps: {
    label: { type: 'string', multiple: true },
    group: { type: 'string' },
    all: { type: 'boolean' },
    json: { type: 'boolean' },
  },
  rm: {},
  info: { json: { type: 'boolean' } },
  files: { json: { type: 'boolean' } },
  chronus: {},
  help: {},
} satisfies Record<string, Options>;

type Command = keyof typeof COMMANDS;

/** Every flag any command knows, so each command reads its values from one typed record. */
const ALL = { ...GLOBAL, ...COMMANDS.create, ...COMMANDS.exec, ...COMMANDS.ps, ...COMMANDS.info } satisfies Options;
type Values = ReturnType<typeof parseArgs<{ options: typeof ALL; allowPositionals: true }>>['values'];

interface Args {
  cmd: Command;
  values: Values;
  positionals: string[];
}

function isCommand(s: string): s is Command {
  return Object.hasOwn(COMMANDS, s);
}

/** Global flags may come before the command: the command is the first word no flag consumes. */
function parse(argv: string[]): Args {
  let cmd: string | undefined;
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (cmd === undefined && a === '--') break;
    if (cmd === undefined && (a === '--nats' || a === '--timeout')) {
      rest.push(a);
      if (i + 1 < argv.length) rest.push(argv[++i] as string);
      continue;
    }
    if (cmd === undefined && !a.startsWith('-')) cmd = a;
    else rest.push(a);
  }
  if (cmd === undefined) {
    if (rest.includes('--help') || rest.includes('-h')) return { cmd: 'help', values: {}, positionals: [] };
    throw new UsageError('no command given', true);
  }
  if (!isCommand(cmd)) throw new UsageError(`unknown command '${cmd}'`, true);
  let parsed: { values: Values; positionals: string[] };
  try {
    parsed = parseArgs({ args: rest, options: { ...GLOBAL, ...COMMANDS[cmd] }, allowPositionals: true, strict: true }) as { values: Values; positionals: string[] };
  } catch (err) {
    // parseArgs explains how to pass a positional that starts with '-'; for exec that means '--'.
    const msg = (err as Error).message;
    const unknown = /^Unknown option '([^']+)'/.exec(msg)?.[1];
    const hint = cmd === 'exec' ? " (put the command after '--')" : '';
    throw new UsageError(`${cmd}: ${unknown ? `unknown option ${unknown}${hint}` : msg}`, true);
  }
  if (parsed.values.help) return { cmd: 'help', values: {}, positionals: [] };
  return { cmd, ...parsed };
}

function positiveNumber(flag: string, v: string | undefined, integer = false): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (v.trim() === '' || !Number.isFinite(n) || n <= 0 || (integer && !Number.isInteger(n))) {
    throw new UsageError(`--${flag} ${v}: must be a positive ${integer ? 'integer' : 'number'}`);
  }
  return n;
}

function pairs(flag: string, list: string[] | undefined): Record<string, string> | undefined {
  if (!list) return undefined;
  const out: Record<string, string> = {};
  for (const s of list) {
    const eq = s.indexOf('=');
    if (eq <= 0) throw new UsageError(`--${flag} ${s}: expected key=value`);
    out[s.slice(0, eq)] = s.slice(eq + 1);
  }
  return out;
}

function positionals(a: Args, min: number, max: number, what: string): string[] {
  if (a.positionals.length < min || a.positionals.length > max) throw new UsageError(`usage: paddock ${what}`);
  return a.positionals;
}

async function withClient<T>(a: Args, fn: (pdk: Paddock) => Promise<T>): Promise<T> {
  const timeoutMs = a.cmd === 'exec' ? undefined : positiveNumber('timeout', a.values.timeout, true);
  const pdk = await Paddock.connect({ servers: a.values.nats, timeoutMs, name: 'paddock-cli' });
  try {
    return await fn(pdk);
  } finally {
    // Drain, not just close: a cancel published on the way out (exec.cancel) must still leave.
    await pdk.close().catch(() => {});
  }
}

/** Ids become NATS subject tokens: one that cannot be a token cannot name a sandbox either. */
async function getSandbox(pdk: Paddock, id: string): Promise<Sandbox> {
  if (!isToken(id)) throw new NotFoundError('NOT_FOUND', `sandbox ${JSON.stringify(id)} does not exist`);
  return pdk.sandboxes.get(id);
}

function out(s: string): void {
  process.stdout.write(s.endsWith('\n') ? s : `${s}\n`);
}

function note(s: string): void {
  process.stderr.write(`paddock: ${s}\n`);
}

function json(x: unknown): void {
  out(JSON.stringify(x, null, 2));
}

function table(head: string[], rows: string[][]): string {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]) =>
    r
      .map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  return [line(head), ...rows.map(line)].join('\n');
}

function age(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m`;
  const h = Math.floor(m / 60);
  return h < 48 ? `${h}h` : `${Math.floor(h / 24)}d`;
}

function labelText(labels: Record<string, string> | undefined): string {
  const s = Object.entries(labels ?? {})
    .map(([k, v]) => `${k}=${v}`)
    .join(',');
  return s || '-';
}

function when(ms: number | undefined): string {
  return ms === undefined ? '-' : `${new Date(ms).toISOString()} (${ms <= Date.now() ? `${age(Date.now() - ms)} ago` : `in ${age(ms - Date.now())}`})`;
}

async function readStdin(): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** Resolves once `data` is handed to the stream, waiting out backpressure unless `signal` ends the wait. */
function write(stream: NodeJS.WriteStream, data: Uint8Array, signal: AbortSignal): Promise<void> | undefined {
  if (stream.write(data) || signal.aborted) return undefined;
  return new Promise<void>((resolve) => {
    const done = () => {
      stream.off('drain', done);
      signal.removeEventListener('abort', done);
      resolve();
    };
    stream.on('drain', done);
    signal.addEventListener('abort', done, { once: true });
  });
}

// --- commands ---------------------------------------------------------------------------------

async function create(a: Args): Promise<number> {
  positionals(a, 0, 0, 'create [options]');
  const v = a.values;
  if (v.backend !== undefined && !(Backends as readonly string[]).includes(v.backend)) {
    throw new UsageError(`--backend ${v.backend}: one of ${Backends.join(', ')}`);
  }
  const spec: CreateSpec = {};
  if (v.image !== undefined) spec.image = v.image;
  if (v.backend !== undefined) spec.backend = v.backend as BackendKind;
  const cpu = positiveNumber('cpu', v.cpu);
  if (cpu !== undefined) spec.cpu = cpu;
  const memoryMiB = positiveNumber('memory', v.memory, true);
  if (memoryMiB !== undefined) spec.memoryMiB = memoryMiB;
  const ttlSec = positiveNumber('ttl', v.ttl);
  if (ttlSec !== undefined) spec.ttlSec = ttlSec;
  const labels = pairs('label', v.label);
  if (labels) spec.labels = labels;
  const env = pairs('env', v.env);
  if (env) spec.env = env;
  if (v.group !== undefined) spec.group = v.group;
  return withClient(a, async (pdk) => {
    const sb = await pdk.sandboxes.create(spec);
    if (v.json) json(sb.info);
    else out(sb.id);
    return 0;
  });
}

async function exec(a: Args): Promise<number> {
  const [id, ...cmd] = a.positionals;
  if (id === undefined || cmd.length === 0) throw new UsageError('usage: paddock exec <id> [options] -- <cmd> [args...]');
  const v = a.values;
  const timeoutMs = positiveNumber('timeout', v.timeout, true);
  const env = pairs('env', v.env);
  let stdin: Buffer | undefined;
  if (v.stdin) {
    if (process.stdin.isTTY) throw new UsageError('--stdin sends piped input, but stdin is a terminal');
    stdin = await readStdin();
    if (stdin.length > Limits.exec.stdinMax) throw new PaddockError('PAYLOAD_TOO_LARGE', `stdin is ${stdin.length} bytes, more than ${Limits.exec.stdinMax}`);
  }
  return withClient(a, async (pdk) => {
    const sb = await getSandbox(pdk, id);
    const ac = new AbortController();
    // Ctrl-C or a closed pipe ends the stream, which cancels the command in the sandbox.
    let interrupted: number | undefined;
    const onSignal = (sig: NodeJS.Signals) => {
      interrupted = sig === 'SIGINT' ? 130 : 143;
      ac.abort();
    };
    const onPipeError = () => {
      interrupted ??= SIGPIPE_EXIT;
      ac.abort();
    };
    process.on('SIGINT', onSignal).on('SIGTERM', onSignal);
    process.stdout.on('error', onPipeError);
    process.stderr.on('error', onPipeError);
    try {
      const opts = { signal: ac.signal, ...(timeoutMs !== undefined ? { timeoutMs } : {}), ...(v.cwd !== undefined ? { cwd: v.cwd } : {}), ...(env ? { env } : {}), ...(stdin ? { stdin } : {}) };
      for await (const ev of sb.execStream(cmd, opts)) {
        if (ev.type !== 'exit') {
          await write(ev.type === 'stdout' ? process.stdout : process.stderr, ev.data, ac.signal);
          continue;
        }
        if (ev.timedOut) note(`the command ran past ${timeoutMs ?? Limits.exec.timeoutMs.default} ms and was killed`);
        if (ev.truncated) note('the output passed its cap: the command was killed and its output cut');
        // Nodes that judge an exec also say which other sandbox limit ended it (OOM, pids).
        const verdict = 'verdict' in ev && typeof ev.verdict === 'string' ? ev.verdict : 'OK';
        if (!['OK', 'TIMEOUT', 'OUTPUT_LIMIT'].includes(verdict)) note(`the command ended on ${verdict}`);
        return ev.exitCode;
      }
      throw new PaddockError('INTERNAL', 'the exec stream ended without an exit');
    } catch (err) {
      if (interrupted !== undefined) return interrupted;
      throw err;
    } finally {
      process.off('SIGINT', onSignal).off('SIGTERM', onSignal);
      process.stdout.off('error', onPipeError);
      process.stderr.off('error', onPipeError);
    }
  });
}

async function ps(a: Args): Promise<number> {
  positionals(a, 0, 0, 'ps [--label k=v]... [--group G] [--all] [--json]');
  const v = a.values;
  const labels = pairs('label', v.label);
  return withClient(a, async (pdk) => {
    const list = await pdk.sandboxes.list({ ...(labels ? { labels } : {}), ...(v.group !== undefined ? { group: v.group } : {}), all: v.all === true });
    if (v.json) {
      json(list);
      return 0;
    }
    const now = Date.now();
    const rows = list.map((s) => [s.id, s.node, s.state, s.image, String(s.cpu), `${s.memoryMiB}Mi`, age(now - s.createdAt), labelText(s.labels)]);
    out(table(['ID', 'NODE', 'STATE', 'IMAGE', 'CPU', 'MEM', 'AGE', 'LABELS'], rows));
    return 0;
  });
}

function exitCodeOf(err: unknown): number {
  if (err instanceof UsageError) return 2;
  if (err instanceof PaddockError) return ErrorCodes[err.code].fault === 'user' ? 2 : 1;
  return 1;
}

async function rmCmd(a: Args): Promise<number> {
  const ids = positionals(a, 1, Number.POSITIVE_INFINITY, 'rm <id>...');
  return withClient(a, async (pdk) => {
    const results = await Promise.allSettled(
      ids.map(async (id) => {
        const sb = await getSandbox(pdk, id);
        const before = sb.info.state;
        const info = await sb.kill();
        return { before, info };
      }),
    );
    let code = 0;
    results.forEach((r, i) => {
      const id = ids[i] as string;
      if (r.status === 'fulfilled') {
        const { before, info } = r.value;
        const ended = before === 'stopped' || before === 'failed';
        out(`${id}: ${ended ? 'already ' : ''}${info.state}${info.reason ? ` (${info.reason})` : ''}`);
      } else {
        const err = r.reason as unknown;
        note(err instanceof PaddockError ? `${id}: ${err.code}: ${err.message}` : `${id}: ${(err as Error).message}`);
        // The platform's failure outranks a bad id: 1 if any was the platform's, else 2.
        code = code === 1 ? 1 : exitCodeOf(err);
      }
    });
    return code;
  });
}

function infoText(s: SandboxInfo): string {
  const rows: [string, string][] = [
    ['id', s.id],
    ['state', s.state],
    ['node', s.node || '-'],
    ['backend', s.backend],
    ['image', s.image],
    ['cpu', String(s.cpu)],
    ['memory', `${s.memoryMiB} MiB`],
    ['labels', labelText(s.labels)],
    ['group', s.group ?? '-'],
    ['created', when(s.createdAt)],
  ];
  rows.push(s.endedAt === undefined ? ['expires', when(s.expiresAt)] : ['ended', when(s.endedAt)]);
  if (s.reason) rows.push(['reason', s.reason]);
  if (s.error) rows.push(['error', `${s.error.code}: ${s.error.message}`]);
  return rows.map(([k, v]) => `${`${k}:`.padEnd(9)} ${v}`).join('\n');
}

async function info(a: Args): Promise<number> {
  const [id] = positionals(a, 1, 1, 'info <id> [--json]');
  return withClient(a, async (pdk) => {
    const sb = await getSandbox(pdk, id as string);
    if (a.values.json) json(sb.info);
    else out(infoText(sb.info));
    return 0;
  });
}

/** `ls -l` style, setuid/setgid/sticky included (a world-writable /tmp should read as such). */
function modeText(e: FileEntry): string {
  let s = e.type === 'dir' ? 'd' : e.type === 'symlink' ? 'l' : e.type === 'file' ? '-' : '?';
  const special = [
    [0o4000, 's'],
    [0o2000, 's'],
    [0o1000, 't'],
  ] as const;
  special.forEach(([bit, mark], i) => {
    const bits = (e.mode >> (6 - 3 * i)) & 7;
    const x = bits & 1 ? (e.mode & bit ? mark : 'x') : e.mode & bit ? mark.toUpperCase() : '-';
    s += `${bits & 4 ? 'r' : '-'}${bits & 2 ? 'w' : '-'}${x}`;
  });
  return s;
}

async function files(a: Args): Promise<number> {
  const [verb, id, ...rest] = a.positionals;
  const usage = 'usage: paddock files get <id> <path> [dest|-] | files put <id> <src|-> <path> | files ls <id> <dir>';
  if (id === undefined) throw new UsageError(usage, verb === undefined || !['get', 'put', 'ls'].includes(verb));
  switch (verb) {
    case 'get': {
      const [path, dest] = rest;
      if (path === undefined || rest.length > 2) throw new UsageError(usage);
      return withClient(a, async (pdk) => {
        const data = await (await getSandbox(pdk, id)).files.read(path);
        if (dest === undefined || dest === '-') await new Promise<void>((resolve, reject) => process.stdout.write(data, (e) => (e ? reject(e) : resolve())));
        else await writeFile(dest, data);
        return 0;
      });
    }
    case 'put': {
      const [src, path] = rest;
      if (src === undefined || path === undefined || rest.length > 2) throw new UsageError(usage);
      // Read before connecting: a missing local file should not cost a round trip.
      const data = src === '-' ? await readStdin() : await readFile(src);
      const mode = src === '-' ? undefined : (await stat(src)).mode & 0o7777;
      return withClient(a, async (pdk) => {
        await (await getSandbox(pdk, id)).files.write(path, data, mode === undefined ? {} : { mode });
        return 0;
      });
    }
    case 'ls': {
      const [dir] = rest;
      if (dir === undefined || rest.length > 1) throw new UsageError(usage);
      return withClient(a, async (pdk) => {
        const entries = await (await getSandbox(pdk, id)).files.list(dir);
        if (a.values.json) json(entries);
        else {
          const rows = [...entries].sort((x, y) => x.name.localeCompare(y.name)).map((e) => [modeText(e), String(e.size), new Date(e.mtimeMs).toISOString(), e.name]);
          if (rows.length > 0) out(table(['MODE', 'SIZE', 'MODIFIED', 'NAME'], rows));
        }
        return 0;
      });
    }
    default:
      throw new UsageError(`files: unknown verb ${verb === undefined ? '' : `'${verb}'`}`, true);
  }
}

/** A node in the foreground: signals are forwarded so it can kill its sandboxes before it exits. */
async function nodeCmd(a: Args): Promise<number> {
  positionals(a, 0, 0, 'node');
  const natsUrl = a.values.nats ?? process.env.NATS_URL;
  if (!natsUrl) throw new UsageError('node: a node joins an existing NATS: set NATS_URL or pass --nats (or run `paddock up`)');
  const { cmd, args, env } = nodeCommand();
  const child = spawn(cmd, args, { stdio: 'inherit', env: { ...process.env, ...env, NATS_URL: natsUrl } });
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => child.kill(sig));
  return new Promise<number>((resolve, reject) => {
    child.on('error', reject);
    child.on('exit', (code, signal) => resolve(exitStatus(code, signal)));
  });
}

/** A child's end as a shell would report it: its code, or 128 + the signal that killed it. */
function exitStatus(code: number | null, signal: NodeJS.Signals | null): number {
  if (code !== null) return code;
  return signal ? 128 + (constants.signals[signal] ?? 0) : 1;
}

/** Whether something accepts connections at a nats:// URL: tells a live `paddock up` from a stale URL file. */
function reachable(url: string, timeoutMs = 1000): Promise<boolean> {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return Promise.resolve(false);
  }
  return new Promise((resolve) => {
    const sock = createConnection({ host: u.hostname, port: Number(u.port || 4222) });
    const done = (ok: boolean) => {
      sock.destroy();
      resolve(ok);
    };
    sock.setTimeout(timeoutMs, () => done(false));
    sock.once('connect', () => done(true));
    sock.once('error', () => done(false));
  });
}

const UP_DETACHED = 'PADDOCK_UP_DETACHED';

/**
 * `up` runs its work in a child in a session of its own, so that a terminal's Ctrl-C (sent to the
 * whole foreground process group) reaches only this process, which forwards it. Otherwise
 * nats-server would die at once, before the node could record its sandboxes' end through it.
 */
async function up(a: Args): Promise<number> {
  positionals(a, 0, 0, 'up');
  if (process.env[UP_DETACHED] === '1') return upDetached(a);
  const script = process.argv[1];
  if (script === undefined) throw new Error('cannot tell which script to run');
  const child = spawn(process.execPath, [...process.execArgv, script, ...process.argv.slice(2)], {
    detached: true,
    // fd 3 is a lifeline: if this process dies without forwarding a signal, the child sees EOF.
    stdio: ['ignore', 'inherit', 'inherit', 'pipe'],
    env: { ...process.env, [UP_DETACHED]: '1' },
  });
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => child.kill(sig));
  return new Promise<number>((resolve, reject) => {
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      child.stdio[3]?.destroy();
      resolve(exitStatus(code, signal));
    });
  });
}

async function upDetached(a: Args): Promise<number> {
  // Not for the node and nats-server this process starts: they are no `up`.
  delete process.env[UP_DETACHED];
  const home = process.env.PADDOCK_HOME || DEFAULT_HOME;
  const urlFile = natsUrlFile(home);
  const joinUrl = a.values.nats ?? process.env.NATS_URL;
  const nodeId = sanitizeId(process.env.PADDOCK_NODE_ID || hostname());

  let nats: EmbeddedNats | undefined;
  let node: NodeProcess | undefined;
  let starting: Promise<NodeProcess> | undefined;
  let wroteUrl: string | undefined;
  let stopping = false;

  const teardown = async () => {
    // startNode hands out no process until the node is ready: wait for it, then stop it, so a
    // Ctrl-C during the first start (busybox layer build) leaves no node behind.
    if (!node && starting !== undefined) node = await starting.catch(() => undefined);
    await node?.stop();
    await nats?.stop();
    if (wroteUrl !== undefined) {
      const now = await readFile(urlFile, 'utf8').catch(() => '');
      if (now.trim() === wroteUrl) await rm(urlFile, { force: true });
    }
  };
  const shutdown = (why: string, code: number) => {
    if (stopping) return;
    stopping = true;
    process.stderr.write(`paddock: ${why}: stopping (the node kills its sandboxes)…\n`);
    teardown().then(
      () => {
        process.stderr.write('paddock: stopped\n');
        process.exit(code);
      },
      (err: unknown) => {
        note(`stop failed: ${(err as Error).message}`);
        process.exit(1);
      },
    );
  };
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => shutdown(sig, 0));
  const lifeline = new Socket({ fd: 3, readable: true, writable: false });
  lifeline.on('error', () => {});
  lifeline.on('close', () => shutdown('the foreground paddock process is gone', 0));
  lifeline.resume();

  try {
    let natsUrl: string;
    if (joinUrl) {
      natsUrl = joinUrl;
      process.stderr.write(`paddock: joining NATS at ${natsUrl}\n`);
    } else {
      const previous = (await readFile(urlFile, 'utf8').catch(() => '')).trim();
      if (previous && (await reachable(previous))) {
        throw new PaddockError('INVALID_STATE', `Paddock is already up at ${previous} (${urlFile}); stop it first, or set PADDOCK_HOME or NATS_URL`);
      }
      process.stderr.write(`paddock: starting nats-server (data in ${join(home, 'nats')})\n`);
      nats = await startNats({ dataDir: join(home, 'nats') });
      natsUrl = nats.url;
      const n = nats;
      n.proc.once('exit', (c, s) => shutdown(`nats-server exited (${s ?? c})`, 1));
      // Write then rename: a client never reads a half-written URL.
      await mkdir(home, { recursive: true });
      await writeFile(`${urlFile}.tmp`, `${natsUrl}\n`);
      await rename(`${urlFile}.tmp`, urlFile);
      wroteUrl = natsUrl;
    }
    if (stopping) return await new Promise<never>(() => {});
    process.stderr.write(`paddock: starting node ${nodeId} (it builds the busybox base layer when missing)\n`);
    starting = startNode({ natsUrl, home, id: nodeId, inheritLogs: false });
    node = await starting;
    const nd = node;
    void nd.exited.then((c) => shutdown(`node ${nd.id} exited with code ${c}; see ${nd.logFile ?? 'its log'}`, 1));
    if (stopping) return await new Promise<never>(() => {});

    out(`Paddock is up.
  NATS:  ${natsUrl}${nats ? ` (embedded nats-server, pid ${nats.proc.pid}; URL written to ${urlFile})` : ' (joined)'}
  node:  ${nodeId} (pid ${node.proc.pid}${process.env.PADDOCK_PLACEMENT === '0' ? '' : ', with a placement replica'}), home ${home}
  logs:  ${node.logFile ?? 'this terminal'}${wroteUrl === undefined ? '' : `\n\nOn this host the SDK and the CLI find it without NATS_URL${home === DEFAULT_HOME ? '' : ` (given PADDOCK_HOME=${home})`}.`}

Use it from another shell:
  export NATS_URL=${natsUrl}
  ${SELF} create --label job=demo          # prints a sandbox id
  ${SELF} exec <id> -- sh -c 'echo hello from $(hostname)'
  ${SELF} ps
  ${SELF} rm <id>

Or from TypeScript:
  import { Paddock } from 'paddock';
  const pdk = await Paddock.connect({ servers: '${natsUrl}' });
  const sb = await pdk.sandboxes.create({ image: 'busybox', labels: { job: 'demo' } });
  console.log((await sb.exec(['echo', 'hello'])).stdout);
  await sb.kill();
  await pdk.close();

Ctrl-C stops the node (killing its sandboxes)${nats ? ' and nats-server' : ''}.`);
    return await new Promise<never>(() => {});
  } catch (err) {
    // A shutdown already under way owns the teardown and the exit.
    if (stopping) return await new Promise<never>(() => {});
    stopping = true;
    await teardown().catch(() => {});
    lifeline.destroy();
    throw err;
  }
}

// --- main -------------------------------------------------------------------------------------

async function main(argv: string[]): Promise<number> {
  const i = argv.findIndex((w, k) => !w.startsWith('-') && argv[k - 1] !== '--nats' && argv[k - 1] !== '--timeout');
  if (argv[i] === 'image') return imageCli(argv.slice(0, i), argv.slice(i + 1));
  if (argv[i] === 'fn') return fnCli(argv.slice(0, i), argv.slice(i + 1));
  const a = parse(argv);
  switch (a.cmd) {
    case 'help':
      out(USAGE);
      return 0;
    case 'up':
      return up(a);
    case 'node':
      return nodeCmd(a);
    case 'create':
      return create(a);
    case 'exec':
      return exec(a);
    case 'ps':
      return ps(a);
    case 'rm':
      return rmCmd(a);
    case 'info':
      return info(a);
    case 'files':
      return files(a);
    case 'chronus':
      return chronus(a);
  }
}

/** `image …` (runtime/images/cli.ts does the work; it has flags of its own). */
async function imageCli(globalArgs: string[], rest: string[]): Promise<number> {
  const g = parseArgs({ args: globalArgs, options: GLOBAL, strict: true }).values;
  try {
    return await imageCommand(rest, {
      out,
      err: process.stderr,
      connect: () => Paddock.connect({ servers: g.nats, timeoutMs: positiveNumber('timeout', g.timeout, true), name: 'paddock-cli' }),
    });
  } catch (err) {
    if (err instanceof ImageUsageError) throw new UsageError(`image: ${err.message}`);
    if (err instanceof ProtocolError && ErrorCodes[err.code].fault === 'user') throw new UsageError(`image: ${err.message}`);
    throw err;
  }
}

/** `fn …` (runtime/fncall/cli.ts does the work; it has flags of its own). */
async function fnCli(globalArgs: string[], rest: string[]): Promise<number> {
  const g = parseArgs({ args: globalArgs, options: GLOBAL, strict: true }).values;
  try {
    return await fnCommand(rest, {
      out,
      stdout: process.stdout,
      stderr: process.stderr,
      stdin: process.stdin,
      connect: () => Paddock.connect({ servers: g.nats, timeoutMs: positiveNumber('timeout', g.timeout, true), name: 'paddock-cli' }),
    });
  } catch (err) {
    if (err instanceof FnUsageError) throw new UsageError(`fn: ${err.message}`);
    throw err;
  }
}

/** `chronus export <rolloutId> [file|-]` (chronus/cli.ts does the work). */
async function chronus(a: Args): Promise<number> {
  const [verb, id, dest, ...rest] = a.positionals;
  if (verb !== 'export' || id === undefined || rest.length > 0) throw new UsageError('usage: paddock chronus export <rolloutId> [file|-]', verb !== 'export');
  return withClient(a, async (pdk) => {
    const n = await exportCommand(pdk.nc, id, dest);
    if (dest !== undefined && dest !== '-') note(`wrote ${n} steps of rollout ${id} to ${dest}`);
    return 0;
  });
}

// A reader that goes away early (`paddock files get … | head`) is no failure: the write that hit
// the closed pipe ends the command quietly, as 128 + SIGPIPE, instead of an unhandled 'error'.
const SIGPIPE_EXIT = 141;
for (const stream of [process.stdout, process.stderr]) stream.on('error', () => {});

/** Says what went wrong on stderr and picks the exit status. */
function report(err: unknown): number {
  if (err instanceof Error && (err as NodeJS.ErrnoException).code === 'EPIPE') return SIGPIPE_EXIT;
  if (err instanceof UsageError) {
    note(err.message);
    process.stderr.write(err.showUsage ? `\n${USAGE}` : "Run 'paddock help' for usage.\n");
  } else if (err instanceof PaddockError) {
    note(`${err.code}: ${err.message}`);
  } else {
    note(err instanceof Error ? err.message : String(err));
  }
  return exitCodeOf(err);
}

try {
  process.exitCode = await main(process.argv.slice(2));
} catch (err) {
  process.exitCode = report(err);
}
