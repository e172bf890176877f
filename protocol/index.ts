/** The wire protocol: subjects, message types, error codes, codec, validation. */
export { decode, encode } from './codec.ts';
export { ErrorCodes, isErrorCode, ProtocolError, toWireError } from './errors.ts';
export type { ErrorCode, WireError } from './errors.ts';
export { Backends, GroupVerbs, IdleActions, QosClasses, SandboxStates } from './messages.ts';
export type {
  BackendKind,
  CreateReply,
  CreateRequest,
  EndReason,
  ExecCancelRequest,
  ExecEvent,
  ExecRequest,
  ExecResult,
  FileEntry,
  FilesListReply,
  FilesListRequest,
  FilesReadReply,
  FilesReadRequest,
  FilesRemoveRequest,
  FilesWriteReply,
  FilesWriteRequest,
  FileType,
  GroupReply,
  GroupVerb,
  IdleAction,
  QosClass,
  KillRequest,
  NodeRecord,
  Reply,
  Resources,
  SandboxInfo,
  SandboxSpec,
  SandboxState,
} from './messages.ts';
export { Buckets, isSandboxVerb, isToken, NodeVerbs, PLACEMENT_QUEUE, PREFIX, parseSandboxSubject, SandboxVerbs, subjects } from './subjects.ts';
export type { NodeVerb, SandboxVerb } from './subjects.ts';
export { Limits, optionalCount, requireRecord, validateExec, validatePath, validateSpec } from './validate.ts';
export { newSandboxId } from './ids.ts';
