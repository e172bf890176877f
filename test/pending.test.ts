/**
 * The SDK's watch of its creates in flight (sdk/pending.ts) against a real nats-server and a
 * placement replica that lags: one whose answers to `place.pending` come after the probe's collect
 * window (its loop busy with a flood of creates) is alive, and the create it holds is not failed.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from '@nats-io/transport-node';
import test from 'ava';
import { startNats } from '../ops/nats.ts';
import { decode, encode, type SandboxInfo, subjects } from '../protocol/index.ts';
import { Paddock } from '../sdk/index.ts';

test('a create held by a replica whose probe answers come late is waited for, not failed as placement_lost', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'paddock-pending-'));
  const nats = await startNats({ dataDir: dir });
  const nc = await connect({ servers: nats.url });
  const pdk = await Paddock.connect({ servers: nats.url, timeoutMs: 60_000 });
  t.teardown(async () => {
    await pdk.close();
    await nc.close();
    await nats.stop();
    await rm(dir, { recursive: true, force: true });
  });
  const HOLD_MS = 16_000;
  const LAG_MS = 1500;
  const held = new Map<string, number>();
  // The replica: holds the create HOLD_MS (past the SDK's 10 s), answering each probe LAG_MS late.
  nc.subscribe(subjects.placeCreate, {
    queue: 'pdk-placement',
    callback: (_e, m) => {
      const { id } = decode(m.data) as { id: string };
      held.set(id, Date.now());
      setTimeout(() => {
        const info = { id, node: 'n1', state: 'running', backend: 'sim', createdAt: Date.now() } as unknown as SandboxInfo;
        m.respond(encode({ ok: true, result: { sandbox: info } }));
      }, HOLD_MS);
    },
  });
  let probes = 0;
  nc.subscribe(subjects.placePending, {
    callback: (_e, m) => {
      probes++;
      const { ids } = decode(m.data) as { ids: string[] };
      const mine = ids.filter((id) => held.has(id)).map((id) => ({ id, sinceMs: Date.now() - (held.get(id) as number) }));
      if (mine.length > 0) setTimeout(() => m.respond(encode({ ok: true, result: { held: mine } })), LAG_MS);
    },
  });
  await nc.flush();
  const started = Date.now();
  const sb = await pdk.sandboxes.create({ backend: 'sim' });
  t.is(sb.info.state, 'running');
  t.true(Date.now() - started >= HOLD_MS - 100);
  t.true(probes >= 4, `${probes} probes`);
});
