/**
 * Validation of requests at the edge, from the schema (schema.ts): everything a handler uses has
 * passed through here, so handlers never see a negative memory size or a command that is not an
 * array of strings. The schema says the shape, bounds and defaults; what JSON Schema cannot say
 * (the total size of an environment, a file that is also a directory, fields that go in pairs) is
 * checked beside it, here, once for every server.
 */
import { type Static, type TSchema, Type } from '@sinclair/typebox';
import { type TypeCheck, TypeCompiler } from '@sinclair/typebox/compiler';
import { type ValueError, ValueErrorType } from '@sinclair/typebox/errors';
import { type ErrorCode, ProtocolError } from './errors.ts';
import { Limits } from './limits.ts';
import { validateNetworkPolicy } from './network.ts';
import {
  ComputerAction,
  CreateRequest,
  DisplayViewRequest,
  DrainRequest,
  Empty,
  ExecCancelRequest,
  ExecRequest,
  ExecResumeRequest,
  ExecCreditRequest,
  FilesDownloadRequest,
  FilesListRequest,
  FilesReadRequest,
  FilesRemoveRequest,
  FilesUploadRequest,
  FilesWatchLeaseRequest,
  FilesWatchRequest,
  FilesWriteRequest,
  type FnCompareMode,
  FnInvokeRequest,
  type FnLanguage,
  type FnLimits,
  ForkRequest,
  KillRequest,
  LifecycleRequest,
  NamedSchemas,
  NetworkSetRequest,
  NodeGroupRequest,
  PortsCloseRequest,
  PortsCreditRequest,
  PortsConnectRequest,
  PortsSendRequest,
  PortsUrlRequest,
  ProcessGetRequest,
  ProcessInputRequest,
  ProcessKillRequest,
  ProcessOutputCancelRequest,
  ProcessOutputCreditRequest,
  ProcessOutputRequest,
  ProcessResizeRequest,
  ProcessStartRequest,
  ProcessWaitRequest,
  SandboxPath,
  SandboxSpec,
  TOKEN_PATTERN,
} from './schema.ts';
import type { SandboxVerb } from './subjects.ts';

export { Limits } from './limits.ts';

/**
 * The writable layer a spec gets: its diskMiB, or by default half its memory (at most
 * Limits.diskMiB.default). The container backend keeps the layer in RAM charged to the sandbox's
 * memory: with a layer as large as the memory (512 MiB of disk on 256 MiB of memory used to be the
 * default), a disk filler ended in MEMORY_LIMIT and left no memory for even `echo ok`.
 */
export function diskMiBOf(spec: Pick<SandboxSpec, 'memoryMiB' | 'diskMiB'>): number {
  return spec.diskMiB ?? Math.max(Limits.diskMiB.min, Math.min(Limits.diskMiB.default, Math.floor(spec.memoryMiB / 2)));
}

const references = Object.values(NamedSchemas);
const compiled = new WeakMap<TSchema, TypeCheck<TSchema>>();

function checker(schema: TSchema): TypeCheck<TSchema> {
  let c = compiled.get(schema);
  if (!c) {
    c = TypeCompiler.Compile(schema, references.filter((r) => r !== schema));
    compiled.set(schema, c);
  }
  return c;
}

/**
 * A MessagePack map as msgpackr decodes it: a plain object. Not an array, not bytes, and not the
 * sentinel msgpackr returns for the never-used byte 0xC1 (an object of its own class).
 */
export function isMap(x: unknown): x is Record<string, unknown> {
  if (typeof x !== 'object' || x === null) return false;
  const proto = Object.getPrototypeOf(x);
  return proto === Object.prototype || proto === null;
}

type Fill = (v: Record<string, unknown>) => void;
const fills = new WeakMap<TSchema, Fill>();

/**
 * Fills the defaults the schema gives, into maps nested as the schema nests objects. Made once per
 * schema: TypeBox's Value.Default walks the schema on every call, ~10× the compiled check's cost
 * (≈20 µs an exec request, measured), on the node's one event loop.
 */
