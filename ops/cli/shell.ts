/**
 * `paddock shell <id>`: a terminal in a sandbox. On a terminal, this one goes raw (every key goes
 * to the sandbox, Ctrl-C included), follows its size, and is restored however the shell ends.
 * With stdin not a terminal (a pipe, a file, a test) there is nothing to make raw or to size: the
 * command (default `sh`) runs as a background process without a terminal, with this stdin
 * streamed to its stdin and its stdout and stderr kept apart, as `exec` would, but unbounded in
 * time and input.
 */
import { isToken } from '../../protocol/index.ts';
import { NotFoundError, type Paddock, type ProcessHandle, type Sandbox } from '../../sdk/index.ts';
import type { Args } from './args.ts';
import { note, pairs, UsageError, withClient } from './common.ts';

async function getSandbox(pdk: Paddock, id: string): Promise<Sandbox> {
  if (!isToken(id)) throw new NotFoundError('NOT_FOUND', `sandbox ${JSON.stringify(id)} does not exist`);
  return pdk.sandboxes.get(id);
}

/**
 * Sends what is read to the process one message at a time: bytes that arrive while one is on its
 * way go together in the next, so a fast typist (or a paste) costs few round trips, in order.
 */
function forwarder(p: ProcessHandle, onError: (err: unknown) => void) {
  let pending: Buffer[] = [];
  let busy = false;
  const flush = async () => {
    busy = true;
    try {
      while (pending.length > 0) {
        const data = Buffer.concat(pending);
        pending = [];
        await p.write(data);
      }
    } catch (err) {
      onError(err);
    } finally {
      busy = false;
    }
  };
  return {
    push(d: Buffer) {
      pending.push(d);
      if (!busy) void flush();
    },
    async drained() {
      while (busy || pending.length > 0) {
        if (!busy) await flush();
        else await new Promise((r) => setTimeout(r, 5));
      }
    },
  };
}

export async function shell(a: Args): Promise<number> {
  const [id, ...cmd] = a.positionals;
  if (id === undefined) throw new UsageError('usage: paddock shell <id> [--cwd DIR] [--env K=V]... [-- <cmd> [args...]]');
  const env = pairs('env', a.values.env);
  const cwd = a.values.cwd;
  const opts = { ...(cwd !== undefined ? { cwd } : {}), ...(env ? { env } : {}) };
  return withClient({ nats: a.values.nats }, async (pdk) => {
    const sb = await getSandbox(pdk, id);
    return process.stdin.isTTY ? terminal(sb, cmd, opts) : piped(sb, cmd, opts);
  });
}

async function terminal(sb: Sandbox, cmd: string[], opts: { cwd?: string; env?: Record<string, string> }): Promise<number> {
  const size = () => ({ cols: process.stdout.columns || 80, rows: process.stdout.rows || 24 });
  const pty = await sb.pty.create({ ...size(), ...(cmd.length > 0 ? { cmd } : {}), ...opts });
  let failed: unknown;
  const input = forwarder(pty, (err) => {
    failed ??= err;
  });
  const onData = (d: Buffer) => input.push(d);
  const onResize = () => {
    const s = size();
    pty.resize(s.cols, s.rows).catch(() => {});
  };
  // A hung-up or terminated client hangs up the shell too, as ssh does; the loop below then ends
  // with it and the terminal is restored.
  const onHangup = () => {
    pty.kill('SIGHUP').catch(() => {});
  };
  process.on('SIGHUP', onHangup).on('SIGTERM', onHangup);
  const stdin = process.stdin;
  stdin.setRawMode(true);
  stdin.on('data', onData);
  stdin.resume();
  process.stdout.on('resize', onResize);
  try {
    for await (const chunk of pty) {
      if (!process.stdout.write(chunk)) await new Promise((r) => process.stdout.once('drain', r));
      if (failed) throw failed;
    }
    return (await pty.wait()).exitCode;
  } finally {
    process.stdout.off('resize', onResize);
    process.off('SIGHUP', onHangup).off('SIGTERM', onHangup);
    stdin.off('data', onData);
    stdin.setRawMode(false);
    stdin.pause();
  }
}

async function piped(sb: Sandbox, cmd: string[], opts: { cwd?: string; env?: Record<string, string> }): Promise<number> {
  const p = await sb.processes.start(cmd.length > 0 ? cmd : ['/bin/sh'], opts);
  let failed: unknown;
  const input = forwarder(p, (err) => {
    failed ??= err;
  });
  const feeding = (async () => {
    for await (const d of process.stdin) input.push(d as Buffer);
    await input.drained();
    await p.closeStdin().catch(() => {});
  })();
  feeding.catch((err: unknown) => {
    failed ??= err;
  });
  for await (const ev of p.output()) {
    if (ev.type === 'exit') {
      if (failed) note(`input: ${failed instanceof Error ? failed.message : String(failed)}`);
      return ev.exitCode;
    }
    if (ev.type === 'gap') {
      note(`${ev.bytes} bytes of ${ev.stream} were dropped before they could be read`);
      continue;
    }
    const to = ev.type === 'stdout' ? process.stdout : process.stderr;
    if (!to.write(ev.data)) await new Promise((r) => to.once('drain', r));
  }
  return (await p.wait()).exitCode;
}
