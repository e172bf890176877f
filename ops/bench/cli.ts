/**
 * How long a `paddock` command takes to start and answer: `paddock ps` against an embedded
 * nats-server, as a person runs it (the bin, which runs the CLI's bundle in dist/cli/).
 *
 *   npm run bench:cli [-- --n 30] [-- --json]
 *
 * Beside it, in the same run: the floor (a bare `node -e 0`, and a script that does what ps does
 * on the wire with the NATS client alone: connect, list the sandbox directory, close), and the
 * same command from tsc's tree of modules (dist/ops/cli/, what the bin ran before the bundle) and
 * from the TypeScript sources through tsx (what every call cost before the CLI was compiled). Target: `paddock ps` ≤ 300 ms at p50 on an idle machine.
 * stdout carries the table and, with --json, one JSON object as its last line.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { Kvm } from '@nats-io/kv';
import { connect } from '@nats-io/transport-node';
import { Buckets, encode } from '../../protocol/index.ts';
import { startNats } from '../nats.ts';
import { nJsonArgs } from './harness.ts';
import { round3, type Summary, summarize } from './stats.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const TARGET_MS = 300;

function parseArgs(argv: readonly string[]): { n: number; json: boolean } {
  return nJsonArgs(argv, 30, 'usage: cli.ts [--n N] [--json]');
}

/** CPU time (user + system) of this process's waited-for children so far, in ms (from /proc, 10 ms ticks). */
function childrenCpuMs(): number {
  const f = readFileSync('/proc/self/stat', 'utf8');
  const fields = f.slice(f.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[13]) + Number(fields[14])) * 10;
}

/** Wall-clock samples of `n` runs, and the CPU each run took on average (a loaded machine inflates wall time far more). */
function timeRuns(n: number, cmd: string, args: string[], env: NodeJS.ProcessEnv): { wall: number[]; cpuMs: number } {
  const ms: number[] = [];
  let cpu0 = 0;
  // One unmeasured run: the first start reads the files from disk, the rest from the page cache.
  for (let i = 0; i <= n; i++) {
    const t0 = performance.now();
    const r = spawnSync(cmd, args, { env, cwd: ROOT, encoding: 'utf8' });
    const dt = performance.now() - t0;
    if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.status}: ${r.stderr}`);
    if (i > 0) ms.push(dt);
    else cpu0 = childrenCpuMs();
  }
  return { wall: ms, cpuMs: (childrenCpuMs() - cpu0) / n };
}

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  for (const f of ['dist/cli/main.js', 'dist/ops/cli/main.js']) if (!existsSync(join(ROOT, f))) throw new Error(`no ${f}: run \`npm run build\` first`);
  const home = await mkdtemp(join(tmpdir(), 'paddock-bench-cli-'));
  const nats = await startNats({ dataDir: join(home, 'nats') });
  try {
    // A directory with a few records, as a node would have written them.
    const nc = await connect({ servers: nats.url });
    const kv = await new Kvm(nc).create(Buckets.sandboxes, { history: 1 });
    for (let i = 0; i < 5; i++) {
      const id = `sb-bench${String(i).padStart(12, '0')}`;
      await kv.put(id, encode({ id, node: 'bench', state: 'running', image: 'busybox', backend: 'container', cpu: 1, memoryMiB: 256, labels: {}, createdAt: Date.now(), expiresAt: Date.now() + 3600_000 }));
    }
    await nc.close();

    // Inside node_modules/, so that the script resolves the NATS packages from the repo as the CLI does.
    const floorScript = join(ROOT, 'node_modules', `.paddock-bench-floor-${process.pid}.mjs`);
    await writeFile(
      floorScript,
      `import { connect } from '@nats-io/transport-node';
import { Kvm } from '@nats-io/kv';
const nc = await connect({ servers: process.env.NATS_URL });
const kv = await new Kvm(nc).open('${Buckets.sandboxes}');
for await (const k of await kv.keys()) await kv.get(k);
await nc.drain();
`,
    );
    const env = { ...process.env, NATS_URL: nats.url, PADDOCK_HOME: home };
    process.stderr.write(`bench: ${o.n} runs each\n`);
    const runs = {
      bare: timeRuns(o.n, process.execPath, ['-e', '0'], env),
      wire: timeRuns(o.n, process.execPath, [floorScript], env),
      ps: timeRuns(o.n, process.execPath, [join(ROOT, 'ops/bin/paddock.js'), 'ps'], env),
      tree: timeRuns(o.n, process.execPath, [join(ROOT, 'dist/ops/cli/main.js'), 'ps'], env),
      tsx: timeRuns(Math.min(o.n, 10), process.execPath, ['--import', 'tsx', join(ROOT, 'ops/cli/main.ts'), 'ps'], env),
    };
    const [bare, wire, ps, tree, tsx] = [runs.bare, runs.wire, runs.ps, runs.tree, runs.tsx].map((r) => summarize(r.wall)) as [Summary, Summary, Summary, Summary, Summary];
    await rm(floorScript, { force: true });

    const rows = [
      ['what', 'p50 ms', 'p95 ms', 'vs floor', 'CPU ms/run'],
      ['node -e 0', round3(bare.p50), round3(bare.p95), round3(bare.p50 / wire.p50), runs.bare.cpuMs],
      ['floor: connect, list, close', round3(wire.p50), round3(wire.p95), 1, runs.wire.cpuMs],
      ['paddock ps (the bin: the bundle)', round3(ps.p50), round3(ps.p95), round3(ps.p50 / wire.p50), runs.ps.cpuMs],
      ['paddock ps (tsc tree, unbundled)', round3(tree.p50), round3(tree.p95), round3(tree.p50 / wire.p50), runs.tree.cpuMs],
      ['paddock ps (sources via tsx)', round3(tsx.p50), round3(tsx.p95), round3(tsx.p50 / wire.p50), runs.tsx.cpuMs],
    ];
    for (const r of rows) process.stdout.write(`${r.map((c, i) => String(c).padEnd(i === 0 ? 36 : 12)).join('')}\n`);
    process.stdout.write(`target: paddock ps p50 ≤ ${TARGET_MS} ms → ${ps.p50 <= TARGET_MS ? 'met' : 'missed'} (${round3(ps.p50 / TARGET_MS)}× the target)\n`);
    if (o.json) process.stdout.write(`${JSON.stringify({ psP50Ms: round3(ps.p50), psP95Ms: round3(ps.p95), psCpuMs: runs.ps.cpuMs, floorP50Ms: round3(wire.p50), floorCpuMs: runs.wire.cpuMs, treeP50Ms: round3(tree.p50), treeCpuMs: runs.tree.cpuMs, nodeP50Ms: round3(bare.p50), nodeCpuMs: runs.bare.cpuMs, tsxP50Ms: round3(tsx.p50), tsxCpuMs: runs.tsx.cpuMs, targetMs: TARGET_MS })}\n`);
  } finally {
    await nats.stop();
    await rm(home, { recursive: true, force: true });
  }
}

await main();
