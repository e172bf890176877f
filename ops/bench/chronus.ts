/**
 * The command-log benchmark: what recording a step costs, and what replaying recorded steps saves.
 *
 *   npm run bench:chronus [-- --n 300] [-- --steps 1000] [-- --json]
 *
 * One run, against one local node behind its embedded NATS, through the SDK:
 *   1. per-step overhead: N execs of `true` without a step interleaved with N execs of `true` as
 *      steps of a rollout (started record, exec, result record), p50/p99 of each; next to them the
 *      floor of the logging itself, the two JetStream writes a step waits for, done bare;
 *   2. replay: a rollout of S `true` steps is recorded (each step followed by one re-execution of
 *      the same command, so both see the same background), then replayed by a freshly attached
 *      Rollout (one read of the log, then no round trip per step) and through the node (attach
 *      without prefetch: one request and one log read per step).
 * Progress goes to stderr; stdout carries the table and, with --json, one JSON object as its last
 * line: {"execP50Ms","loggedExecP50Ms","loggedExecP99Ms","replay1000Ms","reexec1000Ms", …}.
 * Targets: logging adds ≤ 1 ms at p50; replay ≥ 50× faster than re-execution.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { jetstream } from '@nats-io/jetstream';
import { subjects } from '../../protocol/index.ts';
import { connectionOf } from '../../sdk/client.ts';
import { Paddock, type Rollout, type Sandbox } from '../../sdk/index.ts';
import { type LocalCluster, startLocalCluster } from '../local.ts';
import { round3, type Summary, summarize } from './stats.ts';

const USAGE = 'usage: chronus.ts [--n N] [--steps S] [--json]';
const WARMUP = 20;
const TARGET_OVERHEAD_MS = 1;
const TARGET_SPEEDUP = 50;

class UsageError extends Error {
  override name = 'UsageError';
}

interface Options {
  n: number;
  steps: number;
  json: boolean;
}

function parseArgs(argv: readonly string[]): Options {
  const o: Options = { n: 300, steps: 1000, json: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    const value = (flag: string) => {
      const v = a === flag ? argv[++i] : a.slice(flag.length + 1);
      const n = Number(v);
      if (!Number.isInteger(n) || n < 1) throw new UsageError(`${flag}: expected a positive integer, got ${v ?? 'nothing'}\n${USAGE}`);
      return n;
    };
    if (a === '--json') o.json = true;
    else if (a === '--n' || a.startsWith('--n=')) o.n = value('--n');
    else if (a === '--steps' || a.startsWith('--steps=')) o.steps = value('--steps');
    else if (a === '--help' || a === '-h') {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    } else throw new UsageError(`unknown argument ${a}\n${USAGE}`);
  }
  return o;
}

const progress = (msg: string) => process.stderr.write(`bench: ${msg}\n`);

async function timed(f: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await f();
  return performance.now() - t0;
}

function check(r: { exitCode: number; replayed?: boolean }, replayed: boolean, what: string): void {
  if (r.exitCode !== 0) throw new Error(`${what}: exit ${r.exitCode}`);
  if ((r.replayed === true) !== replayed) throw new Error(`${what}: expected replayed=${replayed}, got ${r.replayed}`);
}

interface Results {
  exec: Summary;
  logged: Summary;
  /** The node's own measure of each logged `crun exec`: the rest of the round trip is Paddock and the log. */
  loggedNode: Summary;
  execNode: Summary;
  /** Round trip minus the node's crun exec: what is left once crun's own (noisy) time is taken out. */
  loggedRest: Summary;
  execRest: Summary;
  /** Two bare JetStream writes (a claim, then a result on its sequence) from the bench process. */
  floor: Summary;
  record: number;
  replay: number;
  /** Of `replay`, the attach: reading the rollout's record and its log. */
  attach: number;
  replayNode: number;
  reexec: number;
}

