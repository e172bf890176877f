/**
 * The attacking trainer of the admission case, in a process of its own at the lowest CPU priority:
 * bursts of concurrent creates past capacity for a while, then one JSON line with the codes seen.
 * On a real fleet the trainer runs on another machine; here it shares two cores with the node, and
 * its own work (300 requests, their spans and errors) would be counted as the node's cost.
 *
 *   nice -n 19 node --import tsx burst.ts <nats url> <creates per burst> <ms> <spec json>
 * It prints `ready` once connected and starts at the first line on its stdin.
 */
import { connect, PaddockError } from '../../sdk/index.ts';

const [url, perBurst, ms, spec] = process.argv.slice(2) as [string, string, string, string];
const pdk = await connect({ servers: url });
// Connected and compiled: the test starts sampling the neighbour when it says go.
process.stdout.write('ready\n');
await new Promise((resolve) => process.stdin.once('data', resolve));
process.stdin.destroy();
const codes = new Map<string, number>();
const admitted: string[] = [];
const end = Date.now() + Number(ms);
do {
  await Promise.all(
    Array.from({ length: Number(perBurst) }, () =>
      pdk.sandboxes.create(JSON.parse(spec)).then(
        (sb) => {
          admitted.push(sb.id);
          codes.set('admitted', (codes.get('admitted') ?? 0) + 1);
        },
        (e: unknown) => {
          const c = e instanceof PaddockError ? e.code : `threw ${String(e)}`;
          codes.set(c, (codes.get(c) ?? 0) + 1);
        },
      ),
    ),
  );
} while (Date.now() < end);
for (const id of admitted) await (await pdk.sandboxes.get(id)).kill().catch(() => {});
await pdk.close();
process.stdout.write(`${JSON.stringify({ codes: Object.fromEntries(codes) })}\n`, () => process.exit(0));
