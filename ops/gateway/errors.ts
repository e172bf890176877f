/**
 * Wire errors as HTTP answers: the stable code and `retryable` travel unchanged in a JSON body,
 * the status says whose fault it is, and `Retry-After` (seconds) comes wherever a retry may help.
 */
import type { FastifyReply } from 'fastify';
import { type ErrorCode, ErrorCodes, isErrorCode } from '../../protocol/index.ts';
import { PaddockError } from '../../sdk/index.ts';

export const HttpStatus: Record<ErrorCode, number> = {
  INVALID_REQUEST: 400,
  INVALID_SPEC: 400,
  UNKNOWN_VERB: 400,
  CANCELLED: 400,
  PAYLOAD_TOO_LARGE: 413,
  NOT_FOUND: 404,
  FORBIDDEN: 403,
  INVALID_STATE: 409,
  ALREADY_EXISTS: 409,
  REPLAY_MISMATCH: 409,
  UNKNOWN_OUTCOME: 409,
  STEP_CONFLICT: 409,
  STEP_OUT_OF_ORDER: 409,
  // The request was fine; the sandbox's own limit refused it.
  DISK_LIMIT: 422,
  MEMORY_LIMIT: 422,
  PIDS_LIMIT: 422,
  OUTPUT_LIMIT: 422,
  BUSY: 429,
  NO_CAPACITY: 503,
  UNAVAILABLE: 503,
  TIMEOUT: 504,
  BACKEND_FAILED: 502,
  INTERNAL: 500,
};

export interface HttpErrorBody {
  code: ErrorCode;
  message: string;
  retryable: boolean;
  detail?: Record<string, unknown>;
}

/** An error raised by the gateway itself (bad query, missing key), before anything goes on the wire. */
export class GatewayError extends Error {
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly status = HttpStatus[code],
    readonly detail?: Record<string, unknown>,
  ) {
    super(message);
  }
}

/** The JSON body, status and Retry-After of any error a route threw. */
export function httpError(err: unknown): { status: number; body: HttpErrorBody; retryAfterSec?: number } {
  let body: HttpErrorBody;
  let status: number;
  if (err instanceof PaddockError) {
    body = { code: err.code, message: err.message, retryable: err.retryable, ...(err.detail ? { detail: err.detail } : {}) };
    status = HttpStatus[err.code];
  } else if (err instanceof GatewayError) {
    body = { code: err.code, message: err.message, retryable: ErrorCodes[err.code].retryable, ...(err.detail ? { detail: err.detail } : {}) };
    status = err.status;
  } else {
    // Fastify's own errors (a body over the limit, malformed JSON) carry a statusCode.
    const e = err as { statusCode?: number; message?: string; code?: string };
    const sc = typeof e.statusCode === 'number' ? e.statusCode : 500;
    const code: ErrorCode = sc === 413 ? 'PAYLOAD_TOO_LARGE' : sc === 404 ? 'NOT_FOUND' : sc >= 400 && sc < 500 ? 'INVALID_REQUEST' : 'INTERNAL';
    body = { code, message: e.message ?? String(err), retryable: ErrorCodes[code].retryable };
    status = sc >= 400 && sc < 600 ? sc : 500;
  }
  if (!isErrorCode(body.code)) body.code = 'INTERNAL';
  if (!body.retryable) return { status, body };
  const ms = typeof body.detail?.retryAfterMs === 'number' ? body.detail.retryAfterMs : 1000;
  return { status, body, retryAfterSec: Math.max(1, Math.ceil(ms / 1000)) };
}

export function sendError(reply: FastifyReply, err: unknown): FastifyReply {
  const { status, body, retryAfterSec } = httpError(err);
  if (retryAfterSec !== undefined) reply.header('retry-after', String(retryAfterSec));
  if (status === 401) reply.header('www-authenticate', 'Bearer realm="paddock"');
  return reply.code(status).type('application/json').send(body);
}
