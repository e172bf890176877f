/**
 * Validation of requests at the edge: everything a handler uses has passed through here, so
 * handlers never see a negative memory size or a command that is not an array of strings.
 */
import { ProtocolError } from './errors.ts';
import { Backends, type BackendKind, type ExecRequest, type FnCompareMode, FnCompareModes, type FnLanguage, FnLanguages, type FnLimits, type IdleAction, IdleActions, type QosClass, QosClasses, type SandboxSpec } from './messages.ts';
import { validateNetworkPolicy } from './network.ts';
import { isToken } from './subjects.ts';

export const Limits = {
  cpu: { min: 0.01, max: 64, default: 1 },
  memoryMiB: { min: 16, max: 256 * 1024, default: 256 },
  pidsLimit: { min: 8, max: 65536, default: 1024 },
  diskMiB: { min: 16, max: 256 * 1024, default: 512 },
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
  /** FnCall invocations (the whole request also stays under requestBytesMax). */
  fn: {
    timeMs: { min: 1, max: 60_000, default: 2000 },
    wallMs: { min: 1, max: 600_000 },
    memoryMiB: { min: 16, max: 8192, default: 256 },
    outputBytes: { min: 0, max: 4 * 1024 * 1024, default: 1024 * 1024 },
    tests: 512,
    files: 256,
    pathMax: 255,
    args: 256,
    /** Each test's stdout and stderr in the reply are cut to this (the judge saw all of it). */
    testPreviewBytes: 4096,
  },
} as const;

/**
 * The writable layer a spec gets: its diskMiB, or by default half its memory (at most
 * Limits.diskMiB.default). The container backend keeps the layer in RAM charged to the sandbox's
 * memory: with a layer as large as the memory (512 MiB of disk on 256 MiB of memory used to be the
 * default), a disk filler ended in MEMORY_LIMIT and left no memory for even `echo ok`.
 */
export function diskMiBOf(spec: Pick<SandboxSpec, 'memoryMiB' | 'diskMiB'>): number {
  return spec.diskMiB ?? Math.max(Limits.diskMiB.min, Math.min(Limits.diskMiB.default, Math.floor(spec.memoryMiB / 2)));
}

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

const KNOWN_FIELDS = new Set(['backend', 'image', 'toolkit', 'workspace', 'cpu', 'memoryMiB', 'pidsLimit', 'ttlSec', 'labels', 'env', 'cwd', 'group', 'node', 'idleTimeoutSec', 'idleAction', 'qos', 'autoResume', 'diskMiB', 'network']);

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
  if (input.diskMiB !== undefined && input.diskMiB !== null) spec.diskMiB = num('diskMiB', input.diskMiB, Limits.diskMiB, true);
  if (input.network !== undefined && input.network !== null) spec.network = validateNetworkPolicy(input.network);
  if (input.idleTimeoutSec !== undefined && input.idleTimeoutSec !== null) spec.idleTimeoutSec = num('idleTimeoutSec', input.idleTimeoutSec, Limits.idleTimeoutSec, false);
  for (const f of ['toolkit', 'workspace'] as const) {
    const v = input[f];
    if (v === undefined || v === null) continue;
    if (typeof v !== 'string' || !IMAGE.test(v)) invalid(f, `bad image name ${JSON.stringify(v)}`);
    spec[f] = v;
  }
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
  const step = validateStep(input);
  if (step) {
    if (out.stream) badRequest('stream', 'a step of a rollout is recorded whole: it cannot be streamed');
    out.rolloutId = step.rolloutId;
    out.step = step.step;
  }
  return out;
}

/**
 * The command-log fields of an exec or write: a rollout id (a subject token) and a step (an
 * integer from 0). Both or neither; undefined when neither.
 */
