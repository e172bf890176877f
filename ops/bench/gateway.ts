/**
 * The HTTP gateway against the NATS SDK it is built on, in one run, on one local node:
 *
 *   npm run bench:gateway [-- --n 30] [-- --json]
 *
 * - create (and kill), exec `true`, a 10 MiB file written and read back: through the gateway
 *   (fetch, HTTP keep-alive) and through the SDK, interleaved so load drifts hit both alike;
 * - SSE streaming throughput of a 48 MiB exec output (read with node:http), beside the SDK's
 *   execStream of the same and the floor: the same bytes published from one process to another
 *   through the same nats-server; the median of five rounds after one that warms up;
 * - the Python client's exec p50 (Debian's python3, urllib: a connection per call);
 * - the gateway process's RSS before and after 10,000 requests (after 10,000 to warm up), and after 10,000 more.
 * Targets: gateway create and exec p50 ≤ 1.3× the SDK's; SSE ≥ 100 MiB/s; no RSS growth.
 * stdout carries the table and, with --json, one JSON object as its last line.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { request } from 'node:http';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { connect } from '@nats-io/transport-node';
import { Paddock } from '../../sdk/index.ts';
import { allocatorEnv } from '../launch.ts';
import { startLocalCluster } from '../local.ts';
import { cleanUp, cleanUpOnSignals, nJsonArgs, onCleanup, progress, runMain } from './harness.ts';
import { round3, summarize } from './stats.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const USAGE = 'usage: gateway.ts [--n N] [--json]';
const MiB = 1024 * 1024;
const SSE_BYTES = 48 * MiB;
const RSS_REQUESTS = 10_000;

function parseArgs(argv: readonly string[]): { n: number; json: boolean } {
  return nJsonArgs(argv, 30, USAGE);
}

const time = async (f: () => Promise<unknown>): Promise<number> => {
  const t0 = performance.now();
  await f();
  return performance.now() - t0;
};

function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? 0) * 1024;
}

const NATS_CHUNK = 64 * 1024;
/** Streams timed, after one that warms up. */
const SSE_ROUNDS = 5;

/**
 * Reads a streamed exec's SSE response to its end with node:http, as curl would: the reader must
 * not be what is measured (fetch's web streams took ~8 ms of CPU per MiB in this process, a
 * quarter of the whole pipeline's).
 */
function sseBytes(url: string, body: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'text/event-stream', 'content-length': Buffer.byteLength(body) } }, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        reject(new Error(`SSE: HTTP ${res.statusCode}`));
        return;
      }
      let n = 0;
      res.on('data', (c: Buffer) => {
        n += c.length;
      });
      res.on('end', () => resolve(n));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * The stream's floor: \`bytes\` in 64 KiB messages published by a process of its own and received
 * here, through the cluster's nats-server. Every output byte of a streamed exec makes this hop (node
 * to caller); on a 2-core host the two ends and the server share the cores as the stream's do.
 */
