/**
 * Errors the SDK throws: one base class carrying the stable wire code, one subclass per family, and
 * one function that maps a wire error to its class. Switch on `code` or on `instanceof`.
 */
import { type ErrorCode, ErrorCodes, isErrorCode, type WireError } from '../protocol/index.ts';

export class PaddockError extends Error {
  override name = 'PaddockError';
  readonly code: ErrorCode;
  /** Whether the same call may succeed if retried later. */
  readonly retryable: boolean;
  readonly detail?: Record<string, unknown>;
  constructor(code: ErrorCode, message: string, opts?: { retryable?: boolean; detail?: Record<string, unknown>; cause?: unknown }) {
    super(message, opts?.cause === undefined ? undefined : { cause: opts.cause });
    this.code = code;
    this.retryable = opts?.retryable ?? ErrorCodes[code].retryable;
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
export class NoCapacityError extends PaddockError {
  override name = 'NoCapacityError';
}
export class UnavailableError extends PaddockError {
  override name = 'UnavailableError';
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

const CLASSES: Record<ErrorCode, typeof PaddockError> = {
  INVALID_REQUEST: InvalidRequestError,
  UNKNOWN_VERB: InvalidRequestError,
  PAYLOAD_TOO_LARGE: InvalidRequestError,
  INVALID_SPEC: InvalidSpecError,
  NOT_FOUND: NotFoundError,
  INVALID_STATE: InvalidStateError,
  FORBIDDEN: ForbiddenError,
  NO_CAPACITY: NoCapacityError,
  UNAVAILABLE: UnavailableError,
  TIMEOUT: TimeoutError,
  CANCELLED: CancelledError,
  BACKEND_FAILED: BackendError,
  INTERNAL: PaddockError,
};

export function errorFromWire(w: WireError): PaddockError {
  const code: ErrorCode = isErrorCode(w.code) ? w.code : 'INTERNAL';
  const Cls = CLASSES[code];
  return new Cls(code, w.message, { retryable: w.retryable, detail: w.detail });
}
