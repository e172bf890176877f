/**
 * Waiting for a state instead of for a time: a test that sleeps a fixed while and then expects the
 * node to have acted fails on a machine four times slower (a 1 s ttl checked after 1.8 s did, in
 * a fresh CI run). The bound here is only how long to wait before giving up.
 */
import { setTimeout as sleep } from 'node:timers/promises';

/** `probe`'s first truthy value (a probe that throws counts as not yet), or its last value once `ms` have passed. */
export async function eventually<T>(probe: () => Promise<T>, ms = 30_000): Promise<T> {
  const until = Date.now() + ms;
  for (;;) {
    const v = await probe().catch(() => undefined as T);
    if (v || Date.now() > until) return v;
    await sleep(200);
  }
}

/**
 * Until every serving node's record lists `names`: a node reads its store's catalog at most once a
 * second and publishes it with its heartbeat, and placement only sends a create to a node whose
 * record has the image.
 */
export async function nodesHaveImages(pdk: { nodes: { query(f?: { state?: 'serving' }): Promise<{ images: string[] }[]> } }, names: string[], ms = 60_000): Promise<void> {
  const ok = await eventually(async () => {
    const nodes = await pdk.nodes.query({ state: 'serving' });
    return nodes.length > 0 && nodes.every((n) => names.every((x) => n.images.includes(x)));
  }, ms);
  if (!ok) throw new Error(`the nodes did not list ${names.join(', ')} within ${ms} ms`);
}
