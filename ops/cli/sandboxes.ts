/** `create`, `exec`, `ps`, `rm`, `info`, `files`: sandboxes driven through the SDK. */
import { readFile, stat, writeFile } from 'node:fs/promises';
import { type BackendKind, Backends, isToken, Limits } from '../../protocol/index.ts';
import { type CreateSpec, type FileEntry, NotFoundError, type Paddock, PaddockError, type Sandbox, type SandboxInfo } from '../../sdk/index.ts';
import { type Args, positionals } from './args.ts';
import { age, exitCodeOf, json, note, out, pairs, positiveNumber, readStdin, SIGPIPE_EXIT, table, UsageError, withClient } from './common.ts';

/** Ids become NATS subject tokens: one that cannot be a token cannot name a sandbox either. */
async function getSandbox(pdk: Paddock, id: string): Promise<Sandbox> {
  if (!isToken(id)) throw new NotFoundError('NOT_FOUND', `sandbox ${JSON.stringify(id)} does not exist`);
  return pdk.sandboxes.get(id);
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

export async function create(a: Args): Promise<number> {
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
  return withClient(a.values, async (pdk) => {
    const sb = await pdk.sandboxes.create(spec);
    if (v.json) json(sb.info);
    else out(sb.id);
    return 0;
  });
}

export async function exec(a: Args): Promise<number> {
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
  return withClient({ nats: a.values.nats }, async (pdk) => {
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
        if (ev.type === 'gap') {
          note(`${ev.bytes} bytes of output were lost (NATS was away for longer than the node keeps output)`);
          continue;
        }
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

export async function ps(a: Args): Promise<number> {
  positionals(a, 0, 0, 'ps [--label k=v]... [--group G] [--all] [--json]');
  const v = a.values;
  const labels = pairs('label', v.label);
  return withClient(a.values, async (pdk) => {
    const list = await pdk.sandboxes.list({ ...(labels ? { labels } : {}), ...(v.group !== undefined ? { group: v.group } : {}), all: v.all === true });
    if (v.json) {
      json(list);
      return 0;
    }
    const now = Date.now();
    const rows = list.map((s) => [s.id, s.node, s.state, imageText(s), String(s.cpu), `${s.memoryMiB}Mi`, age(now - s.createdAt), labelText(s.labels)]);
    out(table(['ID', 'NODE', 'STATE', 'IMAGE', 'CPU', 'MEM', 'AGE', 'LABELS'], rows));
    return 0;
  });
}

export async function rmCmd(a: Args): Promise<number> {
  const ids = positionals(a, 1, Number.POSITIVE_INFINITY, 'rm <id>...');
  return withClient(a.values, async (pdk) => {
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

/** The image as composed: `base+toolkit+workspace`. */
function imageText(s: SandboxInfo): string {
  return [s.image, s.toolkit, s.workspace].filter(Boolean).join('+');
}

function infoText(s: SandboxInfo): string {
  const rows: [string, string][] = [
    ['id', s.id],
    ['state', s.state],
    ['node', s.node || '-'],
    ['backend', s.backend],
    ['image', s.image],
    ...(s.toolkit ? [['toolkit', s.toolkit] as [string, string]] : []),
    ...(s.workspace ? [['workspace', s.workspace] as [string, string]] : []),
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

export async function info(a: Args): Promise<number> {
  const [id] = positionals(a, 1, 1, 'info <id> [--json]');
  return withClient(a.values, async (pdk) => {
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

export async function files(a: Args): Promise<number> {
  const [verb, id, ...rest] = a.positionals;
  const usage = 'usage: paddock files get <id> <path> [dest|-] | files put <id> <src|-> <path> | files ls <id> <dir>';
  if (id === undefined) throw new UsageError(usage, verb === undefined || !['get', 'put', 'ls'].includes(verb));
  switch (verb) {
    case 'get': {
      const [path, dest] = rest;
      if (path === undefined || rest.length > 2) throw new UsageError(usage);
      return withClient(a.values, async (pdk) => {
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
      // A local file that cannot be read is the caller's fault (exit 2), like a bad argument.
      const local = <T>(p: Promise<T>) =>
        p.catch((e: NodeJS.ErrnoException) => {
          throw new UsageError(`files put: cannot read ${src}: ${e.code ?? e.message}`);
        });
      const data = src === '-' ? await readStdin() : await local(readFile(src));
      const mode = src === '-' ? undefined : (await local(stat(src))).mode & 0o7777;
      return withClient(a.values, async (pdk) => {
        await (await getSandbox(pdk, id)).files.write(path, data, mode === undefined ? {} : { mode });
        return 0;
      });
    }
    case 'ls': {
      const [dir] = rest;
      if (dir === undefined || rest.length > 1) throw new UsageError(usage);
      return withClient(a.values, async (pdk) => {
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
