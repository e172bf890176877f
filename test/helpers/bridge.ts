/** Waiting for the bridge's word to reach placement, instead of sleeping a second and hoping. */
import type { NatsConnection } from '@nats-io/transport-node';
import { decode, subjects } from '../../protocol/index.ts';

/**
 * Resolves once `n` bridge states saying capacity can come have crossed the wire (the leader
 * publishes one a second): placement, subscribed to the same subject, has had the first for a
 * whole period by then, so a burst's creates wait for machines instead of failing.
 */
export function bridgeStatesHeard(nc: NatsConnection, n = 2, ms = 60_000): Promise<void> {
  return new Promise((resolve, reject) => {
    let seen = 0;
    const timer = setTimeout(() => {
      sub.unsubscribe();
      reject(new Error(`no bridge state saying capacity can come within ${ms} ms`));
    }, ms);
    const sub = nc.subscribe(subjects.bridgeState, {
      callback: (_e, m) => {
        if (!(decode(m.data) as { canProvision?: boolean }).canProvision || ++seen < n) return;
        clearTimeout(timer);
        sub.unsubscribe();
        resolve();
      },
    });
  });
}
