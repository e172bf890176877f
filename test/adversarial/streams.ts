/**
 * The streaming trainer of the output-flood case, in a process of its own at the lowest CPU
 * priority (as burst.ts, and for the same reason): one streamed exec of `bytes` bytes in each
 * sandbox named, all at once; then one JSON line with each stream's verdict, the bytes it
 * received and the bytes it was told it lost (gap events).
 *
 *   nice -n 19 node --import tsx streams.ts <nats url> <bytes> <sandbox id>...
 * It prints `ready` once connected and starts at the first line on its stdin.
 */
import { connect, PaddockError } from '../../sdk/index.ts';

const [url, bytes, ...ids] = process.argv.slice(2) as [string, string, ...string[]];
const pdk = await connect({ servers: url });
const sandboxes = await Promise.all(ids.map((id) => pdk.sandboxes.get(id)));
process.stdout.write('ready\n');
await new Promise((resolve) => process.stdin.once('data', resolve));
process.stdin.destroy();
const n = Number(bytes);
const streams = await Promise.all(
  sandboxes.map(async (sb) => {
    let received = 0;
    let lost = 0;
    let verdict = 'no exit';
    try {
      for await (const ev of sb.execStream(['sh', '-c', `head -c ${n} /dev/zero`], { maxOutputBytes: n, timeoutMs: 120_000 })) {
        if (ev.type === 'stdout') received += ev.data.length;
        else if (ev.type === 'gap') lost += ev.bytes;
        else if (ev.type === 'exit') verdict = ev.verdict;
      }
    } catch (e) {
      verdict = e instanceof PaddockError ? e.code : `threw ${String(e)}`;
    }
    return { verdict, received, lost };
  }),
);
await pdk.close();
process.stdout.write(`${JSON.stringify({ streams })}\n`, () => process.exit(0));
