/**
 * Message shapes on the wire. Payloads are MessagePack maps (msgpackr, useRecords: false), so any
 * client with a MessagePack library can build them. Byte fields are MessagePack `bin`.
 *
 * The request and reply messages are defined once, in schema.ts (TypeBox), and their types come
 * from there (the node's heartbeat record too: `nodes.list` answers with it); what is left here
 * are the layer cache's counters, which `node.<id>.info` carries as they are.
 */
import type { WireError } from './errors.ts';

export type {
  BackendKind,
  BackendOffer,
  ComputerAction,
  ComputerActionName,
  ComputerReply,
  CreateReply,
  CreateRequest,
  DrainReply,
  DrainRequest,
  EndReason,
  PlacePendingReply,
  PlacePendingRequest,
  ExecCancelRequest,
  ExecEvent,
  ExecRequest,
  ExecResult,
  ExecResumeReply,
  ExecResumeRequest,
  ExecCreditRequest,
  ExecVerdict,
  FileChange,
  FileEntry,
  FilesDownloadReply,
  FilesDownloadRequest,
  FilesListReply,
  FilesListRequest,
  FilesReadReply,
  FilesReadRequest,
  FilesRemoveRequest,
  FilesUploadReply,
  FilesUploadRequest,
  FilesWatchLeaseReply,
  FilesWatchLeaseRequest,
  FilesWatchRequest,
  FilesWriteReply,
  FilesWriteRequest,
  FileType,
  FileWatchEvent,
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
  GroupReply,
  GroupVerb,
  IdleAction,
  KillRequest,
  NetworkPolicy,
  NodeGroupRequest,
  NodeRecord,
  PortEvent,
  PortsCloseReply,
  PortsCloseRequest,
  PortsCreditRequest,
  PortsConnectRequest,
  PortsSendRequest,
  PortsUrlReply,
  PortsUrlRequest,
  ProcessEvent,
  ProcessInfo,
  ProcessListReply,
  ProcessStartRequest,
  QosClass,
  Resources,
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
export {
  Backends,
  ComputerActions,
  EndReasons,
  ExecVerdicts,
  FileChanges,
  FileTypes,
  FnCompareModes,
  FnLanguages,
  FnVerdicts,
  GroupVerbs,
  IdleActions,
  QosClasses,
  SandboxStates,
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


/** Every reply is one of these. */
export type Reply<T> = { ok: true; result: T } | { ok: false; error: WireError };