async function natsFloorMiBps(url: string, bytes: number): Promise<number> {
  const nc = await connect({ servers: url });
  try {
    const subject = `bench.floor.${process.pid}.${Math.random().toString(36).slice(2)}`;
    const sub = nc.subscribe(subject);
    await nc.flush();
    // Twice the bytes, the first half to warm both ends up: the second half is timed.
    const code = `const { connect } = await import('@nats-io/transport-node');
const nc = await connect({ servers: ${JSON.stringify(url)} });
const b = Buffer.alloc(${NATS_CHUNK}, 97);
for (let n = 0; n < ${2 * bytes}; n += b.length) { nc.publish(${JSON.stringify(subject)}, b); if ((n / b.length) % 16 === 15) await nc.flush(); }
await nc.flush(); await nc.close();`;
    const pub = spawn(process.execPath, ['--input-type=module', '-e', code], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
    let got = 0;
    let t0 = 0;
    for await (const m of sub) {
      got += m.data.length;
      if (t0 === 0 && got >= bytes) t0 = performance.now();
      if (got >= 2 * bytes) break;
    }
    const ms = performance.now() - t0;
    await new Promise((r) => (pub.exitCode !== null ? r(null) : pub.once('exit', r)));
    return bytes / MiB / (ms / 1000);
  } finally {
    await nc.close();
  }
}

async function startGatewayProcess(natsUrl: string): Promise<{ proc: ChildProcess; url: string }> {
  const proc = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'ops/gateway/main.ts')], { cwd: ROOT, env: { ...process.env, ...allocatorEnv(), NATS_URL: natsUrl, PADDOCK_HTTP_PORT: '0' }, stdio: ['ignore', 'pipe', 'inherit'] });
  const url = await new Promise<string>((resolve, reject) => {
    let out = '';
    proc.stdout?.on('data', (d) => {
      out += d;
      const m = /PADDOCK_HTTP (\S+)/.exec(out);
      if (m) resolve(`http://${m[1]}`);
    });
    proc.once('exit', (c) => reject(new Error(`the gateway exited (${c}) before it listened`)));
  });
  return { proc, url };
}

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  cleanUpOnSignals();
  const home = await mkdtemp(join(tmpdir(), 'paddock-bench-gateway-'));
  onCleanup('home', () => rm(home, { recursive: true, force: true }));
  progress('starting nats-server and a node');
  const imagesDir = process.env.PADDOCK_IMAGES_DIR || '/var/lib/paddock/images';
  // The stream measured is the gateway's path, not the node's output budget (16 MiB/s per
  // sandbox by default, there for the neighbours: README, PADDOCK_EXEC_OUTPUT_MIBPS), which
  // would cap both sides at it: this node's budget is lifted, and the table says so.
  const cluster = await startLocalCluster({ home, nodes: 1, prefix: `gwb${process.pid}n`, imagesDir, env: { PADDOCK_EXEC_OUTPUT_MIBPS: '100000', PADDOCK_NODE_OUTPUT_MIBPS: '100000' } });
  onCleanup('cluster', () => cluster.stop());
  const pdk = await Paddock.connect({ servers: cluster.url });
  onCleanup('sdk', () => pdk.close());
  const gw = await startGatewayProcess(cluster.url);
  onCleanup('gateway', async () => {
    gw.proc.kill('SIGTERM');
    await new Promise((r) => gw.proc.once('exit', r));
  });
  const post = (path: string, body: unknown) => fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const ok = async (res: Promise<Response>) => {
    const r = await res;
    if (!r.ok) throw new Error(`${r.status}: ${await r.text()}`);
    return r;
  };

  progress(`creates: ${o.n} each way`);
  const create = { gw: [] as number[], sdk: [] as number[] };
  const viaGateway = async () => {
    let id = '';
    const ms = await time(async () => {
      id = ((await (await ok(post('/v1/sandboxes', { ttlSec: 600 }))).json()) as { id: string }).id;
    });
    await (await pdk.sandboxes.get(id)).kill();
    create.gw.push(ms);
  };
  const viaSdk = async () => {
    let made: Awaited<ReturnType<typeof pdk.sandboxes.create>> | undefined;
    const ms = await time(async () => {
      made = await pdk.sandboxes.create({ ttlSec: 600 });
    });
    await made?.kill();
    create.sdk.push(ms);
  };
  for (let i = 0; i < o.n; i++) {
    // Alternate which goes first: a slow spell of the machine lands on both.
    if (i % 2 === 0) {
      await viaGateway();
      await viaSdk();
    } else {
      await viaSdk();
      await viaGateway();
    }
  }

  const sb = await pdk.sandboxes.create({ ttlSec: 3600, memoryMiB: 1024, diskMiB: 256 });
  onCleanup('sandbox', () => sb.kill().then(() => {}));
  progress(`exec true: ${o.n * 5} each way`);
  const exec = { gw: [] as number[], sdk: [] as number[] };
  for (let i = 0; i < o.n * 5; i++) {
    const first = i % 2 === 0;
    const g = () => time(async () => (await ok(post(`/v1/sandboxes/${sb.id}/exec`, { cmd: ['true'] }))).json());
    const s = () => time(() => sb.exec(['true']));
    if (first) {
      exec.gw.push(await g());
      exec.sdk.push(await s());
    } else {
      exec.sdk.push(await s());
      exec.gw.push(await g());
    }
  }

  progress('10 MiB file round trips');
  const file = Buffer.alloc(10 * MiB, 7);
  const files = { gw: [] as number[], sdk: [] as number[] };
  for (let i = 0; i < Math.max(3, Math.ceil(o.n / 5)); i++) {
    files.gw.push(
      await time(async () => {
        await ok(fetch(`${gw.url}/v1/sandboxes/${sb.id}/files?path=/work/f.bin`, { method: 'PUT', headers: { 'content-type': 'application/octet-stream' }, body: file }));
        const back = Buffer.from(await (await ok(fetch(`${gw.url}/v1/sandboxes/${sb.id}/files?path=/work/f.bin`))).arrayBuffer());
        if (back.length !== file.length) throw new Error(`read back ${back.length} bytes`);
      }),
    );
    files.sdk.push(
      await time(async () => {
        await sb.files.write('/work/g.bin', file);
        if ((await sb.files.read('/work/g.bin')).length !== file.length) throw new Error('short read');
      }),
    );
  }

  progress(`SSE: ${SSE_BYTES / MiB} MiB of output`);
  // The producer must not be what is measured: \`yes | head\` in a 1-CPU sandbox makes ~80 MiB/s
  // here in 4–8 KiB writes, so the text is written to a file first and read out with 1 MiB writes.
  const made = await sb.exec(['sh', '-c', `yes abcdefghijklmnopqrstuvwxyz0123456789 | head -c ${SSE_BYTES} > /tmp/sse.txt`]);
  if (made.exitCode !== 0) throw new Error(`the SSE source file: exit ${made.exitCode}`);
  const cmd = ['dd', 'if=/tmp/sse.txt', 'bs=1048576', 'status=none'];
  const sse = { gw: [] as number[], sdk: [] as number[], nats: [] as number[], inside: [] as number[] };
  // A round to warm up (JIT, buffers) is not counted: the figures are a stream's steady rate.
  for (let i = 0; i < 1 + SSE_ROUNDS; i++) {
    const counted = i > 0;
    const d = await time(async () => {
      const r = await sb.exec(['sh', '-c', `${cmd.join(' ')} > /dev/null`]);
      if (r.exitCode !== 0) throw new Error(`dd: exit ${r.exitCode}`);
    });
    if (counted) sse.inside.push(SSE_BYTES / MiB / (d / 1000));
    const floor = await natsFloorMiBps(cluster.url, SSE_BYTES);
    if (counted) sse.nats.push(floor);
    let got = 0;
    const g = await time(async () => {
      got = await sseBytes(`${gw.url}/v1/sandboxes/${sb.id}/exec`, JSON.stringify({ cmd, maxOutputBytes: SSE_BYTES + 1 }));
    });
    if (got < SSE_BYTES) throw new Error(`the SSE stream carried ${got} bytes`);
    if (counted) sse.gw.push(SSE_BYTES / MiB / (g / 1000));
    let n = 0;
    const s = await time(async () => {
      for await (const ev of sb.execStream(cmd, { maxOutputBytes: SSE_BYTES + 1 })) if (ev.type === 'stdout') n += ev.data.length;
    });
    if (n !== SSE_BYTES) throw new Error(`the SDK stream carried ${n} bytes`);
    if (counted) sse.sdk.push(SSE_BYTES / MiB / (s / 1000));
  }

  progress('Python client: exec true');
  const py = spawnSync(
    '/usr/bin/python3',
    [
      '-c',
      `import sys, time, statistics\nfrom paddock import Paddock\nsb = Paddock(url=sys.argv[1]).sandboxes.get(sys.argv[2])\nms = []\nfor i in range(${o.n * 3 + 1}):\n    t = time.perf_counter(); sb.exec(["true"]); ms.append((time.perf_counter() - t) * 1000)\nprint(statistics.median(ms[1:]))`,
      gw.url,
      sb.id,
    ],
    { cwd: join(ROOT, 'clients/python'), encoding: 'utf8' },
  );
  if (py.status !== 0) throw new Error(`python3: ${py.stderr}`);
  const pythonExecP50Ms = Number(py.stdout.trim());

  progress(`gateway RSS over ${RSS_REQUESTS} requests`);
  const pid = gw.proc.pid as number;
  const burst = async (n: number) => {
    let next = 0;
    const worker = async () => {
      while (next++ < n) await (await ok(fetch(`${gw.url}/v1/sandboxes/${sb.id}`))).arrayBuffer();
    };
    await Promise.all(Array.from({ length: 8 }, worker));
  };
  // V8 grows its heap to a size it then keeps through a first long burst: the warm-up is as long as the measure.
  await burst(RSS_REQUESTS);
  const rss0 = rssBytes(pid);
  await burst(RSS_REQUESTS);
  const rss1 = rssBytes(pid);
  await burst(RSS_REQUESTS);
  const rss2 = rssBytes(pid);

  const c = { gw: summarize(create.gw), sdk: summarize(create.sdk) };
  const e = { gw: summarize(exec.gw), sdk: summarize(exec.sdk) };
  const f = { gw: summarize(files.gw), sdk: summarize(files.sdk) };
  const ssep50 = summarize(sse.gw).p50;
  const sdkSse = summarize(sse.sdk).p50;
  const natsSse = summarize(sse.nats).p50;
  const insideSse = summarize(sse.inside).p50;
  const row = (what: string, g: number, s: number, target: string) => `${what.padEnd(26)} ${g.toFixed(2).padStart(9)} ${s.toFixed(2).padStart(9)} ${(g / s).toFixed(2).padStart(7)}  ${target}`;
  console.log(`${'p50'.padEnd(26)} ${'gateway'.padStart(9)} ${'SDK'.padStart(9)} ${'ratio'.padStart(7)}  target`);
  console.log(row('create (ms)', c.gw.p50, c.sdk.p50, '≤ 1.3×'));
  console.log(row('exec true (ms)', e.gw.p50, e.sdk.p50, '≤ 1.3×'));
  console.log(row('10 MiB write+read (ms)', f.gw.p50, f.sdk.p50, ''));
  console.log(row('stream (MiB/s)', ssep50, sdkSse, '≥ 100 MiB/s'));
  console.log(`stream floors: NATS alone ${natsSse.toFixed(1)} MiB/s (the same bytes in ${NATS_CHUNK / 1024} KiB messages from one process to another through the same nats-server; SSE ${(ssep50 / natsSse).toFixed(2)}×, SDK ${(sdkSse / natsSse).toFixed(2)}×); the command to /dev/null inside ${insideSse.toFixed(0)} MiB/s`);
  console.log('(the node runs with its output budget lifted: PADDOCK_EXEC_OUTPUT_MIBPS, PADDOCK_NODE_OUTPUT_MIBPS)');
  console.log(`Python client exec true p50: ${pythonExecP50Ms.toFixed(2)} ms (the SDK's ${e.sdk.p50.toFixed(2)} ms)`);
  console.log(`gateway RSS: ${(rss0 / MiB).toFixed(1)} MiB after ${RSS_REQUESTS} requests of warm-up, ${(rss1 / MiB).toFixed(1)} MiB after ${RSS_REQUESTS} more (growth ${((rss1 - rss0) / MiB).toFixed(1)} MiB), ${(rss2 / MiB).toFixed(1)} MiB after another ${RSS_REQUESTS}`);
  if (o.json) {
    console.log(
      JSON.stringify({
        createP50Ms: round3(c.gw.p50),
        sdkCreateP50Ms: round3(c.sdk.p50),
        execP50Ms: round3(e.gw.p50),
        sdkExecP50Ms: round3(e.sdk.p50),
        fileRoundTripP50Ms: round3(f.gw.p50),
        sdkFileRoundTripP50Ms: round3(f.sdk.p50),
        pythonExecP50Ms: round3(pythonExecP50Ms),
        sseMiBps: round3(ssep50),
        sdkStreamMiBps: round3(sdkSse),
        natsFloorMiBps: round3(natsSse),
        rssGrowthBytes: rss1 - rss0,
      }),
    );
  }
}

runMain(async () => {
  try {
    await main();
  } finally {
    await cleanUp();
  }
});
