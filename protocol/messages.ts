/**
 * Message shapes on the wire. Payloads are MessagePack maps (msgpackr, useRecords: false), so any
 * client with a MessagePack library can build them. Byte fields are MessagePack `bin`.
 *
 * The request and reply messages are defined once, in schema.ts (TypeBox), and their types come
 * from there; what is left here are the node's own records (heartbeat, layer counters), whose
 * shape the node alone writes.
 */
import type { WireError } from './errors.ts';
import type { BackendKind, FnLanguage } from './schema.ts';

export {
  Backends,
  ComputerActions,
  EndReasons,
  ExecVerdicts,
  FileTypes,
  FileChanges,
  FnCompareModes,
  FnLanguages,
  FnVerdicts,
  GroupVerbs,
  IdleActions,
  QosClasses,
  SandboxStates,
} from './schema.ts';
export type {
  BackendKind,
  ComputerAction,
  ComputerActionName,
  ComputerReply,
  CreateReply,
  CreateRequest,
  EndReason,
  ExecCancelRequest,
  ExecEvent,
  ExecResumeReply,
  ExecResumeRequest,
  ExecRequest,
  ExecResult,
  ExecVerdict,
  FileEntry,
  FilesListReply,
  FilesListRequest,
  FilesReadReply,
  FilesReadRequest,
  FilesRemoveRequest,
  FilesUploadRequest,
  FilesUploadReply,
  FilesDownloadRequest,
  FilesDownloadReply,
  FilesWatchRequest,
  FileWatchEvent,
  FileChange,
  FilesWatchLeaseRequest,
  FilesWatchLeaseReply,
  FilesWriteReply,
  FilesWriteRequest,
  FileType,
  FnCompareMode,
  FnInvokeRequest,
  FnInvokeResult,
  FnLanguage,
  FnLimits,
  FnRunResult,
  FnTest,
  FnTestResult,
  FnVerdict,
  ForkReply,
  ForkRequest,
  PortEvent,
  PortsCloseReply,
  PortsCloseRequest,
  PortsConnectRequest,
  PortsSendRequest,
  PortsUrlReply,
  PortsUrlRequest,
  GroupReply,
  GroupVerb,
  IdleAction,
  KillRequest,
  NetworkPolicy,
  NodeGroupRequest,
  ProcessEvent,
  ProcessInfo,
  ProcessListReply,
  ProcessStartRequest,
  QosClass,
  RolloutRecord,
  RolloutsStartRequest,
  RolloutsStepsReply,
  RolloutView,
  SandboxesListReply,
  SandboxesListRequest,
  SandboxInfo,
  SandboxSpec,
  SandboxState,
  SandboxStats,
  Screenshot,
  SnapshotInfo,
  SnapshotsDeleteReply,
  SnapshotsListReply,
  SnapshotsListRequest,
} from './schema.ts';

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
  /** The node's PADDOCK_HOME on its host (its logs are in `<home>/logs/`): how the CLI finds a running Paddock. */
  home?: string;
  /** Whether this node process also runs a placement replica. */
  placement?: boolean;
  /** FnCall on this node: the languages it has images for, and its load. */
  fn?: { languages: FnLanguage[]; running: number; queued: number };
  /** Set by the placement replica that found the node silent and marked its sandboxes `node_lost`; gone with its next heartbeat. */
  lostAt?: number;
}

export interface BackendOffer {
  capacity: Resources;
  allocated: Resources;
}


export interface Resources {
  cpu: number;
  memoryMiB: number;
  sandboxes: number;
  /** Processes (the specs' pidsLimit): the host's pid_max is one table for every sandbox. Absent = not counted. */
  pids?: number;
  /** Writable layers (the specs' diskMiB, which the container backend keeps in RAM). Absent = not counted. */
  diskMiB?: number;
}

/** Every reply is one of these. */
export type Reply<T> = { ok: true; result: T } | { ok: false; error: WireError };