function filler(schema: TSchema): Fill {
  let f = fills.get(schema);
  if (f) return f;
  const steps: Fill[] = [];
  const props = (schema as { properties?: Record<string, TSchema> }).properties ?? {};
  for (const [k, p] of Object.entries(props)) {
    const d: unknown = p.default;
    if (d !== undefined) {
      const fresh = typeof d === 'object' && d !== null;
      steps.push((v) => {
        if (v[k] === undefined) v[k] = fresh ? structuredClone(d) : d;
      });
    }
    if ((p as { properties?: unknown }).properties) {
      const sub = filler(p);
      steps.push((v) => {
        const x = v[k];
        if (isMap(x)) sub(x);
      });
    }
  }
  f = (v) => {
    for (const step of steps) step(v);
  };
  fills.set(schema, f);
  return f;
}

/** A copy of every map in `v` without its null entries: a client's `None` is an absent field. */
function withoutNulls(v: unknown): unknown {
  if (Array.isArray(v)) return v.some((x) => isMap(x)) ? v.map(withoutNulls) : v;
  if (!isMap(v)) return v;
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(v)) {
    const x = v[k];
    if (x !== null) out[k] = withoutNulls(x);
  }
  return out;
}

const show = (v: unknown) => {
  // JSON.stringify gives undefined for undefined (a missing field).
  const s: string | undefined = v instanceof Uint8Array ? `<${v.length} bytes>` : JSON.stringify(v);
  if (s === undefined) return String(v);
  return s.length > 80 ? `${s.slice(0, 79)}…` : s;
};

interface Annotated {
  errorMessage?: string;
  errorCode?: ErrorCode;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  maxLength?: number;
  minItems?: number;
  maxItems?: number;
  maxProperties?: number;
  maxByteLength?: number;
  patternProperties?: Record<string, unknown>;
  anyOf?: Array<{ const?: unknown }>;
}

function between(s: Annotated, v: unknown): string {
  if (s.minimum !== undefined && s.maximum !== undefined) return `must be between ${s.minimum} and ${s.maximum}, got ${show(v)}`;
  if (s.minimum !== undefined) return `must be at least ${s.minimum}, got ${show(v)}`;
  return `must be at most ${s.maximum}, got ${show(v)}`;
}

/** The first schema error as a person reads it: `field: what is wrong`, with the field in `detail`. */
function explain(e: ValueError, code: ErrorCode, root: string): ProtocolError {
  const s = e.schema as Annotated;
  const parts = e.path === '' ? [] : e.path.slice(1).split('/').map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
  let field = parts.length > 0 ? parts.join('.') : root;
  const v = e.value;
  const custom = s.errorMessage?.replace('{value}', show(v));
  let message: string;
  switch (e.type) {
    case ValueErrorType.ObjectAdditionalProperties:
      if (s.patternProperties) {
        const key = parts.pop() ?? '';
        field = parts.length > 0 ? parts.join('.') : root;
        message = `bad key ${show(key)}`;
      } else message = 'unknown field';
      break;
    case ValueErrorType.ObjectRequiredProperty:
      message = custom ?? 'is required';
      break;
    case ValueErrorType.Number:
    case ValueErrorType.Integer:
      message = typeof v === 'number' && Number.isFinite(v) ? `must be an integer, got ${v}` : `must be a number, got ${show(v)}`;
      break;
    case ValueErrorType.NumberMinimum:
    case ValueErrorType.NumberMaximum:
    case ValueErrorType.IntegerMinimum:
    case ValueErrorType.IntegerMaximum:
      message = between(s, v);
      break;
    case ValueErrorType.NumberExclusiveMinimum:
    case ValueErrorType.IntegerExclusiveMinimum:
      message = `must be more than ${s.exclusiveMinimum}, got ${show(v)}`;
      break;
    case ValueErrorType.StringMaxLength:
      message = `longer than ${s.maxLength}`;
      break;
    case ValueErrorType.ArrayMaxItems:
      message = `at most ${s.maxItems} entries, got ${(v as unknown[]).length}`;
      break;
    case ValueErrorType.ObjectMaxProperties:
      message = `at most ${s.maxProperties} entries, got ${Object.keys(v as object).length}`;
      break;
    case ValueErrorType.Uint8ArrayMaxByteLength:
      message = `larger than ${s.maxByteLength} bytes`;
      break;
    case ValueErrorType.Boolean:
      message = custom ?? 'must be a boolean';
      break;
    case ValueErrorType.Object:
      message = custom ?? 'must be a map';
      break;
    case ValueErrorType.String:
      message = custom ?? `must be a string, got ${show(v)}`;
      break;
    case ValueErrorType.Union: {
      const consts = s.anyOf?.every((a) => a.const !== undefined) ? s.anyOf.map((a) => a.const) : null;
      message = custom ?? (consts ? `must be one of ${consts.join(', ')}, got ${show(v)}` : `has the wrong type: ${show(v)}`);
      break;
    }
    default:
      message = custom ?? e.message.toLowerCase();
  }
  // A rule's own code (PAYLOAD_TOO_LARGE past a size, UNKNOWN_VERB for a verb) is for a value of
  // the right type that breaks it: a string where bytes belong is still a bad request.
  const c = s.errorCode !== undefined && e.type !== ValueErrorType.Uint8Array ? s.errorCode : code;
  return new ProtocolError(c, `${field}: ${message}`, { detail: { field } });
}

