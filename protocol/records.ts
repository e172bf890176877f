/**
 * The command log's record format: the one module that knows how a step is stored, and the one
 * rule for replaying a recorded step (the node's journal and the SDK's prefetched replay both use it).
 *
 * Each step of a rollout lives on its own subject `pdk.v1.chronus.<rolloutId>.<step>` and holds at
 * most two records, in this order: `started` (written, with the request, before the command runs)
 * and `result` (written after, before the caller gets its answer). The last record on the subject
 * says where the step stands. Records are MessagePack maps with a version `v`; `decodeRecord`
 * accepts every version ever written and returns the current shape, so a rollout recorded by an
 * older Paddock still replays (test/fixtures/chronus holds such recordings).
 *
 * Request equality is a digest, not a byte comparison: the digest's algorithm is named inside it
 * (`d1:…`), so a later algorithm can be added without breaking logs that carry the old one.
 */
import { createHash } from 'node:crypto';
import { decode, encode } from './codec.ts';
import { isErrorCode, ProtocolError, type WireError } from './errors.ts';
import type { ExecResult, RolloutRecord } from './schema.ts';
import { isToken } from './subjects.ts';

export { newRolloutId } from './ids.ts';
export type { RolloutRecord } from './schema.ts';

/** The version new records are written with. */
export const RECORD_VERSION = 1;

export type StepOp = 'exec' | 'write';

/** What an exec step asked for, as recorded. */
export interface ExecStepRequest {
  cmd: string[];
  cwd?: string;
  env?: Record<string, string>;
  /** Left out (with `stdinSize` kept) when the record would not fit a message. */
  stdin?: Uint8Array;
  stdinSize?: number;
  timeoutMs: number;
  maxOutputBytes: number;
}

/** What a write step asked for, as recorded. `data` is left out when it would not fit a message. */
export interface WriteStepRequest {
  path: string;
  data?: Uint8Array;
  size: number;
  offset?: number;
  mode?: number;
}

/** An exec's result is stored as the node answered it (output within the exec's caps). */
export type ExecStepResult = Omit<ExecResult, 'replayed'>;

export interface WriteStepResult {
  size: number;
}

interface RecordBase {
  v: number;
  rolloutId: string;
  step: number;
  digest: string;
  /** A short human description (`exec sh -c 'make test'`), for error messages and listings. */
  what: string;
  sandbox: string;
  node: string;
  /** ms since the epoch. */
  startedAt: number;
}

export type StartedRecord = RecordBase & {
  kind: 'started';
  /** The node process that claimed the step (a node restarted under the same id has a new one). */
  boot: string;
  /** Unique per claim: lets a node recognise its own claim after an ambiguous publish. */
  claim: string;
  /** After this (ms since the epoch) a step with no result can no longer be running anywhere. */
  deadline: number;
} & ({ op: 'exec'; request: ExecStepRequest } | { op: 'write'; request: WriteStepRequest });

export type Outcome<T> = { ok: true; result: T } | { ok: false; error: WireError };

export type ResultRecord = RecordBase & {
  kind: 'result';
  endedAt: number;
} & ({ op: 'exec'; outcome: Outcome<ExecStepResult> } | { op: 'write'; outcome: Outcome<WriteStepResult> });

export type StepRecord = StartedRecord | ResultRecord;

// ─── Digests ────────────────────────────────────────────────────────────────────────────────────

const sha256 = (data: Uint8Array | string) => createHash('sha256').update(data).digest('hex');

/**
 * Digest algorithm 1. Canonical JSON of the fields that define what a step does: an exec's cmd,
 * cwd, env (sorted) and stdin; a write's path, data, offset and mode. Limits (timeout, output cap)
 * are not part of it: a trainer restarted with another timeout still replays. Absent and empty are
 * the same (no env = `{}`, no stdin = empty stdin). Never change this function: add a `d2`.
 */
function digestV1(op: StepOp, req: { cmd?: string[]; cwd?: string; env?: Record<string, string>; stdin?: Uint8Array; path?: string; data?: Uint8Array; offset?: number; mode?: number }): string {
  const bytes = (b: Uint8Array | undefined) => (b && b.length > 0 ? sha256(b) : null);
  const canonical =
    op === 'exec'
      ? ['exec', req.cmd ?? [], req.cwd ?? null, Object.entries(req.env ?? {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)), bytes(req.stdin)]
      : ['write', req.path ?? '', sha256(req.data ?? new Uint8Array(0)), req.offset ?? null, req.mode ?? null];
  return `d1:${sha256(JSON.stringify(canonical))}`;
}

const DIGESTS: Record<string, typeof digestV1> = { d1: digestV1 };
const CURRENT_DIGEST = 'd1';

export type DigestInput = Parameters<typeof digestV1>[1];

/** The digest of a request with the current algorithm, or with the one `like` was made with. */
export function requestDigest(op: StepOp, req: DigestInput, like?: string): string {
  const algo = like === undefined ? CURRENT_DIGEST : like.slice(0, like.indexOf(':'));
  const f = DIGESTS[algo];
  if (!f) throw new ProtocolError('INTERNAL', `the command log uses request digest '${algo}', unknown to this Paddock: upgrade it`);
  return f(op, req);
}

