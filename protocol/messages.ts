/**
 * Message shapes on the wire. Payloads are MessagePack maps (msgpackr, useRecords: false), so any
 * client with a MessagePack library can build them. Byte fields are MessagePack `bin`.
 */
import type { WireError } from './errors.ts';

export const Backends = ['container', 'fncall', 'microvm', 'fullvm'] as const;
export type BackendKind = (typeof Backends)[number];

/** Lifecycle states of a sandbox, as published in events and the directory. */
export const SandboxStates = ['creating', 'running', 'pausing', 'paused', 'resuming', 'hibernating', 'hibernated', 'restoring', 'stopping', 'stopped', 'failed'] as const;
export type SandboxState = (typeof SandboxStates)[number];

/** What a trainer asks for. Validated by `validateSpec`; defaults filled there. */
export interface SandboxSpec {
  backend: BackendKind;
  image: string;
  /** CPU cores (fractions allowed): a CFS quota. */
  cpu: number;
  memoryMiB: number;
  /** Maximum number of processes (fork bombs end here). */
  pidsLimit: number;
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
}

export interface ExecResult {
  exitCode: number;
  /** Set when a signal ended the process (its exitCode is then 128 + the signal number). */
  signal?: string;
  stdout: Uint8Array;
  stderr: Uint8Array;
  durationMs: number;
  truncated: boolean;
  timedOut: boolean;
}

/** One message of a streamed exec. `exit` is always last; `error` replaces it on failure. */
export type ExecEvent =
  | { t: 'out'; d: Uint8Array }
  | { t: 'err'; d: Uint8Array }
  | { t: 'exit'; exitCode: number; signal?: string; durationMs: number; truncated: boolean; timedOut: boolean }
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
}
export interface FilesWriteReply {
  size: number;
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
}

export interface Resources {
  cpu: number;
  memoryMiB: number;
  sandboxes: number;
}

/** Every reply is one of these. */
export type Reply<T> = { ok: true; result: T } | { ok: false; error: WireError };
