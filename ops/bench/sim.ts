/**
 * What a simulated sandbox costs the control plane: one local node offering only the simulated
 * backend, N sandboxes created through placement in batches, then an exec each. Reports creates/s,
 * the exec round trip, and the node's heap per live sandbox (the figure that decides how many
 * simulated nodes and sandboxes one machine can hold in a scale run). No floor: nothing is done
 * on the host that a hand-made script could do instead.
 *
 *   node --import tsx ops/bench/sim.ts [--n 2000] [--json]
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Paddock, type Sandbox } from '../../sdk/index.ts';
import { startLocalCluster } from '../local.ts';
import { nJsonArgs, progress, runMain, table } from './harness.ts';
import { round3, summarize } from './stats.ts';

const USAGE = 'usage: sim.ts [--n N] [--json]';
const BATCH = 50;

function parseArgs(argv: readonly string[]): { n: number; json: boolean } {
  return nJsonArgs(argv, 2000, USAGE);
}

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  const home = await mkdtemp(join(tmpdir(), 'paddock-bench-sim-'));
  progress(`starting a node with the simulated backend (home ${home})`);
  const cluster = await startLocalCluster({ home, prefix: 'benchsim', env: { PADDOCK_BACKENDS: 'sim', PADDOCK_FN: '0', PADDOCK_SIM_SANDBOXES: String(o.n + 100), PADDOCK_SIM_CPU: String(2 * o.n), PADDOCK_SIM_MEMORY_MIB: String(4096 * o.n) } });
  const pdk = await Paddock.connect({ servers: cluster.url, timeoutMs: 120_000 });
  const node = cluster.nodes[0]?.id as string;
  try {
    const heap = async () => {
      // No forced collection (the node runs without --expose-gc): garbage not yet collected counts
      // too, so the figure is an upper bound.
      const info = (await pdk.nodes.info(node)) as unknown as { process: { heapUsedBytes: number } };
      return info.process.heapUsedBytes;
    };
    const before = await heap();
    const sbs: Sandbox[] = [];
    progress(`${o.n} creates, ${BATCH} at a time`);
    const t0 = performance.now();
    for (let i = 0; i < o.n; i += BATCH) {
      const k = Math.min(BATCH, o.n - i);
      sbs.push(...(await Promise.all(Array.from({ length: k }, () => pdk.sandboxes.create({ backend: 'sim' })))));
    }
    const createSec = (performance.now() - t0) / 1000;
    const execs: number[] = [];
    progress(`${Math.min(o.n, 500)} execs`);
    for (const sb of sbs.slice(0, 500)) {
      const s = performance.now();
      await sb.exec(['echo', 'hi']);
      execs.push(performance.now() - s);
    }
    const after = await heap();
    const perSandbox = (after - before) / o.n;
    progress(`killing ${o.n}`);
    for (let i = 0; i < sbs.length; i += BATCH) await Promise.all(sbs.slice(i, i + BATCH).map((s) => s.kill()));
    const ex = summarize(execs);
    const result = { n: o.n, createsPerSec: round3(o.n / createSec), exec: { p50Ms: round3(ex.p50), p99Ms: round3(ex.p99) }, heapPerSandboxKiB: round3(perSandbox / 1024) };
    process.stdout.write(
      `${table([
        ['measure', 'value'],
        ['creates/s (batches of 50, through placement)', result.createsPerSec.toFixed(1)],
        ['exec round trip p50 / p99 ms', `${result.exec.p50Ms.toFixed(3)} / ${result.exec.p99Ms.toFixed(3)}`],
        ['node heap per live sandbox KiB', result.heapPerSandboxKiB.toFixed(1)],
      ])}\n`,
    );
    if (o.json) process.stdout.write(`${JSON.stringify(result)}\n`);
  } finally {
    await pdk.close().catch(() => {});
    await cluster.stop();
    await rm(home, { recursive: true, force: true });
  }
}

runMain(main);
