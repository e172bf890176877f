/**
 * Message shapes on the wire. Payloads are MessagePack maps (msgpackr, useRecords: false), so any
 * client with a MessagePack library can build them. Byte fields are MessagePack `bin`.
 */
import type { WireError } from './errors.ts';

/** Sandbox backends. FnCall is a service (`pdk.v1.fn.invoke`), not a kind of sandbox. */
export const Backends = ['container', 'microvm', 'fullvm', 'sim'] as const;
export type BackendKind = (typeof Backends)[number];

/** Lifecycle states of a sandbox, as published in events and the directory. */
export const SandboxStates = ['creating', 'running', 'pausing', 'paused', 'resuming', 'hibernating', 'hibernated', 'restoring', 'stopping', 'stopped', 'failed'] as const;
export type SandboxState = (typeof SandboxStates)[number];

/** What a trainer asks for. Validated by `validateSpec`; defaults filled there. */
export interface SandboxSpec {
  backend: BackendKind;
  /** The base image: its layers at the bottom, its init, user and environment. */
  image: string;
  /** An image whose layers go above the base (a toolchain): rootfs = overlay(writable, workspace, toolkit, base). */
  toolkit?: string;
  /** An image whose layers go on top (the task's files); its cwd, if not `/`, becomes the sandbox's. */
  workspace?: string;
  /** CPU cores (fractions allowed): a CFS quota. */
  cpu: number;
  memoryMiB: number;
  /** Maximum number of processes (fork bombs end here). */
  pidsLimit: number;
  /** Size of the writable layer (what the sandbox may write on top of its image); absent = Limits.diskMiB.default. */
  diskMiB?: number;
  /** Egress allowed from the sandbox; absent = no network at all. */
  network?: NetworkPolicy;
  /** Maximum lifetime; the sandbox is killed (reason `ttl`) when it elapses. */
  ttlSec: number;
  labels: Record<string, string>;
  /** Environment for every exec, on top of the image's. */
  env: Record<string, string>;
  /** Default working directory for exec (absolute). */
  cwd?: string;
  /** Training job this sandbox belongs to. */
  group?: string;
  /** Pin to a node (placement skips scoring). */
  node?: string;
  /** No exec or file call for this long → `idleAction`. Absent: never idles out. */
  idleTimeoutSec?: number;
  idleAction: IdleAction;
  /** `ls` latency-sensitive (normal scheduling, high CPU weight) or `be` best-effort (SCHED_IDLE, low weight). */
  qos: QosClass;
  /** Exec and file calls on a paused or hibernated sandbox wake it first (default), or fail with INVALID_STATE. */
  autoResume: boolean;
}

export const IdleActions = ['pause', 'hibernate', 'kill'] as const;
export type IdleAction = (typeof IdleActions)[number];
export const QosClasses = ['ls', 'be'] as const;
export type QosClass = (typeof QosClasses)[number];

/**
 * Where a sandbox may connect. Everything not listed is refused, and so is the node itself, other
 * sandboxes and NATS unless listed. Names in `domains` resolve through the node's DNS filter only
 * (other names get REFUSED, so DNS cannot carry data out); each address it answers becomes reachable
 * on `ports` for the record's TTL.
 */
export interface NetworkPolicy {
  /** `CIDR` or `CIDR:port` or `CIDR:lo-hi` (IPv4), e.g. `198.18.0.0/24:443`. */
  allow?: string[];
  /** Exact names or `*.suffix`, e.g. `pypi.org`, `*.pythonhosted.org`. */
  domains?: string[];
  /** Ports reachable on addresses found through `domains` (default 80 and 443). */
  ports?: number[];
}

/** Why a sandbox reached a final state. */
export type EndReason = 'killed' | 'ttl' | 'idle' | 'create_failed' | 'node_restarted' | 'crashed';

/** The sandbox as the directory and `info` report it. */
export interface SandboxInfo {
  id: string;
  node: string;
  state: SandboxState;
  backend: BackendKind;
  image: string;
  cpu: number;
  memoryMiB: number;
  labels: Record<string, string>;
  group?: string;
  qos: QosClass;
  idleTimeoutSec?: number;
  idleAction: IdleAction;
  createdAt: number;
  /** When the TTL kills it (ms since epoch). */
  expiresAt: number;
  endedAt?: number;
  reason?: EndReason;
  /** Why it last went to sleep: `idle`, `pressure`, `group`, or `requested`. */
  sleepReason?: string;
  /** What the last hibernation gave back to the node. */
  released?: { bytes: number; swapped: boolean };
  error?: WireError;
}

export interface CreateRequest {
  spec: Partial<SandboxSpec>;
}
export interface CreateReply {
  sandbox: SandboxInfo;
}

