import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import type { ExecutionContext } from 'ava';
import { type EmbeddedNats, startNats } from '../../ops/nats.ts';

/** A nats-server of the test's own, with a connection, both gone at its end. */
export async function natsFor(t: ExecutionContext, prefix = 'paddock-nats-'): Promise<{ nats: EmbeddedNats; nc: NatsConnection }> {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  const nats = await startNats({ dataDir: dir });
  const nc = await connect({ servers: nats.url });
  t.teardown(async () => {
    await nc.close();
    await nats.stop();
    await rm(dir, { recursive: true, force: true });
  });
  return { nats, nc };
}