async function measure(pdk: Paddock, o: Options): Promise<Results> {
  const made: Rollout[] = [];
  const start = async (): Promise<Rollout> => {
    const ro = await pdk.rollouts.start({ retentionSec: 3600 });
    made.push(ro);
    return ro;
  };
  try {
    const ro = await start();
    const sb: Sandbox = ro.sandbox;
    progress(`warm-up: ${WARMUP} plain and ${WARMUP} logged execs`);
    const warm = `${ro.rolloutId}-warm`;
    for (let i = 0; i < WARMUP; i++) {
      await sb.exec(['true']);
      await sb.exec(['true'], { rolloutId: warm, step: i });
    }
    await pdk.rollouts.delete(warm);

    progress(`overhead: ${o.n} execs of true without a step, ${o.n} as steps, and ${o.n} pairs of bare log writes, interleaved`);
    const exec: number[] = [];
    const logged: number[] = [];
    const execNode: number[] = [];
    const loggedNode: number[] = [];
    // The floor of a step's logging: the two JetStream writes it waits for (claim, then result), from here.
    const js = jetstream(connectionOf(pdk));
    const floorId = `${ro.rolloutId}-floor`;
    const record = new Uint8Array(300);
    const floor: number[] = [];
    for (let i = 0; i < o.n; i++) {
      const t2 = performance.now();
      const claim = await js.publish(subjects.chronusStep(floorId, i), record, { expect: { lastSubjectSequence: 0 } });
      await js.publish(subjects.chronusStep(floorId, i), record, { expect: { lastSubjectSequence: claim.seq } });
      floor.push(performance.now() - t2);
      const t0 = performance.now();
      const a = await sb.exec(['true']);
      exec.push(performance.now() - t0);
      execNode.push(a.durationMs);
      check(a, false, 'exec');
      const t1 = performance.now();
      const b = await ro.exec(['true']);
      logged.push(performance.now() - t1);
      loggedNode.push(b.durationMs);
      check(b, false, `step ${b.step}`);
    }
    await pdk.rollouts.delete(floorId);

    // Recording and re-executing alternate, so that both see the same background load.
    progress(`replay: recording a rollout of ${o.steps} steps, and re-executing each command once more`);
    const long = await start();
    let recording = 0;
    let reexec = 0;
    for (let i = 0; i < o.steps; i++) {
      recording += await timed(async () => check(await long.exec(['true']), false, `step ${i}`));
      reexec += await timed(async () => check(await long.sandbox.exec(['true']), false, 'exec'));
    }
    progress(`replay: a fresh attach replays the ${o.steps} steps`);
    let attach = 0;
    const replay = await timed(async () => {
      const t0 = performance.now();
      const again = await pdk.rollouts.attach(long.rolloutId);
      attach = performance.now() - t0;
      for (let i = 0; i < o.steps; i++) check(await again.exec(['true']), true, `replay ${i}`);
    });
    progress('replay: the same through the node (attach without prefetch)');
    const replayNode = await timed(async () => {
      const again = await pdk.rollouts.attach(long.rolloutId, { prefetch: false });
      for (let i = 0; i < o.steps; i++) check(await again.exec(['true']), true, `node replay ${i}`);
    });
    const rest = (rt: number[], node: number[]) => summarize(rt.map((x, i) => x - (node[i] as number)));
    return {
      exec: summarize(exec),
      logged: summarize(logged),
      execNode: summarize(execNode),
      loggedNode: summarize(loggedNode),
      execRest: rest(exec, execNode),
      loggedRest: rest(logged, loggedNode),
      floor: summarize(floor),
      record: recording,
      replay,
      attach,
      replayNode,
      reexec,
    };
  } finally {
    for (const ro of made) await pdk.rollouts.delete(ro.rolloutId, { kill: true }).catch(() => {});
  }
}

const fmt = (x: number) => (Number.isFinite(x) ? x.toFixed(3) : '—');