export interface ExecRequest {
  cmd: string[];
  cwd?: string;
  env?: Record<string, string>;
  stdin?: Uint8Array;
  timeoutMs?: number;
  /** Cap on stdout and on stderr, each. Past it the process tree is killed. */
  maxOutputBytes?: number;
  /** Stream output as it comes (to the reply inbox), ending with an `exit` event. */
  stream?: boolean;
  /** Identifies a streamed exec so that `exec.cancel` can stop it. */
  execId?: string;
  /** Command log (chronus): record this exec as step `step` of rollout `rolloutId` (both or neither; not streamed). */
  rolloutId?: string;
  step?: number;
}

/**
 * How an exec ended: `OK` when it ran to its own end, else the limit that stopped it (the exit
 * code then tells what the process saw). Counter-based verdicts (pids, memory) cover the whole
 * sandbox during the exec, so two concurrent execs may both see one limit hit.
 */
export const ExecVerdicts = ['OK', 'TIMEOUT', 'OUTPUT_LIMIT', 'MEMORY_LIMIT', 'PIDS_LIMIT', 'DISK_LIMIT'] as const;
export type ExecVerdict = (typeof ExecVerdicts)[number];

export interface ExecResult {
  verdict: ExecVerdict;
  exitCode: number;
  /** Set when a signal ended the process (its exitCode is then 128 + the signal number). */
  signal?: string;
  stdout: Uint8Array;
  stderr: Uint8Array;
  durationMs: number;
  truncated: boolean;
  timedOut: boolean;
  /** Command log: the step was already recorded; this is its recorded result and nothing ran. */
  replayed?: boolean;
}

/** One message of a streamed exec. `exit` is always last; `error` replaces it on failure. */
export type ExecEvent =
  | { t: 'out'; d: Uint8Array }
  | { t: 'err'; d: Uint8Array }
  | { t: 'exit'; exitCode: number; signal?: string; durationMs: number; truncated: boolean; timedOut: boolean; verdict: ExecVerdict }
  | { t: 'error'; error: WireError };

export interface ExecCancelRequest {
  execId: string;
}

export interface FilesReadRequest {
  path: string;
  offset?: number;
  length?: number;
}
export interface FilesReadReply {
  data: Uint8Array;
  /** Size of the whole file. */
  size: number;
  eof: boolean;
}

export interface FilesWriteRequest {
  path: string;
  data: Uint8Array;
  /** Write at this offset without truncating (chunked uploads); absent = replace the file. */
  offset?: number;
  mode?: number;
  /** Command log (chronus): record this write as step `step` of rollout `rolloutId` (both or neither). */
  rolloutId?: string;
  step?: number;
}
export interface FilesWriteReply {
  size: number;
  /** Command log: the step was already recorded; nothing was written. */
  replayed?: boolean;
}

export interface FilesListRequest {
  path: string;
}
export type FileType = 'file' | 'dir' | 'symlink' | 'other';
export interface FileEntry {
  name: string;
  type: FileType;
  size: number;
  mode: number;
  mtimeMs: number;
}
export interface FilesListReply {
  entries: FileEntry[];
}
export interface FilesRemoveRequest {
  path: string;
  recursive?: boolean;
}

export interface KillRequest {
  reason?: string;
}

/** What a group verb did, summed over every node (`pdk.v1.group.<g>.<verb>`). */
export interface GroupReply {
  group: string;
  verb: GroupVerb;
  /** Sandboxes of the group found on live nodes. */
  total: number;
  ok: number;
  failed: Array<{ id: string; node: string; code: string; message: string }>;
  /** Nodes that did not answer in time: their sandboxes are not counted. */
  unreachable: string[];
  durationMs: number;
}
export const GroupVerbs = ['pause', 'resume', 'hibernate', 'restore', 'kill'] as const;
export type GroupVerb = (typeof GroupVerbs)[number];

/** How a node loads layers: on first read from the store (lazy), or whole before mounting (eager). */
export type LayerLoadMode = 'lazy' | 'eager';

/** Counters of one layer on one node, since the node started. */
export interface LayerCounters {
  /** Bytes received from the store for this layer. */
  fetchedBytes: number;
  /** Range requests (lazy) or whole downloads (eager) that reached the store. */
  fetches: number;
  /** Chunk reads answered from the local cache. */
  hits: number;
  /** Chunk reads that had to go to the store. */
  misses: number;
  /** Chunk reads that found the same chunk already on its way and waited for it. */
  shared: number;
  /** Store requests that failed (after retries): the reader got EIO. */
  errors: number;
  /** Chunks or blobs whose bytes did not match their digest. */
  corrupt: number;
}

export interface LayerStats extends LayerCounters {
  digest: string;
  size: number;
  cachedBytes: number;
  complete: boolean;
  /** Mounts the node holds on it (a layer with users is never evicted). */
  users: number;
}

/** A node's layer cache. */
export interface LayerCacheStats {
  dir: string;
  budgetBytes: number;
  cachedBytes: number;
  evictions: number;
  evictedBytes: number;
  /** Chunks served without being kept because every cached byte was in use. */
  uncachedChunks: number;
  fetchedBytes: number;
  hits: number;
  misses: number;
  layers: LayerStats[];
}

