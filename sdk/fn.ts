/**
 * `pdk.fn`: one-shot invocations (FnCall). A program in a language (or an image and a command),
 * its stdin or its tests, and limits go in; a judge-style verdict comes out. Any node answers;
 * each call runs in a fresh process tree of a warm sandbox, so nothing is created per call.
 *
 * ```ts
 * const r = await pdk.fn.invoke({ language: 'python', code: 'print(int(input()) * 2)', stdin: '21' })
 * // → { verdict: 'OK', stdout: '42\n', exitCode: 0, timeMs: 11.2, … }
 * ```
 */
import type { FnInvokeRequest, FnInvokeResult, FnTestResult, FnVerdict } from '../protocol/index.ts';
import { subjects } from '../protocol/index.ts';
import { BusyError, CancelledError, PaddockError, TimeoutError } from './errors.ts';
import type { CallOptions, Transport } from './transport.ts';

/** An invocation as the caller gives it: the wire's FnInvokeRequest (text or bytes for code, stdin, files and tests). */
export type FnRequest = FnInvokeRequest;

export interface FnTestOutcome {
  verdict: FnVerdict;
  exitCode: number;
  signal?: string;
  /** A preview (the first 4 KiB); `outputCut` says when there was more. */
  stdout: string;
  stderr: string;
  outputCut?: boolean;
  timeMs: number;
  wallMs: number;
  memoryBytes: number;
  reason?: string;
}

export interface FnResult {
  /** OK, WRONG_ANSWER, TIME_LIMIT, MEMORY_LIMIT, OUTPUT_LIMIT, RUNTIME_ERROR or COMPILE_ERROR. */
  verdict: FnVerdict;
  exitCode: number;
  signal?: string;
  stdout: string;
  stderr: string;
  compileOutput?: string;
  /** CPU time (user + system) of the program; with tests, of the slowest. */
  timeMs: number;
  wallMs: number;
  /** Peak resident memory; with tests, the largest. */
  memoryBytes: number;
  /** Why the verdict is what it is, when it is not OK or WRONG_ANSWER. */
  reason?: string;
  tests?: FnTestOutcome[];
  /** Tests that passed. */
  passed?: number;
  /** The node that ran it, and how long the call waited there for a free sandbox. */
  node: string;
  queuedMs: number;
}

export interface FnInvokeOptions extends CallOptions {
  /** Wait and retry when the node answers BUSY (after its hint), until `timeoutMs` runs out. */
  retryBusy?: boolean;
}

export interface FnManyOptions extends FnInvokeOptions {
  /** Invocations in flight at once (default 8). */
  concurrency?: number;
}

const text = new TextDecoder();
const str = (b: Uint8Array | undefined) => (b ? text.decode(b) : '');

function testOf(t: FnTestResult): FnTestOutcome {
  return { ...t, stdout: str(t.stdout), stderr: str(t.stderr) };
}

function resultOf(w: FnInvokeResult): FnResult {
  const { stdout, stderr, compileOutput, tests, ...rest } = w;
  return { ...rest, stdout: str(stdout), stderr: str(stderr), ...(compileOutput ? { compileOutput: str(compileOutput) } : {}), ...(tests ? { tests: tests.map(testOf) } : {}) };
}

/** Enough time for the runs the request asks for, their compile, and the trip. */
function defaultTimeout(req: FnRequest, floor: number): number {
  const time = req.limits?.timeMs ?? 2000;
  const wall = req.limits?.wallMs ?? 2 * time + 200;
  const compile = req.language === 'c' || req.language === 'cpp' ? 60_000 : 0;
  return Math.max(floor, compile + (req.tests?.length ?? 1) * wall + 10_000);
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener(
      'abort',
      () => {
        clearTimeout(t);
        reject(new CancelledError('CANCELLED', 'the call was cancelled'));
      },
      { once: true },
    );
  });

export class Fn {
  constructor(private readonly t: Transport) {}

  /** Runs one invocation on whichever node takes it. BUSY is a BusyError unless `retryBusy`. */
  async invoke(req: FnRequest, opts: FnInvokeOptions = {}): Promise<FnResult> {
    const timeoutMs = opts.timeoutMs ?? defaultTimeout(req, this.t.defaultTimeoutMs);
    const deadline = Date.now() + timeoutMs;
    for (let attempt = 0; ; attempt++) {
      const left = deadline - Date.now();
      try {
        return resultOf(await this.t.request<FnInvokeResult>(subjects.fnInvoke, req, { signal: opts.signal, timeoutMs: Math.max(1, left) }));
      } catch (err) {
        if (!(err instanceof BusyError) || !opts.retryBusy) throw err;
        // Jitter spreads the retries of many callers that were refused at once.
        const wait = err.retryAfterMs * (0.5 + Math.random()) * Math.min(4, 1 + attempt / 4);
        if (Date.now() + wait >= deadline) throw new TimeoutError('TIMEOUT', `FnCall stayed busy for ${timeoutMs} ms: ${err.message}`, { cause: err });
        await sleep(wait, opts.signal);
      }
    }
  }

  /**
   * Runs many invocations, `concurrency` at a time, retrying BUSY answers (unless `retryBusy` is
   * false). Results come back in order; an invocation that failed is its PaddockError in its
   * slot, the others still run.
   */
  async invokeMany(reqs: FnRequest[], opts: FnManyOptions = {}): Promise<Array<FnResult | PaddockError>> {
    const { concurrency = 8, ...rest } = opts;
    if (!Number.isInteger(concurrency) || concurrency < 1) throw new PaddockError('INVALID_REQUEST', `concurrency must be a positive integer, got ${concurrency}`);
    const one = { ...rest, retryBusy: rest.retryBusy ?? true };
    const out = new Array<FnResult | PaddockError>(reqs.length);
    let next = 0;
    const worker = async () => {
      for (let i = next++; i < reqs.length; i = next++) {
        try {
          out[i] = await this.invoke(reqs[i] as FnRequest, one);
        } catch (err) {
          out[i] = err instanceof PaddockError ? err : new PaddockError('INTERNAL', (err as Error).message, { cause: err });
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(concurrency, reqs.length) }, worker));
    return out;
  }
}