/** Whether a request is the one a record holds (same op, same digest under the record's algorithm). */
export function sameRequest(rec: StepRecord, op: StepOp, req: DigestInput): boolean {
  return rec.op === op && requestDigest(op, req, rec.digest) === rec.digest;
}

// ─── Replay ─────────────────────────────────────────────────────────────────────────────────────

/**
 * The replay rule, part one: a step recorded with another request (another command, other bytes)
 * is REPLAY_MISMATCH — the trainer is not replaying what it did. `asked` describes the new request.
 */
export function assertSameRequest(rec: StepRecord, op: StepOp, req: DigestInput, asked: string): void {
  if (!sameRequest(rec, op, req)) throw replayMismatch(rec, rec.what, asked);
}

export function replayMismatch(key: { rolloutId: string; step: number }, recorded: string, asked: string): ProtocolError {
  return new ProtocolError('REPLAY_MISMATCH', `step ${key.step} of rollout ${key.rolloutId} is recorded as \`${recorded}\`, not \`${asked}\`: the trainer is not replaying what it did`, {
    detail: { rolloutId: key.rolloutId, step: key.step, recorded, asked },
  });
}

/**
 * The replay rule, part two: a recorded result is answered again as it was, marked `replayed` —
 * its result, or its error (thrown, with the step in its detail). A `started` record is not
 * settled by this rule: whether it may run again is the node's call (its journal knows claims).
 */
export function recordedOutcome(rec: ResultRecord): { replayed: true } & Record<string, unknown> {
  const o = rec.outcome;
  if (o.ok) return { ...o.result, replayed: true };
  const code = isErrorCode(o.error.code) ? o.error.code : 'INTERNAL';
  throw new ProtocolError(code, o.error.message, { detail: { ...o.error.detail, replayed: true, rolloutId: rec.rolloutId, step: rec.step } });
}

// ─── Encoding ───────────────────────────────────────────────────────────────────────────────────

export function encodeRecord(rec: StepRecord): Uint8Array {
  return encode(rec);
}

function bad(what: string): never {
  throw new ProtocolError('INTERNAL', `command log record: ${what}`);
}

function isRecordMap(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x) && !(x instanceof Uint8Array);
}

/** Checks a version-1 record's shape; the values it holds came from a node, not a caller. */
function fromV1(r: Record<string, unknown>): StepRecord {
  if (!isToken(r.rolloutId) || typeof r.step !== 'number' || typeof r.digest !== 'string') bad('missing rolloutId, step or digest');
  if (r.op !== 'exec' && r.op !== 'write') bad(`unknown op ${JSON.stringify(r.op)}`);
  if (r.kind === 'started') {
    if (!isRecordMap(r.request)) bad('a started record without its request');
    return r as unknown as StartedRecord;
  }
  if (r.kind === 'result') {
    const o = r.outcome;
    if (!isRecordMap(o) || (o.ok === true ? !isRecordMap(o.result) : !isRecordMap(o.error))) bad('a result record without its outcome');
    // Results recorded before exec verdicts existed: the verdict their flags imply (as the node gives it).
    const res = o.result as Record<string, unknown> | undefined;
    if (r.op === 'exec' && res && res.verdict === undefined) res.verdict = res.timedOut ? 'TIMEOUT' : res.truncated ? 'OUTPUT_LIMIT' : 'OK';
    return r as unknown as ResultRecord;
  }
  bad(`unknown kind ${JSON.stringify(r.kind)}`);
}

/**
 * Decodes a stored record of any version into the current shape. A record newer than this
 * Paddock is refused rather than half-understood: replaying it wrongly would be worse.
 */
export function decodeRecord(data: Uint8Array): StepRecord {
  const r = decode(data);
  if (!isRecordMap(r)) bad('not a map');
  switch (r.v) {
    case 1:
      return fromV1(r);
    default:
      if (typeof r.v === 'number' && r.v > RECORD_VERSION) {
        throw new ProtocolError('INTERNAL', `command log record version ${r.v} is newer than this Paddock understands (${RECORD_VERSION}): upgrade it`);
      }
      bad(`unknown version ${JSON.stringify(r.v)}`);
  }
}

// ─── Rollouts ───────────────────────────────────────────────────────────────────────────────────

export function decodeRolloutRecord(data: Uint8Array): RolloutRecord {
  return asRolloutRecord(decode(data));
}

/** A decoded `pdk_rollouts` value as a rollout record, or CORRUPT_LOG. */
export function asRolloutRecord(r: unknown): RolloutRecord {
  if (!isRecordMap(r) || r.v !== 1 || !isToken(r.rolloutId) || typeof r.sandbox !== 'string') bad('not a rollout record');
  return r as unknown as RolloutRecord;
}

const WHAT_MAX = 200;

function cut(s: string): string {
  return s.length > WHAT_MAX ? `${s.slice(0, WHAT_MAX - 1)}…` : s;
}

/** `exec sh -c 'echo hi'`: an argv as a person would type it, cut short. */
export function describeExec(cmd: readonly string[]): string {
  const words = cmd.map((a) => (/^[A-Za-z0-9_./=:@%+-]+$/.test(a) ? a : `'${a.replace(/'/g, `'\\''`)}'`));
  return cut(`exec ${words.join(' ')}`);
}

export function describeWrite(path: string, size: number, offset?: number): string {
  return cut(`write ${path} (${size} bytes${offset !== undefined ? ` at ${offset}` : ''})`);
}
