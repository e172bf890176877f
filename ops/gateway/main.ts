/**
 * A gateway process of its own: `node --import tsx ops/gateway/main.ts` with NATS_URL (or the
 * embedded Paddock's URL file). Stateless, so run as many as wanted; prints `PADDOCK_HTTP host:port`.
 */
import { readFileSync } from 'node:fs';
import { natsUrlFile } from '../../protocol/discovery.ts';
import { startGateway } from './index.ts';

const natsUrl = process.env.NATS_URL || readFileSync(natsUrlFile(), 'utf8').trim();
const gw = await startGateway({ natsUrl });
process.stdout.write(`PADDOCK_HTTP ${gw.address}\n`);
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.once(sig, () => {
    void gw.close().finally(() => process.exit(0));
  });
}
