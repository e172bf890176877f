/**
 * Validation of requests at the edge: everything a handler uses has passed through here, so
 * handlers never see a negative memory size or a command that is not an array of strings.
 */
import { ProtocolError } from './errors.ts';
import { Backends, type BackendKind, type ExecRequest, type IdleAction, IdleActions, type QosClass, QosClasses, type SandboxSpec } from './messages.ts';
import { isToken } from './subjects.ts';

export const Limits = {
  cpu: { min: 0.01, max: 64, default: 1 },
  memoryMiB: { min: 16, max: 256 * 1024, default: 256 },
  pidsLimit: { min: 8, max: 65536, default: 1024 },
  ttlSec: { min: 1, max: 7 * 24 * 3600, default: 3600 },
  idleTimeoutSec: { min: 1, max: 7 * 24 * 3600, default: 0 },
  labels: { max: 64, keyMax: 63, valueMax: 256 },
  env: { max: 512, bytesMax: 128 * 1024 },
  exec: {
    argsMax: 65536,
    argBytesMax: 1024 * 1024,
    timeoutMs: { min: 1, max: 24 * 3600 * 1000, default: 60_000 },
    maxOutputBytes: { min: 0, max: 64 * 1024 * 1024, default: 1024 * 1024 },
    stdinMax: 4 * 1024 * 1024,
  },
  files: { pathMax: 4096, chunkMax: 4 * 1024 * 1024 },
  /** Largest request accepted before decoding: a sandbox verb (a 4 MiB file chunk or stdin + room). */
  requestBytesMax: 6 * 1024 * 1024,
  /** Largest create request (a spec is small; env and labels bound it). */
  createBytesMax: 512 * 1024,
} as const;

const LABEL_KEY = /^[A-Za-z0-9][A-Za-z0-9_./-]*$/;
const ENV_KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;
const IMAGE = /^[a-z0-9][a-z0-9._-]{0,127}(:[A-Za-z0-9._-]{1,128})?$/;

function invalid(field: string, message: string): never {
  throw new ProtocolError('INVALID_SPEC', `${field}: ${message}`, { detail: { field } });
}

function isRecord(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x) && !(x instanceof Uint8Array);
}

function num(field: string, v: unknown, r: { min: number; max: number; default: number }, integer: boolean): number {
  if (v === undefined || v === null) return r.default;
  if (typeof v !== 'number' || !Number.isFinite(v)) invalid(field, `must be a number, got ${JSON.stringify(v)}`);
  if (integer && !Number.isInteger(v)) invalid(field, `must be an integer, got ${v}`);
  if (v < r.min || v > r.max) invalid(field, `must be between ${r.min} and ${r.max}, got ${v}`);
  return v;
}

function stringMap(field: string, v: unknown, max: number, keyOk: (k: string) => boolean, valueMax: number): Record<string, string> {
  if (v === undefined || v === null) return {};
  if (!isRecord(v)) invalid(field, 'must be a map of strings');
  const entries = Object.entries(v);
  if (entries.length > max) invalid(field, `at most ${max} entries, got ${entries.length}`);
  const out: Record<string, string> = {};
  for (const [k, val] of entries) {
    if (!keyOk(k)) invalid(field, `bad key ${JSON.stringify(k.slice(0, 80))}`);
    if (typeof val !== 'string') invalid(field, `value of ${k} must be a string`);
    if (val.length > valueMax) invalid(field, `value of ${k} longer than ${valueMax}`);
    out[k] = val;
  }
  return out;
}

function envMap(field: string, v: unknown): Record<string, string> {
  const env = stringMap(field, v, Limits.env.max, (k) => ENV_KEY.test(k) && k.length <= 256, Limits.env.bytesMax);
  let bytes = 0;
  for (const [k, val] of Object.entries(env)) bytes += k.length + val.length + 2;
  if (bytes > Limits.env.bytesMax) invalid(field, `larger than ${Limits.env.bytesMax} bytes`);
  return env;
}

function absPath(field: string, v: unknown): string {
  if (typeof v !== 'string' || !v.startsWith('/') || v.length > Limits.files.pathMax || v.includes('\0')) {
    invalid(field, 'must be an absolute path');
  }
  return v;
}

const KNOWN_FIELDS = new Set(['backend', 'image', 'cpu', 'memoryMiB', 'pidsLimit', 'ttlSec', 'labels', 'env', 'cwd', 'group', 'node', 'idleTimeoutSec', 'idleAction', 'qos', 'autoResume']);

function oneOf<T extends string>(field: string, v: unknown, allowed: readonly T[], dflt: T): T {
  if (v === undefined || v === null) return dflt;
  if (typeof v !== 'string' || !(allowed as readonly string[]).includes(v)) invalid(field, `must be one of ${allowed.join(', ')}, got ${JSON.stringify(v)}`);
  return v as T;
}

