/**
 * Stable error codes carried on the wire. Every error reply names one of these; clients switch on
 * the code, never on the message. `fault` says whose move it is: the caller's (fix the request) or
 * the platform's (retry, or tell an operator).
 */
export const ErrorCodes = {
  /** The message could not be decoded, or lacks a required field. */
  INVALID_REQUEST: { retryable: false, fault: 'user' },
  /** The sandbox spec is well-formed but asks for something impossible or unknown. */
  INVALID_SPEC: { retryable: false, fault: 'user' },
  /** The subject names a verb this version does not know. */
  UNKNOWN_VERB: { retryable: false, fault: 'user' },
  /** A payload is larger than the limit for its verb. */
  PAYLOAD_TOO_LARGE: { retryable: false, fault: 'user' },
  /** The sandbox (or file, or node) does not exist, or no longer runs. */
  NOT_FOUND: { retryable: false, fault: 'user' },
  /** The verb is not allowed in the sandbox's current state (e.g. exec while stopping). */
  INVALID_STATE: { retryable: false, fault: 'user' },
  /** The operation would leave the sandbox (a path escaping its root, a device file). */
  FORBIDDEN: { retryable: false, fault: 'user' },
  /** The sandbox's writable layer is full (files API write; also an exec verdict). */
  DISK_LIMIT: { retryable: false, fault: 'user' },
  /** Exec verdicts: the sandbox's memory cgroup OOM-killed, its pids cgroup refused a fork, its output cap was hit. */
  MEMORY_LIMIT: { retryable: false, fault: 'user' },
  PIDS_LIMIT: { retryable: false, fault: 'user' },
  OUTPUT_LIMIT: { retryable: false, fault: 'user' },
  /** No node can admit the sandbox right now. */
  NO_CAPACITY: { retryable: true, fault: 'system' },
  /** The node's queue is full (FnCall): retry after `detail.retryAfterMs`. */
  BUSY: { retryable: true, fault: 'system' },
  /** No service answers the subject (no placement replica, no node). */
  UNAVAILABLE: { retryable: true, fault: 'system' },
  /** The request did not complete in time. */
  TIMEOUT: { retryable: true, fault: 'system' },
  /** The caller cancelled the request. */
  CANCELLED: { retryable: false, fault: 'user' },
  /** The name is taken (a rollout id already in use: attach to it instead). */
  ALREADY_EXISTS: { retryable: false, fault: 'user' },
  /** Command log: the step is recorded with a different request (another command): the trainer diverged. */
  REPLAY_MISMATCH: { retryable: false, fault: 'user' },
  /** Command log: the step was in flight when its node died. It may have run; it will not run again. */
  UNKNOWN_OUTCOME: { retryable: false, fault: 'system' },
  /** Command log: another request holds the step right now (a racing trainer, or an earlier try still running). */
  STEP_CONFLICT: { retryable: true, fault: 'user' },
  /** Command log: the step skips ahead (the step before it is not recorded); steps start at 0 and go up by one. */
  STEP_OUT_OF_ORDER: { retryable: false, fault: 'user' },
  /** The backend (crun, mount, the kernel) failed doing what was asked. */
  BACKEND_FAILED: { retryable: true, fault: 'system' },
  /** A bug: the platform hit a state it did not expect. */
  INTERNAL: { retryable: true, fault: 'system' },
} as const satisfies Record<string, { retryable: boolean; fault: 'user' | 'system' }>;

export type ErrorCode = keyof typeof ErrorCodes;
/** Whose move it is: the caller's (`user`: fix the request) or the platform's (`system`: retry, or tell an operator). */
export type Fault = 'user' | 'system';

/** The error as it travels on the wire. */
export interface WireError {
  code: ErrorCode;
  message: string;
  retryable: boolean;
  /** Whose move it is (ErrorCodes[code].fault); absent in replies of older servers. */
  fault?: Fault;
  /** Free-form machine-readable detail (e.g. the field that failed validation). */
  detail?: Record<string, unknown>;
}

export function isErrorCode(x: unknown): x is ErrorCode {
  return typeof x === 'string' && Object.hasOwn(ErrorCodes, x);
}

/**
 * The one error type servers throw. Handlers throw it; the binding layer turns it into a reply.
 * Anything else thrown becomes INTERNAL.
 */
export class ProtocolError extends Error {
  override readonly name = 'ProtocolError';
  readonly code: ErrorCode;
  readonly detail?: Record<string, unknown>;
  constructor(code: ErrorCode, message: string, opts?: { cause?: unknown; detail?: Record<string, unknown> }) {
    super(message, opts?.cause === undefined ? undefined : { cause: opts.cause });
    this.code = code;
    this.detail = opts?.detail;
  }

  toWire(): WireError {
    const w: WireError = { code: this.code, message: this.message, retryable: ErrorCodes[this.code].retryable, fault: ErrorCodes[this.code].fault };
    if (this.detail) w.detail = this.detail;
    return w;
  }
}

export function toWireError(err: unknown): WireError {
  if (err instanceof ProtocolError) return err.toWire();
  const message = err instanceof Error ? err.message : String(err);
  return { code: 'INTERNAL', message, retryable: true, fault: 'system' };
}
