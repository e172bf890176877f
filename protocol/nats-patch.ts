/**
 * One correction to nats.js 3.4 (`@nats-io/nats-core`, pinned exactly in package.json), applied
 * once when the protocol module loads, before any connection is made.
 *
 * `RequestOne.cancel()` runs after every answered request (from its resolver) and rejects the
 * request's promise with a new `RequestError("cancelled")`. The promise is settled by then, so
 * the rejection is dropped, but the error is built first, stack trace and all: 3.2% of a
 * simulated fleet's CPU, one per create and per directory write. A cancel that brings no error of
 * its own now rejects with one shared `RequestError("cancelled")`: the same class and message,
 * for the rare caller whose promise it does settle. test/nats-patch.test.ts checks, against a
 * real server, that requests, timeouts, no-responders and closes behave as before, and that the
 * code patched is still the code it was written for.
 */
import { errors } from '@nats-io/nats-core';
import { RequestOne } from '@nats-io/nats-core/internal';

const CANCELLED = new errors.RequestError('cancelled');
const PATCHED = Symbol.for('paddock.nats-patch');

type Cancel = (this: unknown, err?: Error) => void;
const proto = RequestOne.prototype as unknown as { cancel: Cancel; [PATCHED]?: Cancel };

// Module instances may be loaded twice (tsx and dist/ in one process): patch once, keep the original.
if (!proto[PATCHED]) {
  const cancel = proto.cancel;
  proto.cancel = function (this: unknown, err?: Error) {
    cancel.call(this, err ?? CANCELLED);
  };
  Object.defineProperty(proto, PATCHED, { value: cancel });
}

/** The library's own cancel, so that the test can check it still reads as this patch expects. */
export const originalCancel: Cancel = proto[PATCHED] as Cancel;

/** Whether the patch is in place. */
export const natsPatched = (): boolean => (RequestOne.prototype as unknown as { cancel: Cancel }).cancel !== originalCancel;