/**
 * Checks `input` against `schema` and fills its defaults (a copy: the input is not changed).
 * Throws a ProtocolError with `code` (or the failing field's own) naming the first bad field.
 */
export function check<T extends TSchema>(schema: T, input: unknown, code: ErrorCode = 'INVALID_REQUEST', root = 'request'): Static<T> {
  if (!isMap(input)) throw new ProtocolError(code, `${root}: must be a map`, { detail: { field: root } });
  const value = withoutNulls(input) as Record<string, unknown>;
  filler(schema)(value);
  const c = checker(schema);
  if (c.Check(value)) return value as Static<T>;
  const first = c.Errors(value).First();
  throw first ? explain(first, code, root) : new ProtocolError(code, `${root}: does not match the schema`, { detail: { field: root } });
}

function badRequest(field: string, message: string): never {
  throw new ProtocolError('INVALID_REQUEST', `${field}: ${message}`, { detail: { field } });
}

function envBytes(field: string, env: Record<string, string> | undefined, code: ErrorCode): void {
  if (!env) return;
  let bytes = 0;
  for (const [k, val] of Object.entries(env)) bytes += k.length + val.length + 2;
  if (bytes > Limits.env.bytesMax) throw new ProtocolError(code, `${field}: larger than ${Limits.env.bytesMax} bytes`, { detail: { field } });
}

/** Fills defaults and checks every field of a create request's spec. Throws INVALID_SPEC. */
export function validateSpec(input: unknown): SandboxSpec {
  const spec = check(SandboxSpec, input, 'INVALID_SPEC', 'spec');
  envBytes('env', spec.env, 'INVALID_SPEC');
  if (spec.network !== undefined) spec.network = validateNetworkPolicy(spec.network);
  if (spec.migratable && spec.backend !== 'container' && spec.backend !== 'microvm' && spec.backend !== 'fullvm') {
    throw new ProtocolError('INVALID_SPEC', `migratable: a ${spec.backend} sandbox has no state to move between nodes (containers, microVMs and full VMs do)`, { detail: { field: 'migratable' } });
  }
  return spec;
}

/** `node.<node>.drain`'s body (empty: cordon only). */
export function validateDrain(input: unknown): DrainRequest {
  return check(DrainRequest, input ?? {}, 'INVALID_REQUEST', 'drain');
}

const TOKEN = new RegExp(TOKEN_PATTERN);

/** CreateRequest with its spec left to validateSpec: a bad spec is INVALID_SPEC, not a bad request. */
const CreateEnvelope = Type.Object({ ...CreateRequest.properties, spec: Type.Optional(Type.Unknown()) });

/**
 * A create (`pdk.v1.place.create` and a node's `create`): the spec with its defaults, and the id
 * the caller chose, if any. The one check placement and the node both make.
 */
export function validateCreate(input: unknown): { spec: SandboxSpec; id?: string; waitForCapacityMs?: number; timeoutMs?: number } {
  const b = check(CreateEnvelope, input, 'INVALID_REQUEST', 'create');
  const spec = validateSpec(b.spec ?? {});
  if (b.id !== undefined && !TOKEN.test(b.id)) badRequest('id', 'must be 1-64 characters of [A-Za-z0-9_-]');
  return { spec, ...(b.id === undefined ? {} : { id: b.id }), ...(b.waitForCapacityMs === undefined ? {} : { waitForCapacityMs: b.waitForCapacityMs }), ...(b.timeoutMs === undefined ? {} : { timeoutMs: b.timeoutMs }) };
}