function report(o: Options, r: Results): string {
  const overhead = r.logged.p50 - r.exec.p50;
  const speedup = r.reexec / r.replay;
  const nodeSpeedup = r.reexec / r.replayNode;
  return [
    `Paddock chronus — ${o.n} exec samples each (after ${WARMUP} warm-ups), ${o.steps} replayed steps; ${cpus().length} cores`,
    '',
    `exec true, no step      p50 ${fmt(r.exec.p50)}  p99 ${fmt(r.exec.p99)} ms   (the node's crun exec p50 ${fmt(r.execNode.p50)} ms)`,
    `exec true, as a step    p50 ${fmt(r.logged.p50)}  p99 ${fmt(r.logged.p99)} ms   (the node's crun exec p50 ${fmt(r.loggedNode.p50)} ms)`,
    `logging overhead        p50 ${fmt(overhead)} ms   target ≤ ${TARGET_OVERHEAD_MS} ms   ${overhead <= TARGET_OVERHEAD_MS ? 'PASS' : 'FAIL'}`,
    `  without crun's own time (round trip − the node's crun exec): p50 ${fmt(r.execRest.p50)} → ${fmt(r.loggedRest.p50)} ms, +${fmt(r.loggedRest.p50 - r.execRest.p50)} ms`,
    `  floor: the two JetStream writes a step waits for, bare, p50 ${fmt(r.floor.p50)} ms (p99 ${fmt(r.floor.p99)}); overhead / floor ${(overhead / r.floor.p50).toFixed(2)}×`,
    '',
    `${o.steps} steps: record ${fmt(r.record)} ms, re-execute ${fmt(r.reexec)} ms`,
    `replay (attach + prefetch)      ${fmt(r.replay)} ms   ${speedup.toFixed(1)}× faster than re-execution   target ≥ ${TARGET_SPEEDUP}×   ${speedup >= TARGET_SPEEDUP ? 'PASS' : 'FAIL'}`,
    `  of which the attach (rollout record + one read of the log) ${fmt(r.attach)} ms`,
    `replay through the node         ${fmt(r.replayNode)} ms   ${nodeSpeedup.toFixed(1)}× (one request and one log read per step)`,
  ].join('\n');
}

function json(o: Options, r: Results): string {
  const per1000 = (ms: number) => round3((ms * 1000) / o.steps);
  return JSON.stringify({
    execP50Ms: round3(r.exec.p50),
    loggedExecP50Ms: round3(r.logged.p50),
    loggedExecP99Ms: round3(r.logged.p99),
    replay1000Ms: per1000(r.replay),
    reexec1000Ms: per1000(r.reexec),
    execP99Ms: round3(r.exec.p99),
    overheadP50Ms: round3(r.logged.p50 - r.exec.p50),
    overheadNoCrunP50Ms: round3(r.loggedRest.p50 - r.execRest.p50),
    floorTwoWritesP50Ms: round3(r.floor.p50),
    nodeReplay1000Ms: per1000(r.replayNode),
    record1000Ms: per1000(r.record),
    replayAttachMs: round3(r.attach),
    replaySpeedup: round3(r.reexec / r.replay),
    steps: o.steps,
    n: o.n,
  });
}

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  const imagesDir = process.env.PADDOCK_IMAGES_DIR || '/var/lib/paddock/images';
  const home = await mkdtemp(join(tmpdir(), 'paddock-bench-chronus-'));
  let cluster: LocalCluster | undefined;
  let pdk: Paddock | undefined;
  const stop = async () => {
    await pdk?.close().catch(() => {});
    await cluster?.stop();
    await rm(home, { recursive: true, force: true });
  };
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    process.once(sig, () => {
      progress(`${sig}: cleaning up`);
      void stop().finally(() => process.exit(130));
    });
  }
  try {
    progress(`starting a local node (home ${home}, images ${imagesDir})`);
    cluster = await startLocalCluster({ home, nodes: 1, prefix: `benchc${process.pid}n`, imagesDir });
    pdk = await Paddock.connect({ servers: cluster.url });
    const r = await measure(pdk, o);
    process.stdout.write(`${report(o, r)}\n`);
    if (o.json) process.stdout.write(`${json(o, r)}\n`);
  } finally {
    await stop();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench failed: ${err instanceof UsageError ? err.message : err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exitCode = 1;
});
