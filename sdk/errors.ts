/**
 * Errors the SDK throws: one base class carrying the stable wire code, one subclass per family, and
 * one function that maps a wire error to its class. Switch on `code` or on `instanceof`.
 */
import { type ErrorCode, ErrorCodes, type Fault, isErrorCode, type WireError } from '../protocol/index.ts';

export class PaddockError extends Error {
  override name = 'PaddockError';
  readonly code: ErrorCode;
  /** Whether the same call may succeed if retried later. */
  readonly retryable: boolean;
  /** Whose move it is: the caller's (`user`: fix the request) or the platform's (`system`: retry later, or tell an operator). */
  readonly fault: Fault;
  readonly detail?: Record<string, unknown>;
  constructor(code: ErrorCode, message: string, opts?: { retryable?: boolean; fault?: Fault; detail?: Record<string, unknown>; cause?: unknown }) {
    super(message, opts?.cause === undefined ? undefined : { cause: opts.cause });
    this.code = code;
    this.retryable = opts?.retryable ?? ErrorCodes[code].retryable;
    this.fault = opts?.fault ?? ErrorCodes[code].fault;
    this.detail = opts?.detail;
  }
}

/** The request itself was wrong: malformed, oversize, an unknown verb, or a bad spec. */
export class InvalidRequestError extends PaddockError {
  override name = 'InvalidRequestError';
}
export class InvalidSpecError extends PaddockError {
  override name = 'InvalidSpecError';
}
export class NotFoundError extends PaddockError {
  override name = 'NotFoundError';
}
export class InvalidStateError extends PaddockError {
  override name = 'InvalidStateError';
}
export class ForbiddenError extends PaddockError {
  override name = 'ForbiddenError';
}
/** A sandbox limit refused the operation (DISK_LIMIT: its writable layer is full). */
export class LimitError extends PaddockError {
  override name = 'LimitError';
}
export class NoCapacityError extends PaddockError {
  override name = 'NoCapacityError';
}
export class UnavailableError extends PaddockError {
  override name = 'UnavailableError';
}
/** The node's FnCall queue is full: try again after `retryAfterMs`. */
export class BusyError extends PaddockError {
  override name = 'BusyError';
  /** The node's estimate of when it will have room. */
  get retryAfterMs(): number {
    const v = this.detail?.retryAfterMs;
    return typeof v === 'number' && v > 0 ? v : 100;
  }
}
export class TimeoutError extends PaddockError {
  override name = 'TimeoutError';
}
export class CancelledError extends PaddockError {
  override name = 'CancelledError';
}
export class BackendError extends PaddockError {
  override name = 'BackendError';
}
export class AlreadyExistsError extends PaddockError {
  override name = 'AlreadyExistsError';
}
/** The step is recorded with another request: the trainer is not replaying what it did before. */
export class ReplayMismatchError extends PaddockError {
  override name = 'ReplayMismatchError';
}
/** The step was in flight when its node died: it may or may not have run, and will not run again. */
export class UnknownOutcomeError extends PaddockError {
  override name = 'UnknownOutcomeError';
}
/** Another request holds the step (STEP_CONFLICT), or the step skips ahead (STEP_OUT_OF_ORDER). */
export class StepError extends PaddockError {
  override name = 'StepError';
}

const CLASSES: Record<ErrorCode, typeof PaddockError> = {
  INVALID_REQUEST: InvalidRequestError,
  UNKNOWN_VERB: InvalidRequestError,
  PAYLOAD_TOO_LARGE: InvalidRequestError,
  INVALID_SPEC: InvalidSpecError,
  NOT_FOUND: NotFoundError,
  INVALID_STATE: InvalidStateError,
  FORBIDDEN: ForbiddenError,
  DISK_LIMIT: LimitError,
  MEMORY_LIMIT: LimitError,
  PIDS_LIMIT: LimitError,
  OUTPUT_LIMIT: LimitError,
  NO_CAPACITY: NoCapacityError,
  UNAVAILABLE: UnavailableError,
  BUSY: BusyError,
  TIMEOUT: TimeoutError,
  CANCELLED: CancelledError,
  ALREADY_EXISTS: AlreadyExistsError,
  REPLAY_MISMATCH: ReplayMismatchError,
  UNKNOWN_OUTCOME: UnknownOutcomeError,
  STEP_CONFLICT: StepError,
  STEP_OUT_OF_ORDER: StepError,
  BACKEND_FAILED: BackendError,
  INTERNAL: PaddockError,
};

export function errorFromWire(w: WireError): PaddockError {
  const code: ErrorCode = isErrorCode(w.code) ? w.code : 'INTERNAL';
  const Cls = CLASSES[code];
  return new Cls(code, w.message, { retryable: w.retryable, ...(w.fault === 'user' || w.fault === 'system' ? { fault: w.fault } : {}), detail: w.detail });
}
