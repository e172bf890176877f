/** The wire protocol: subjects, message schema and types, error codes, codec, validation. */
import './nats-patch.ts';

export type { Operation } from './api.ts';
export { Operations, protocolJsonSchema, protocolTable } from './api.ts';
export { decode, decodeRequest, encode, encodeOutputEvent } from './codec.ts';
export type { DirectoryQuery } from './directory.ts';
export { LISTED_BY_DEFAULT, selectSandboxes } from './directory.ts';
export { positiveEnv } from './env.ts';
export { Credits, SendWindow } from './flow.ts';
export type { ErrorCode, Fault, WireError } from './errors.ts';
export { ErrorCodes, isErrorCode, natsFailure, ProtocolError, setStoreProbe, storeFull, toWireError, unavailable } from './errors.ts';
export { newRolloutId, newSandboxId, newSnapshotId } from './ids.ts';
export type { FewerReplicas, KvEntry, ScanOptions } from './kv.ts';
export { claimPeriod, dropMarker, ensureBucket, fewerReplicasWarning, replicasFor, scanKv, scanKvEntries } from './kv.ts';
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
  GroupReply,
  GroupVerb,
  IdleAction,
  KillRequest,
  LayerCacheStats,
  LayerCounters,
  LayerLoadMode,
  LayerStats,
  NetworkPolicy,
  NodeGroupRequest,
  NodeLayerStats,
  NodeRecord,
  QosClass,
  Reply,
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
} from './messages.ts';
// Every message type and enum, as messages.ts (which takes most from the schema) names them.
export * from './messages.ts';
export type { AllowRule, ParsedPolicy } from './network.ts';
export { domainAllowed, formatIPv4, isOpen, maskOf, NetworkLimits, parseIPv4, parsePolicy, validateNetworkPolicy } from './network.ts';
/** The TypeBox schema of every message (JSON Schema with static types). */
export * as Schema from './schema.ts';
export type { NodeVerb, RolloutVerb, SandboxVerb } from './subjects.ts';
export { Buckets, FN_QUEUE, isSandboxVerb, isToken, mayResend, NodeVerbs, PLACEMENT_QUEUE, PREFIX, parseGroupSubject, parseSandboxSubject, RolloutVerbs, SandboxVerbs, Streams, subjects, subjectTemplate } from './subjects.ts';
export type { FnInvoke } from './validate.ts';
export { check, diskMiBOf, isMap, Limits, optionalCount, requireRecord, SandboxRequests, validateCreate, validateDrain, validateExec, validateFnInvoke, validateNodeGroup, validatePath, validateSandboxRequest, validateSpec, validateStep } from './validate.ts';
export type { Capability, VerbRow } from './verbs.ts';
export { Capabilities, SandboxVerbTable, verbAllowed, verbRow } from './verbs.ts';