export function validateStep(input: Record<string, unknown>): { rolloutId: string; step: number } | undefined {
  const { rolloutId, step } = input;
  if (rolloutId === undefined && step === undefined) return undefined;
  if (!isToken(rolloutId)) badRequest('rolloutId', 'must be 1-64 characters of [A-Za-z0-9_-] (and comes with a step)');
  if (typeof step !== 'number' || !Number.isSafeInteger(step) || step < 0) badRequest('step', 'must be an integer from 0 (and comes with a rolloutId)');
  return { rolloutId, step };
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

/** An invocation after validation: bytes as bytes, defaults filled. */
export interface FnInvoke {
  language?: FnLanguage;
  image?: string;
  command?: string[];
  code?: Uint8Array;
  files: Array<{ path: string; data: Uint8Array }>;
  stdin: Uint8Array;
  args: string[];
  env: Record<string, string>;
  limits: FnLimits;
  tests?: Array<{ stdin: Uint8Array; expected?: Uint8Array }>;
  compare: FnCompareMode;
  stopOnFailure: boolean;
}

const FN_FIELDS = new Set(['language', 'image', 'command', 'code', 'files', 'stdin', 'args', 'env', 'limits', 'tests', 'compare', 'stopOnFailure']);
const utf8 = new TextEncoder();

function bytes(field: string, v: unknown): Uint8Array {
  if (typeof v === 'string') return utf8.encode(v);
  if (v instanceof Uint8Array) return v;
  badRequest(field, 'must be a string or bytes');
}

function strings(field: string, v: unknown, max: number): string[] {
  if (!Array.isArray(v) || v.length > max) badRequest(field, `must be an array of at most ${max} strings`);
  for (const a of v) if (typeof a !== 'string' || a.includes('\0')) badRequest(field, 'every entry must be a string without NUL');
  return v as string[];
}

/** A file name under /work: relative, no `..`, no empty or hidden-parent segments. */
function relPath(field: string, v: string): string {
  const segs = v.split('/');
  if (v.length === 0 || v.length > Limits.fn.pathMax || v.includes('\0') || v.startsWith('/') || segs.some((s) => s === '' || s === '.' || s === '..')) {
    badRequest(field, `${JSON.stringify(v.slice(0, 80))} must be a relative path without '.', '..' or empty parts`);
  }
  return v;
}

/** Checks a FnCall invocation and fills its defaults. Throws INVALID_REQUEST, or INVALID_SPEC for an unknown language. */
export function validateFnInvoke(input: unknown): FnInvoke {
  if (!isRecord(input)) badRequest('invoke', 'must be a map');
  for (const k of Object.keys(input)) if (!FN_FIELDS.has(k)) badRequest(k, 'unknown field');
  const out: FnInvoke = { files: [], stdin: new Uint8Array(0), args: [], env: {}, limits: { timeMs: 0, wallMs: 0, memoryMiB: 0, outputBytes: 0 }, compare: 'lines', stopOnFailure: false };
  const { language, image } = input;
  if ((language === undefined) === (image === undefined)) badRequest('language', 'give a language, or an image and a command');
  if (language !== undefined) {
    if (typeof language !== 'string' || !(FnLanguages as readonly string[]).includes(language)) {
      throw new ProtocolError('INVALID_SPEC', `language: unknown language ${JSON.stringify(language)}; known: ${FnLanguages.join(', ')}`, { detail: { field: 'language' } });
    }
    out.language = language as FnLanguage;
    if (input.code === undefined) badRequest('code', `${language} needs code`);
    if (input.command !== undefined) badRequest('command', 'goes with image, not with language');
  } else {
    if (typeof image !== 'string' || !IMAGE.test(image)) badRequest('image', `bad image name ${JSON.stringify(image)}`);
    out.image = image;
    out.command = strings('command', input.command, Limits.exec.argsMax);
    if (out.command.length === 0 || out.command[0] === '') badRequest('command', 'must be a non-empty argv');
  }
  if (input.code !== undefined) out.code = bytes('code', input.code);
  if (input.stdin !== undefined && input.stdin !== null) out.stdin = bytes('stdin', input.stdin);
  if (input.args !== undefined) out.args = strings('args', input.args, Limits.fn.args);
  try {
    if (input.env !== undefined) out.env = envMap('env', input.env);
  } catch (e) {
    if (e instanceof ProtocolError) throw new ProtocolError('INVALID_REQUEST', e.message, { detail: e.detail });
    throw e;
  }
  if (input.files !== undefined) {
    if (!isRecord(input.files)) badRequest('files', 'must be a map of relative path to contents');
    const entries = Object.entries(input.files);
    if (entries.length > Limits.fn.files) badRequest('files', `at most ${Limits.fn.files} files`);
    out.files = entries.map(([p, d]) => ({ path: relPath('files', p), data: bytes(`files.${p}`, d) }));
    // A file cannot also be a directory of another: `a` and `a/b` cannot both be given.
    const names = new Set(out.files.map((f) => f.path));
    for (const f of out.files) {
      for (let i = f.path.indexOf('/'); i > 0; i = f.path.indexOf('/', i + 1)) {
        if (names.has(f.path.slice(0, i))) badRequest('files', `${JSON.stringify(f.path.slice(0, i))} is both a file and the directory of ${JSON.stringify(f.path)}`);
      }
    }
  }
  const lim = input.limits ?? {};
  if (!isRecord(lim)) badRequest('limits', 'must be a map');
  for (const k of Object.keys(lim)) if (!['timeMs', 'wallMs', 'memoryMiB', 'outputBytes'].includes(k)) badRequest(`limits.${k}`, 'unknown limit');
  const f = Limits.fn;
  try {
    out.limits.timeMs = num('limits.timeMs', lim.timeMs, f.timeMs, false);
    out.limits.wallMs = num('limits.wallMs', lim.wallMs, { ...f.wallMs, default: Math.min(f.wallMs.max, 2 * out.limits.timeMs + 200) }, false);
    out.limits.memoryMiB = num('limits.memoryMiB', lim.memoryMiB, f.memoryMiB, true);
    out.limits.outputBytes = num('limits.outputBytes', lim.outputBytes, f.outputBytes, true);
  } catch (e) {
    if (e instanceof ProtocolError) throw new ProtocolError('INVALID_REQUEST', e.message, { detail: e.detail });
    throw e;
  }
  if (input.tests !== undefined) {
    if (!Array.isArray(input.tests) || input.tests.length === 0 || input.tests.length > f.tests) badRequest('tests', `must be an array of 1 to ${f.tests} tests`);
    if (input.stdin !== undefined) badRequest('stdin', 'each test has its own stdin');
    out.tests = input.tests.map((t: unknown, i) => {
      if (!isRecord(t)) badRequest(`tests.${i}`, 'must be a map');
      for (const k of Object.keys(t)) if (k !== 'stdin' && k !== 'expected') badRequest(`tests.${i}.${k}`, 'unknown field');
      const test: { stdin: Uint8Array; expected?: Uint8Array } = { stdin: t.stdin === undefined || t.stdin === null ? new Uint8Array(0) : bytes(`tests.${i}.stdin`, t.stdin) };
      if (t.expected !== undefined && t.expected !== null) test.expected = bytes(`tests.${i}.expected`, t.expected);
      return test;
    });
  }
  if (input.compare !== undefined) {
    if (typeof input.compare !== 'string' || !(FnCompareModes as readonly string[]).includes(input.compare)) badRequest('compare', `must be one of ${FnCompareModes.join(', ')}`);
    out.compare = input.compare as FnCompareMode;
  }
  if (input.stopOnFailure !== undefined) {
    if (typeof input.stopOnFailure !== 'boolean') badRequest('stopOnFailure', 'must be a boolean');
    out.stopOnFailure = input.stopOnFailure;
  }
  return out;
}
