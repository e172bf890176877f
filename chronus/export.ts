/**
 * A rollout's trajectory as JSONL, for training data: one line per step, in step order, with what
 * was asked (command or write), what came back (output, exit code), when, and where.
 *
 * `status` is `ok`, `error` (the step failed: `error` says how; replays return the same error) or
 * `unknown` (a `started` record with no result: the step was in flight, or its node died then).
 * Text that is not UTF-8 comes as `<field>Base64` instead.
 */
import type { NatsConnection } from '@nats-io/transport-node';
import { readRollout } from './log.ts';
import type { ResultRecord, StartedRecord } from './record.ts';

const strict = new TextDecoder('utf-8', { fatal: true });

/** `{ [name]: text }` when the bytes are UTF-8, else `{ [name + 'Base64']: … }`. */
function text(name: string, bytes: Uint8Array | undefined): Record<string, string> {
  if (bytes === undefined) return {};
  try {
    return { [name]: strict.decode(bytes) };
  } catch {
    return { [`${name}Base64`]: Buffer.from(bytes).toString('base64') };
  }
}

const iso = (ms: number | undefined) => (ms === undefined ? undefined : new Date(ms).toISOString());

/** One step's line from its records (either may be missing). */
export function stepLine(started: StartedRecord | undefined, result: ResultRecord | undefined): Record<string, unknown> {
  const head = (started ?? result) as StartedRecord | ResultRecord;
  const line: Record<string, unknown> = { rolloutId: head.rolloutId, step: head.step, op: head.op, what: head.what };
  if (started?.op === 'exec') {
    const q = started.request;
    Object.assign(line, { cmd: q.cmd, cwd: q.cwd, env: q.env, ...text('stdin', q.stdin), stdinSize: q.stdinSize, timeoutMs: q.timeoutMs });
  } else if (started?.op === 'write') {
    const q = started.request;
    Object.assign(line, { path: q.path, size: q.size, offset: q.offset, mode: q.mode, ...text('data', q.data) });
  }
  if (!result) line.status = 'unknown';
  else if (!result.outcome.ok) Object.assign(line, { status: 'error', error: { code: result.outcome.error.code, message: result.outcome.error.message } });
  else if (result.op === 'exec' && result.outcome.ok) {
    const r = result.outcome.result;
    Object.assign(line, {
      status: 'ok',
      exitCode: r.exitCode,
      signal: r.signal,
      verdict: r.verdict,
      ...text('stdout', r.stdout),
      ...text('stderr', r.stderr),
      truncated: r.truncated,
      timedOut: r.timedOut,
      durationMs: r.durationMs,
    });
  } else if (result.op === 'write' && result.outcome.ok) Object.assign(line, { status: 'ok', size: result.outcome.result.size });
  Object.assign(line, { startedAt: iso(head.startedAt), endedAt: iso(result?.endedAt), sandbox: head.sandbox, node: head.node, v: head.v });
  return line;
}

/**
 * Writes the rollout's steps to `write`, one JSON line each (with its newline stripped: `write`
 * gets the line alone). Returns the number of steps.
 */
export async function exportRollout(nc: NatsConnection, rolloutId: string, write: (line: string) => void | Promise<void>): Promise<number> {
  const steps = new Map<number, { started?: StartedRecord; result?: ResultRecord }>();
  for (const { record } of await readRollout(nc, rolloutId, 'all')) {
    const s = steps.get(record.step) ?? {};
    if (record.kind === 'started') s.started = record;
    else s.result = record;
    steps.set(record.step, s);
  }
  for (const step of [...steps.keys()].sort((a, b) => a - b)) {
    const s = steps.get(step) as { started?: StartedRecord; result?: ResultRecord };
    await write(JSON.stringify(stepLine(s.started, s.result)));
  }
  return steps.size;
}