/** A node's part of a group verb: `{group, verb}`. */
export function validateNodeGroup(input: unknown): NodeGroupRequest {
  return check(NodeGroupRequest, input, 'INVALID_REQUEST', 'group');
}

/** Checks an exec request and fills its defaults. Throws INVALID_REQUEST (PAYLOAD_TOO_LARGE for stdin past its limit). */
export function validateExec(input: unknown, defaults: { maxOutputBytes: number }): Required<Pick<ExecRequest, 'cmd' | 'timeoutMs' | 'maxOutputBytes'>> & ExecRequest {
  const r = check(ExecRequest, input, 'INVALID_REQUEST', 'exec');
  let bytes = 0;
  for (const a of r.cmd) bytes += a.length;
  if (bytes > Limits.exec.argBytesMax) badRequest('cmd', `arguments larger than ${Limits.exec.argBytesMax} bytes`);
  if (r.cmd[0] === '') badRequest('cmd', 'the program name is empty');
  envBytes('env', r.env, 'INVALID_REQUEST');
  validateStep(r);
  return { ...r, maxOutputBytes: r.maxOutputBytes ?? defaults.maxOutputBytes };
}

/**
 * The command-log fields of an exec or write: a rollout id (a subject token) and a step (an
 * integer from 0). Both or neither; undefined when neither.
 */
export function validateStep(input: Record<string, unknown>): { rolloutId: string; step: number } | undefined {
  const { rolloutId, step } = input;
  if (rolloutId === undefined && step === undefined) return undefined;
  if (typeof rolloutId !== 'string' || !TOKEN.test(rolloutId)) badRequest('rolloutId', 'must be 1-64 characters of [A-Za-z0-9_-] (and comes with a step)');
  if (typeof step !== 'number' || !Number.isSafeInteger(step) || step < 0) badRequest('step', 'must be an integer from 0 (and comes with a rolloutId)');
  return { rolloutId, step };
}

/** A path inside a sandbox as given by the caller: absolute, bounded, no NUL. */
export function validatePath(v: unknown, field = 'path'): string {
  const ok: boolean = checker(SandboxPath).Check(v);
  if (!ok) {
    if (typeof v !== 'string' || v.length === 0) badRequest(field, 'must be a non-empty string');
    if (v.length > Limits.files.pathMax) badRequest(field, `longer than ${Limits.files.pathMax}`);
    if (v.includes('\0')) badRequest(field, 'contains NUL');
    badRequest(field, 'must be absolute');
  }
  return v as string;
}

export function optionalCount(v: unknown, field: string, max = Number.MAX_SAFE_INTEGER): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v > max) badRequest(field, `must be an integer between 0 and ${max}`);
  return v;
}

export function requireRecord(v: unknown, what: string): Record<string, unknown> {
  if (!isMap(v)) badRequest(what, 'must be a map');
  return v;
}

/** The request schema of each sandbox verb (`pdk.v1.sb.<id>.<verb>`). */
export const SandboxRequests = {
  info: Empty,
  exec: ExecRequest,
  'exec.cancel': ExecCancelRequest,
  'exec.resume': ExecResumeRequest,
  'exec.credit': ExecCreditRequest,
  'files.read': FilesReadRequest,
  'files.write': FilesWriteRequest,
  'files.list': FilesListRequest,
  'files.remove': FilesRemoveRequest,
  'files.upload': FilesUploadRequest,
  'files.download': FilesDownloadRequest,
  'files.watch': FilesWatchRequest,
  'files.watch.renew': FilesWatchLeaseRequest,
  'files.watch.cancel': FilesWatchLeaseRequest,
  kill: KillRequest,
  pause: LifecycleRequest,
  resume: Empty,
  hibernate: LifecycleRequest,
  restore: Empty,
  'network.set': NetworkSetRequest,
  stats: Empty,
  'display.screenshot': Empty,
  'display.action': ComputerAction,
  'display.view': DisplayViewRequest,
  snapshot: Empty,
  fork: ForkRequest,
  'ports.connect': PortsConnectRequest,
  'ports.send': PortsSendRequest,
  'ports.close': PortsCloseRequest,
  'ports.credit': PortsCreditRequest,
  'ports.url': PortsUrlRequest,
  'process.start': ProcessStartRequest,
  'process.list': Empty,
  'process.get': ProcessGetRequest,
  'process.wait': ProcessWaitRequest,
  'process.kill': ProcessKillRequest,
  'process.input': ProcessInputRequest,
  'process.resize': ProcessResizeRequest,
  'process.output': ProcessOutputRequest,
  'process.output.cancel': ProcessOutputCancelRequest,
  'process.output.credit': ProcessOutputCreditRequest,
} as const satisfies Record<SandboxVerb, TSchema>;

