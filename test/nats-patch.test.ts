/**
 * protocol/nats-patch.ts against a real nats-server: requests answer, time out, find no
 * responders and end with the connection as they did before; the cancel after an answer no
 * longer builds an error; and the library's code is still the code the patch was written for,
 * so that an upgrade of @nats-io/nats-core that changes it fails here, not in production.
 */
import { errors } from '@nats-io/nats-core';
import { RequestOne } from '@nats-io/nats-core/internal';
import test from 'ava';
import { natsPatched, originalCancel } from '../protocol/nats-patch.ts';
import '../protocol/index.ts';
import { natsFor } from './helpers/nats.ts';

test('the patched library is the one it was written for', (t) => {
  t.true(natsPatched());
  const src = originalCancel.toString();
  // The original builds its own error when given none: that is what the patch spares.
  t.regex(src, /reject\(err \? err : new errors_1\.RequestError\("cancelled"\)\)/);
  t.not(RequestOne.prototype.cancel, originalCancel);
});

test('requests behave as before: answers, timeouts, no responders, a close while waiting', async (t) => {
  const { nats, nc } = await natsFor(t, 'paddock-natspatch-');
  const sub = nc.subscribe('echo', { callback: (_e, m) => void m.respond(m.data) });
  t.teardown(() => sub.unsubscribe());
  // The answer arrives; its cancel comes after and must not disturb it.
  for (let i = 0; i < 100; i++) t.is(new TextDecoder().decode((await nc.request('echo', `m${i}`, { timeout: 5000 })).data), `m${i}`);

  nc.subscribe('silent', { callback: () => {} });
  const late = await t.throwsAsync(nc.request('silent', 'x', { timeout: 200 }));
  t.true(late instanceof errors.TimeoutError, String(late));

  const none = await t.throwsAsync(nc.request('nobody.here', 'x', { timeout: 5000 }));
  t.true(none instanceof errors.RequestError && none.isNoResponders(), String(none));

  // A connection closed under a pending request rejects it: with an error of the library's.
  const { connect } = await import('@nats-io/transport-node');
  const other = await connect({ servers: nats.url });
  const pending = other.request('silent', 'x', { timeout: 30_000 });
  await other.close();
  const closed = await t.throwsAsync(pending);
  t.true(closed instanceof Error, String(closed));
});

test('a cancel with no error of its own rejects with one shared error, of the same class and message', (t) => {
  const rejected: unknown[] = [];
  const request = { timer: undefined, mux: { cancel() {} }, deferred: { reject: (e: unknown) => void rejected.push(e) } };
  const cancel = RequestOne.prototype.cancel as (this: unknown, err?: Error) => void;
  cancel.call(request);
  cancel.call(request);
  const mine = new Error('mine');
  cancel.call(request, mine);
  t.is(rejected[0], rejected[1]);
  t.true(rejected[0] instanceof errors.RequestError);
  t.is((rejected[0] as Error).message, 'cancelled');
  t.is(rejected[2], mine);
  // The library's own cancel makes a new error each time: what the patch spares (so this can fail).
  originalCancel.call(request);
  originalCancel.call(request);
  t.not(rejected[3], rejected[4]);
  t.true(rejected[3] instanceof errors.RequestError);
});
