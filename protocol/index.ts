/** The wire protocol: subjects, message types, error codes, codec, validation. */
export { decode, encode } from './codec.ts';
export { ErrorCodes, isErrorCode, ProtocolError, toWireError } from './errors.ts';
export type { ErrorCode, WireError } from './errors.ts';
export { Backends, ExecVerdicts, FnCompareModes, FnLanguages, FnVerdicts, GroupVerbs, IdleActions, QosClasses, SandboxStates } from './messages.ts';
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
  LayerCacheStats,
  LayerCounters,
  LayerLoadMode,
  LayerStats,
  NodeLayerStats,
  NodeRecord,
  Reply,
  Resources,
  SandboxInfo,
  SandboxSpec,
  SandboxState,
  SandboxStats,
} from './messages.ts';
export { Buckets, FN_QUEUE, isSandboxVerb, isToken, NodeVerbs, PLACEMENT_QUEUE, PREFIX, parseSandboxSubject, SandboxVerbs, Streams, subjects } from './subjects.ts';
export type { NodeVerb, SandboxVerb } from './subjects.ts';
export { Limits, optionalCount, requireRecord, validateExec, validateFnInvoke, validatePath, validateSpec, validateStep } from './validate.ts';
export type { FnInvoke } from './validate.ts';
export { newSandboxId } from './ids.ts';
export { Capabilities, SandboxVerbTable, verbAllowed, verbRow } from './verbs.ts';
export type { Capability, VerbRow } from './verbs.ts';
