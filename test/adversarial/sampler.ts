/**
 * The neighbour's trainer, in a process of its own so that an attack driven from the test process
 * (a 1 GiB upload, say) cannot slow the measurement down through a shared event loop.
 *
 *   node --import tsx sampler.ts <nats-url> <sandbox-id>
 *
 * stdin lines: `quiet <n>` → n sequential exec timings; `start` → time execs until `stop`, which
 * answers with them. Each answer is one JSON array of milliseconds on a stdout line.
 */
import { createInterface } from 'node:readline';
import { Paddock } from '../../sdk/index.ts';

const [url, id] = process.argv.slice(2);
if (!url || !id) throw new Error('usage: sampler.ts <nats-url> <sandbox-id>');
const pdk = await Paddock.connect({ servers: url, timeoutMs: 30_000 });
const sb = await pdk.sandboxes.get(id);

async function once(): Promise<number> {
  const t0 = performance.now();
  const r = await sb.exec(['true'], { timeoutMs: 10_000 });
  if (r.exitCode !== 0) throw new Error(`neighbour exec failed: ${r.stderr}`);
  return Math.round((performance.now() - t0) * 1000) / 1000;
}

let running: Promise<number[]> | null = null;
let stopping = false;
process.stdout.write('ready\n');
for await (const line of createInterface({ input: process.stdin })) {
  const [cmd, arg] = line.trim().split(' ');
  if (cmd === 'quiet') {
    const xs: number[] = [];
    for (let i = 0; i < Number(arg); i++) xs.push(await once());
    process.stdout.write(`${JSON.stringify(xs)}\n`);
  } else if (cmd === 'start') {
    stopping = false;
    running = (async () => {
      const xs: number[] = [];
      while (!stopping) xs.push(await once());
      return xs;
    })();
  } else if (cmd === 'stop') {
    stopping = true;
    process.stdout.write(`${JSON.stringify((await running) ?? [])}\n`);
    running = null;
  } else if (cmd === 'exit') break;
}
await pdk.close();