/** A node's layer cache and the layers it has mounted: `layers` of its `node.<id>.info` reply. */
export interface NodeLayerStats extends LayerCacheStats {
  mode: LayerLoadMode;
  store: string;
  /** Layers mounted on this node now, with the sandboxes using each. */
  mounted: Array<{ digest: string; sandboxes: number; lazy: boolean }>;
}

/** A node's heartbeat in the `pdk_nodes` bucket. */
export interface NodeRecord {
  node: string;
  backends: BackendKind[];
  images: string[];
  capacity: Resources;
  allocated: Resources;
  /** Sandboxes live on the node. */
  sandboxes: number;
  /** Heartbeat period; a record older than 3 periods is dead. */
  heartbeatMs: number;
  ts: number;
  state: 'serving' | 'draining';
  /** Per backend kind this node offers: its own capacity pool and what is allocated from it. `capacity` and `allocated` above are their sums. */
  offers?: Partial<Record<BackendKind, BackendOffer>>;
  /** The layer store this node reads from (and, when it embeds it, serves): an http:// base URL. */
  store?: string;
  /** FnCall on this node: the languages it has images for, and its load. */
  fn?: { languages: FnLanguage[]; running: number; queued: number };
}

export interface BackendOffer {
  capacity: Resources;
  allocated: Resources;
}

/** What a sandbox uses now, as far as its backend can tell (the `stats` verb). */
export interface SandboxStats {
  cpuSec?: number;
  memoryBytes?: number;
  diskBytes?: number;
  pids?: number;
}

export interface Resources {
  cpu: number;
  memoryMiB: number;
  sandboxes: number;
}

/** Every reply is one of these. */
export type Reply<T> = { ok: true; result: T } | { ok: false; error: WireError };

/** FnCall (`pdk.v1.fn.invoke`): languages served from warm pools. */
export const FnLanguages = ['python', 'c', 'cpp', 'bash'] as const;
export type FnLanguage = (typeof FnLanguages)[number];

/** How one run of a program ended, judge style. */
export const FnVerdicts = ['OK', 'WRONG_ANSWER', 'TIME_LIMIT', 'MEMORY_LIMIT', 'OUTPUT_LIMIT', 'RUNTIME_ERROR', 'COMPILE_ERROR'] as const;
export type FnVerdict = (typeof FnVerdicts)[number];

/** Output against `expected`: byte for byte, line by line ignoring trailing blanks, or whitespace-separated tokens. */
export const FnCompareModes = ['exact', 'lines', 'tokens'] as const;
export type FnCompareMode = (typeof FnCompareModes)[number];

export interface FnLimits {
  /** CPU time of the program's whole process tree. */
  timeMs: number;
  /** Wall-clock cap (a program that sleeps or waits uses no CPU); default 2 × timeMs + 200. */
  wallMs: number;
  memoryMiB: number;
  /** Cap on stdout + stderr together; past it the program is killed (OUTPUT_LIMIT). */
  outputBytes: number;
}

export interface FnTest {
  stdin?: Uint8Array | string;
  /** What stdout must be (compared per `compare`); absent: only the exit status is judged. */
  expected?: Uint8Array | string;
}

export interface FnInvokeRequest {
  /** A language (its code is compiled if needed, then run) — or `image` + `command`. */
  language?: FnLanguage;
  image?: string;
  /** With `image`: the argv to run in /work (`code`, if given, is at /box/main). */
  command?: string[];
  code?: Uint8Array | string;
  /** Files put in /work (the working directory) before every run: relative path → contents. */
  files?: Record<string, Uint8Array | string>;
  stdin?: Uint8Array | string;
  /** Arguments after the program. */
  args?: string[];
  env?: Record<string, string>;
  limits?: Partial<FnLimits>;
  /** Judge mode: one run per test, each with its stdin, compared with its expected output. */
  tests?: FnTest[];
  compare?: FnCompareMode;
  /** Skip the tests after the first that fails (they report nothing). */
  stopOnFailure?: boolean;
}

export interface FnRunResult {
  verdict: FnVerdict;
  exitCode: number;
  /** The signal that ended the program, if one did (exitCode is then 128 + its number). */
  signal?: string;
  stdout: Uint8Array;
  stderr: Uint8Array;
  /** CPU time of the program (user + system). */
  timeMs: number;
  wallMs: number;
  /** Peak resident memory of the program. */
  memoryBytes: number;
  /** Why a verdict other than OK and WRONG_ANSWER came about, in words. */
  reason?: string;
}

/** One test of a judged invocation; stdout and stderr are cut to a preview (`outputCut`). */
export interface FnTestResult extends FnRunResult {
  outputCut?: boolean;
}

export interface FnInvokeResult extends FnRunResult {
  /** The compiler's output (errors for COMPILE_ERROR, else its warnings, if any). */
  compileOutput?: Uint8Array;
  tests?: FnTestResult[];
  /** Tests that passed, of `tests.length`. */
  passed?: number;
  node: string;
  /** Time the request waited for a free pool member. */
  queuedMs: number;
}
