/**
 * Paddock's SDK: create and drive sandboxes over NATS.
 *
 * ```ts
 * const pdk = await Paddock.connect()
 * const sb = await pdk.sandboxes.create({ image: 'busybox', memoryMiB: 256 })
 * const r = await sb.exec(['sh', '-c', 'echo hi'])
 * await sb.kill()
 * ```
 */
export { Groups, Paddock, Sandboxes } from './client.ts';
export type { ConnectOptions, CreateSpec, ListOptions } from './client.ts';
export {
  BackendError,
  CancelledError,
  ForbiddenError,
  InvalidRequestError,
  InvalidSpecError,
  InvalidStateError,
  NoCapacityError,
  NotFoundError,
  PaddockError,
  TimeoutError,
  UnavailableError,
} from './errors.ts';
export { Sandbox, SandboxFiles } from './sandbox.ts';
export type { ExecOptions, ExecResult, ExecStreamEvent } from './sandbox.ts';
export type { CallOptions } from './transport.ts';
export type { ErrorCode, FileEntry, GroupReply, SandboxInfo, SandboxSpec, SandboxState } from '../protocol/index.ts';
