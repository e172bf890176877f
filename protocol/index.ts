/** The wire protocol: subjects, message schema and types, error codes, codec, validation. */
export { decode, decodeRequest, encode } from './codec.ts';
export { ErrorCodes, isErrorCode, natsFailure, ProtocolError, toWireError, unavailable } from './errors.ts';
export type { ErrorCode, Fault, WireError } from './errors.ts';
// Every message type and enum, as messages.ts (which takes most from the schema) names them.
export * from './messages.ts';
/** The TypeBox schema of every message (JSON Schema with static types). */
export * as Schema from './schema.ts';
export { domainAllowed, formatIPv4, isOpen, maskOf, NetworkLimits, parseIPv4, parsePolicy, validateNetworkPolicy } from './network.ts';
export type { AllowRule, ParsedPolicy } from './network.ts';
export type {
  BackendKind,
  BackendOffer,
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
  NetworkPolicy,
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
  GroupReply,
  GroupVerb,
  IdleAction,
  QosClass,
  KillRequest,
  NodeGroupRequest,
  RolloutRecord,
  RolloutsStartRequest,
  RolloutsStepsReply,
  RolloutView,
  SandboxesListReply,
  SandboxesListRequest,
  LayerCacheStats,
  LayerCounters,
  LayerLoadMode,
  LayerStats,
  NodeLayerStats,
  DrainReply,
  DrainRequest,
  NodeRecord,
  Reply,
  Resources,
  SandboxInfo,
  SandboxSpec,
  SandboxState,
  SandboxStats,
  Screenshot,
  ComputerAction,
  ComputerActionName,
  ComputerReply,
} from './messages.ts';
export { Buckets, FN_QUEUE, isSandboxVerb, RolloutVerbs, isToken, mayResend, NodeVerbs, PLACEMENT_QUEUE, PREFIX, parseGroupSubject, parseSandboxSubject, SandboxVerbs, Streams, subjectTemplate, subjects } from './subjects.ts';
export type { NodeVerb, RolloutVerb, SandboxVerb } from './subjects.ts';
export { ensureBucket, fewerReplicasWarning, replicasFor, scanKv } from './kv.ts';
export { LISTED_BY_DEFAULT, selectSandboxes } from './directory.ts';
export type { DirectoryQuery } from './directory.ts';
export type { FewerReplicas, ScanOptions } from './kv.ts';
export { positiveEnv } from './env.ts';
export { check, diskMiBOf, isMap, Limits, optionalCount, requireRecord, SandboxRequests, validateCreate, validateDrain, validateExec, validateFnInvoke, validateNodeGroup, validatePath, validateSandboxRequest, validateSpec, validateStep } from './validate.ts';
export type { FnInvoke } from './validate.ts';
export { newRolloutId, newSandboxId, newSnapshotId } from './ids.ts';
export { Operations, protocolJsonSchema, protocolTable } from './api.ts';
export type { Operation } from './api.ts';
export { Capabilities, SandboxVerbTable, verbAllowed, verbRow } from './verbs.ts';
export type { Capability, VerbRow } from './verbs.ts';