/** Fills defaults and checks every field of a create request's spec. Throws INVALID_SPEC. */
export function validateSpec(input: unknown): SandboxSpec {
  if (!isRecord(input)) invalid('spec', 'must be a map');
  for (const k of Object.keys(input)) if (!KNOWN_FIELDS.has(k)) invalid(k, 'unknown field');
  const backend = input.backend ?? 'container';
  if (typeof backend !== 'string' || !(Backends as readonly string[]).includes(backend)) {
    invalid('backend', `unknown backend ${JSON.stringify(backend)}; known: ${Backends.join(', ')}`);
  }
  const image = input.image ?? 'busybox';
  if (typeof image !== 'string' || !IMAGE.test(image)) invalid('image', `bad image name ${JSON.stringify(image)}`);
  const spec: SandboxSpec = {
    backend: backend as BackendKind,
    image,
    cpu: num('cpu', input.cpu, Limits.cpu, false),
    memoryMiB: num('memoryMiB', input.memoryMiB, Limits.memoryMiB, true),
    pidsLimit: num('pidsLimit', input.pidsLimit, Limits.pidsLimit, true),
    ttlSec: num('ttlSec', input.ttlSec, Limits.ttlSec, false),
    labels: stringMap('labels', input.labels, Limits.labels.max, (k) => LABEL_KEY.test(k) && k.length <= Limits.labels.keyMax, Limits.labels.valueMax),
    env: envMap('env', input.env),
    idleAction: oneOf<IdleAction>('idleAction', input.idleAction, IdleActions, 'pause'),
    qos: oneOf<QosClass>('qos', input.qos, QosClasses, 'ls'),
    autoResume: input.autoResume === undefined ? true : input.autoResume === true,
  };
  if (input.autoResume !== undefined && typeof input.autoResume !== 'boolean') invalid('autoResume', 'must be a boolean');
  if (input.idleTimeoutSec !== undefined && input.idleTimeoutSec !== null) spec.idleTimeoutSec = num('idleTimeoutSec', input.idleTimeoutSec, Limits.idleTimeoutSec, false);
  if (input.cwd !== undefined) spec.cwd = absPath('cwd', input.cwd);
  if (input.group !== undefined) {
    if (!isToken(input.group)) invalid('group', 'must be 1-64 characters of [A-Za-z0-9_-]');
    spec.group = input.group;
  }
  if (input.node !== undefined) {
    if (!isToken(input.node)) invalid('node', 'must be a node id');
    spec.node = input.node;
  }
  return spec;
}

function badRequest(field: string, message: string): never {
  throw new ProtocolError('INVALID_REQUEST', `${field}: ${message}`, { detail: { field } });
}

/** Checks an exec request and fills its defaults. Throws INVALID_REQUEST. */
export function validateExec(input: unknown, defaults: { maxOutputBytes: number }): Required<Pick<ExecRequest, 'cmd' | 'timeoutMs' | 'maxOutputBytes'>> & ExecRequest {
  if (!isRecord(input)) badRequest('exec', 'must be a map');
  const { cmd } = input;
  if (!Array.isArray(cmd) || cmd.length === 0) badRequest('cmd', 'must be a non-empty array of strings');
  if (cmd.length > Limits.exec.argsMax) badRequest('cmd', `at most ${Limits.exec.argsMax} arguments`);
  let bytes = 0;
  for (const a of cmd) {
    if (typeof a !== 'string' || a.includes('\0')) badRequest('cmd', 'every argument must be a string without NUL');
    bytes += a.length;
  }
  if (bytes > Limits.exec.argBytesMax) badRequest('cmd', `arguments larger than ${Limits.exec.argBytesMax} bytes`);
  if (cmd[0] === '') badRequest('cmd', 'the program name is empty');
  const out: ReturnType<typeof validateExec> = {
    cmd: cmd as string[],
    timeoutMs: 0,
    maxOutputBytes: 0,
  };
  try {
    out.timeoutMs = num('timeoutMs', input.timeoutMs, Limits.exec.timeoutMs, false);
    out.maxOutputBytes = num('maxOutputBytes', input.maxOutputBytes, { ...Limits.exec.maxOutputBytes, default: defaults.maxOutputBytes }, true);
    if (input.cwd !== undefined) out.cwd = absPath('cwd', input.cwd);
    if (input.env !== undefined) out.env = envMap('env', input.env);
  } catch (e) {
    if (e instanceof ProtocolError) throw new ProtocolError('INVALID_REQUEST', e.message, { detail: e.detail });
    throw e;
  }
  if (input.stdin !== undefined && input.stdin !== null) {
    if (!(input.stdin instanceof Uint8Array)) badRequest('stdin', 'must be bytes');
    if (input.stdin.length > Limits.exec.stdinMax) {
      throw new ProtocolError('PAYLOAD_TOO_LARGE', `stdin larger than ${Limits.exec.stdinMax} bytes`);
    }
    out.stdin = input.stdin;
  }
  if (input.stream !== undefined) out.stream = input.stream === true;
  if (input.execId !== undefined) {
    if (!isToken(input.execId)) badRequest('execId', 'must be 1-64 characters of [A-Za-z0-9_-]');
    out.execId = input.execId;
  }
  return out;
}

/** A path inside a sandbox as given by the caller: absolute, bounded, no NUL. */
export function validatePath(v: unknown, field = 'path'): string {
  if (typeof v !== 'string' || v.length === 0) badRequest(field, 'must be a non-empty string');
  if (v.length > Limits.files.pathMax) badRequest(field, `longer than ${Limits.files.pathMax}`);
  if (v.includes('\0')) badRequest(field, 'contains NUL');
  if (!v.startsWith('/')) badRequest(field, 'must be absolute');
  return v;
}

export function optionalCount(v: unknown, field: string, max = Number.MAX_SAFE_INTEGER): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v > max) badRequest(field, `must be an integer between 0 and ${max}`);
  return v;
}

export function requireRecord(v: unknown, what: string): Record<string, unknown> {
  if (!isRecord(v)) badRequest(what, 'must be a map');
  return v;
}
