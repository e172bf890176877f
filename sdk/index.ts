/**
 * Paddock's SDK: create and drive sandboxes over NATS.
 *
 * ```ts
 * const pdk = await connect()   // or Paddock.connect()
 * const sb = await pdk.sandboxes.create({ image: 'busybox', memoryMiB: 256 })
 * const r = await sb.exec(['sh', '-c', 'echo hi'])
 * await sb.kill()
 * ```
 */
// Handles (Sandbox, Rollout, …) come from calls (`pdk.sandboxes.create`, `pdk.rollouts.attach`):
// their types are exported, their constructors (which take the internal transport) are not.
export { connect, Paddock } from './client.ts';
export type { Groups, Sandboxes } from './client.ts';
export type { ConnectOptions, CreateSpec, ListOptions } from './client.ts';
export {
  AlreadyExistsError,
  BackendError,
  BusyError,
  CancelledError,
  ForbiddenError,
  InvalidRequestError,
  InvalidSpecError,
  InvalidStateError,
  LimitError,
  NoCapacityError,
  NotFoundError,
  PaddockError,
  ReplayMismatchError,
  StepError,
  TimeoutError,
  UnavailableError,
  UnknownOutcomeError,
} from './errors.ts';
export type { Rollout, RolloutFiles, Rollouts } from './rollouts.ts';
export type { AttachOptions, RolloutExecOptions, RolloutStartOptions, StepExecResult, StepWriteResult } from './rollouts.ts';
export type { RolloutRecord } from '../protocol/index.ts';
export type { Fn } from './fn.ts';
export type { FnInvokeOptions, FnManyOptions, FnRequest, FnResult, FnTestOutcome } from './fn.ts';
export type { Nodes } from './nodes.ts';
export type { NodeInfo, NodeLayer, NodeLayers } from './nodes.ts';
export type { SandboxPorts } from './ports.ts';
export type { FileChangeEvent, FileWatch, Sandbox, SandboxFiles, SandboxNetwork } from './sandbox.ts';
export type { ProcessHandle, ProcessInfo, ProcessOutputEvent, ProcessOutputOptions, ProcessResult, ProcessStartOptions, PtyHandle, PtyOptions, SandboxProcesses, SandboxPty } from './processes.ts';
export type { ExecOptions, ExecResult, ExecStreamEvent, ForkOptions } from './sandbox.ts';
export type { SnapshotListOptions, Snapshots } from './snapshots.ts';
export type { CallOptions } from './transport.ts';
export type { ErrorCode, ExecVerdict, Fault, FileEntry, FnCompareMode, FnLanguage, FnLimits, FnVerdict, GroupReply, NetworkPolicy, SandboxInfo, SandboxSpec, SandboxState, SandboxStats, SnapshotInfo } from '../protocol/index.ts';
