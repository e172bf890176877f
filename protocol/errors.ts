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
  /**
   * Exec verdicts: the sandbox's memory cgroup OOM-killed, its pids cgroup refused a fork, its output
   * cap was hit. PIDS_LIMIT is also the refusal of a `process.start` past the sandbox's number of
   * background processes (Limits.processes.liveMax).
   */
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
    // The caller's faults and capacity refusals are answers, not bugs: no one reads their stack,
    // and capturing it was the largest single cost of refusing a burst of creates.
    const limit = Error.stackTraceLimit;
    if (ErrorCodes[code].fault === 'user' || code === 'NO_CAPACITY') Error.stackTraceLimit = 0;
    try {
      super(message, opts?.cause === undefined ? undefined : { cause: opts.cause });
    } finally {
      Error.stackTraceLimit = limit;
    }
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

/** Errors of the NATS client and of JetStream, by class name (the classes live in the client). */
const NATS_ERRORS = new Set([
  'ClosedConnectionError',
  'ConnectionError',
  'DrainingConnectionError',
  'JetStreamApiError',
  'JetStreamError',
  'JetStreamNotEnabled',
  'JetStreamStatusError',
  'NoResponders',
  'RequestError',
  'StreamNotFoundError',
  'ConsumerNotFoundError',
  'TimeoutError',
]);

/** Why NATS or JetStream failed, as a stable word (`detail.reason`) and a phrase a person can act on. */
const NATS_REASONS: Array<{ reason: string; test: RegExp; says: string }> = [
  { reason: 'disk_full', test: /no space|insufficient (storage )?resources|error creating store|storage|disk/i, says: 'JetStream cannot write its store (disk full?)' },
  { reason: 'no_quorum', test: /quorum|no suitable peers|leader|not current|temporarily unavailable/i, says: 'JetStream has no quorum (too few servers of its cluster are up)' },
  { reason: 'no_responders', test: /no responders|503|NoResponders/i, says: 'nothing answers (JetStream not enabled, or not ready after a restart)' },
  { reason: 'disconnected', test: /closed|draining|disconnect|connection/i, says: 'the connection to NATS is down' },
  { reason: 'timeout', test: /timeout|timed out/i, says: 'NATS did not answer in time (unreachable, or JetStream busy)' },
];

/**
 * A failure of NATS or JetStream as the Paddock error it is: UNAVAILABLE, naming `what` was being
 * reached and why (`detail.reason`: disk_full, no_quorum, no_responders, disconnected, timeout,
 * other). Undefined for any other error.
 */
export function natsFailure(err: unknown, what: string): ProtocolError | undefined {
  if (!(err instanceof Error) || err instanceof ProtocolError) return undefined;
  const cause = err.cause instanceof Error ? err.cause : undefined;
  if (!NATS_ERRORS.has(err.name) && !(cause && NATS_ERRORS.has(cause.name))) return undefined;
  const text = `${err.name} ${err.message} ${cause ? `${cause.name} ${cause.message}` : ''}`;
  let hit = NATS_REASONS.find((r) => r.test.test(text));
  // nats-server 2.9 answers nothing at all once its store's disk is full (no error, every
  // JetStream call times out, until it is restarted): only a look at that disk can tell.
  if (hit === undefined || hit.reason === 'timeout' || hit.reason === 'disk_full') {
    const full = storeProbe?.();
    if (full) hit = { reason: 'disk_full', test: /$^/, says: `JetStream's store is full (${full})` };
  }
  const reason = hit?.reason ?? 'other';
  return new ProtocolError('UNAVAILABLE', `${what} is unavailable: ${hit?.says ?? 'NATS or JetStream failed'} (${err.message})`, { cause: err, detail: { what, reason } });
}

let storeProbe: (() => string | undefined) | undefined;

/**
 * Where a process that shares a host with its nats-server (`paddock up`, a local cluster) can see
 * that server's store: `probe` says why the store's disk is full (its path and what is free), or
 * nothing. natsFailure then names a full disk where JetStream itself says only "timeout".
 */
export function setStoreProbe(probe: (() => string | undefined) | undefined): void {
  storeProbe = probe;
}

/** Why the local JetStream store's disk is full (setStoreProbe), or nothing: it is not, or cannot be seen. */
export function storeFull(): string | undefined {
  return storeProbe?.();
}

/** `err` as natsFailure sees it, or as it was. */
export function unavailable(err: unknown, what: string): unknown {
  return natsFailure(err, what) ?? err;
}