/** A sandbox verb's request, checked against its schema (exec has its own: validateExec). */
export function validateSandboxRequest<V extends Exclude<SandboxVerb, 'exec'>>(verb: V, body: unknown): Static<(typeof SandboxRequests)[V]> {
  const r = check(SandboxRequests[verb], body, 'INVALID_REQUEST', verb) as Record<string, unknown>;
  if (verb === 'files.write') validateStep(r);
  if (verb === 'network.set') r.policy = validateNetworkPolicy(r.policy ?? {}, 'INVALID_REQUEST', 'policy');
  if (verb === 'process.start') {
    const cmd = (r.cmd as string[] | undefined) ?? [];
    if (cmd.length === 0 && r.pty === undefined) badRequest('cmd', 'a process needs a command (only a terminal, `pty`, has a default: the shell)');
    if (cmd[0] === '') badRequest('cmd', 'the program name is empty');
    if (cmd.reduce((n, a) => n + a.length, 0) > Limits.exec.argBytesMax) badRequest('cmd', `arguments larger than ${Limits.exec.argBytesMax} bytes`);
    envBytes('env', r.env as Record<string, string> | undefined, 'INVALID_REQUEST');
  }
  return r as Static<(typeof SandboxRequests)[V]>;
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

const utf8 = new TextEncoder();
const bytes = (v: string | Uint8Array): Uint8Array => (typeof v === 'string' ? utf8.encode(v) : v);

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
  if (!isMap(input)) badRequest('invoke', 'must be a map');
  if ((input.language === undefined || input.language === null) === (input.image === undefined || input.image === null)) badRequest('language', 'give a language, or an image and a command');
  const r = check(FnInvokeRequest, input, 'INVALID_REQUEST', 'invoke');
  const f = Limits.fn;
  const limits: FnLimits = { ...r.limits, wallMs: r.limits.wallMs ?? Math.min(f.wallMs.max, 2 * r.limits.timeMs + 200) };
  const out: FnInvoke = { files: [], stdin: new Uint8Array(0), args: r.args ?? [], env: r.env ?? {}, limits, compare: r.compare, stopOnFailure: r.stopOnFailure };
  if (r.language !== undefined) {
    out.language = r.language;
    if (r.code === undefined) badRequest('code', `${r.language} needs code`);
    if (r.command !== undefined) badRequest('command', 'goes with image, not with language');
  } else {
    out.image = r.image;
    out.command = r.command ?? [];
    if (out.command.length === 0 || out.command[0] === '') badRequest('command', 'must be a non-empty argv');
  }
  envBytes('env', r.env, 'INVALID_REQUEST');
  if (r.code !== undefined) out.code = bytes(r.code);
  if (r.stdin !== undefined) out.stdin = bytes(r.stdin);
  if (r.files !== undefined) {
    out.files = Object.entries(r.files).map(([p, d]) => ({ path: relPath('files', p), data: bytes(d) }));
    // A file cannot also be a directory of another: `a` and `a/b` cannot both be given.
    const names = new Set(out.files.map((x) => x.path));
    for (const x of out.files) {
      for (let i = x.path.indexOf('/'); i > 0; i = x.path.indexOf('/', i + 1)) {
        if (names.has(x.path.slice(0, i))) badRequest('files', `${JSON.stringify(x.path.slice(0, i))} is both a file and the directory of ${JSON.stringify(x.path)}`);
      }
    }
  }
  if (r.tests !== undefined) {
    if (r.stdin !== undefined) badRequest('stdin', 'each test has its own stdin');
    out.tests = r.tests.map((t) => ({ stdin: t.stdin === undefined ? new Uint8Array(0) : bytes(t.stdin), ...(t.expected !== undefined ? { expected: bytes(t.expected) } : {}) }));
  }
  return out;
}
