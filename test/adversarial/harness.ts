/**
 * The adversarial suite's fixture: a real cluster per file, a neighbour sandbox on the same node
 * whose exec latency is measured quiet and again while each attack runs, and a row per case for
 * the table `npm run test:adversarial` prints (appended as JSON lines to $PADDOCK_ADV_REPORT).
 */
import { type ChildProcessByStdio, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { appendFile, readFile, rename, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import type { ExecutionContext, TestFn } from 'ava';
import anyTest from 'ava';
import { decode, encode, subjects } from '../../protocol/index.ts';
import { connectionOf } from '../../sdk/client.ts';
import type { Sandbox } from '../../sdk/index.ts';
import { type ClusterContext, startTestCluster, stopTestCluster } from '../helpers/cluster.ts';
import { NEIGHBOUR_RATIO_MAX, type Row } from './report.ts';

export { NEIGHBOUR_RATIO_MAX, type Row };

export interface AdvContext extends ClusterContext {
  neighbour: Sandbox;
  sampler: Sampler;
}

/** The neighbour's trainer in its own process (sampler.ts): one request at a time, one JSON line back. */
export class Sampler {
  private readonly proc: ChildProcessByStdio<Writable, Readable, null>;
  private buf = '';
  private readonly waiting: Array<(line: string) => void> = [];

  constructor(url: string, id: string) {
    this.proc = spawn(process.execPath, ['--import', 'tsx', SAMPLER, url, id], { stdio: ['pipe', 'pipe', 'inherit'] });
    this.proc.stdout.on('data', (d: Buffer) => {
      this.buf += d.toString();
      for (let i = this.buf.indexOf('\n'); i >= 0; i = this.buf.indexOf('\n')) {
        const line = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 1);
        this.waiting.shift()?.(line);
      }
    });
  }

  private next(): Promise<string> {
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  ready(): Promise<string> {
    return this.next();
  }

  async ask(cmd: string): Promise<number[]> {
    const answer = this.next();
    this.proc.stdin.write(`${cmd}\n`);
    return JSON.parse(await answer) as number[];
  }

  start(): void {
    this.proc.stdin.write('start\n');
  }

  close(): void {
    this.proc.stdin.end('exit\n');
    setTimeout(() => this.proc.kill('SIGKILL'), 5000).unref();
  }
}

const SAMPLER = fileURLToPath(new URL('./sampler.ts', import.meta.url));

const QUIET_SAMPLES = 9;
const MIN_ATTACK_SAMPLES = 5;


export function p50(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? Number.NaN : (s[Math.floor((s.length - 1) / 2)] as number);
}

export function advTest(opts: { env?: Record<string, string> } = {}): TestFn<AdvContext> {
  const test = anyTest as TestFn<AdvContext>;
  test.before(async (t) => {
    Object.assign(t.context, await startTestCluster({ env: opts.env }));
    t.context.neighbour = await t.context.pdk.sandboxes.create({ cpu: 1, labels: { role: 'neighbour' } });
    t.context.sampler = new Sampler(t.context.cluster.url, t.context.neighbour.id);
    await t.context.sampler.ready();
  });
  test.after.always(async (t) => {
    t.context.sampler?.close();
    await t.context.neighbour?.kill().catch(() => {});
    await stopTestCluster(t.context.cluster ? t.context : undefined);
  });
  return test;
}

/** The node still answers its own subject, and the neighbour still runs commands. */
export async function nodeServes(c: AdvContext): Promise<boolean> {
  try {
    const node = c.cluster.nodes[0]?.id as string;
    const m = await connectionOf(c.pdk).request(subjects.node(node, 'info'), encode({}), { timeout: 10_000 });
    const reply = decode(m.data) as { ok: boolean };
    const r = await c.neighbour.exec(['echo', 'alive'], { timeoutMs: 10_000 });
    return reply.ok && r.stdout === 'alive\n';
  } catch {
    return false;
  }
}

/**
 * Runs `attack` (which returns the verdict it saw) while the neighbour's exec latency is sampled,
 * then checks the verdict, the node and the neighbour's p50, and records the row.
 */
export async function underAttack(t: ExecutionContext<AdvContext>, name: string, expected: string, attack: () => Promise<string>): Promise<Row> {
  const c = t.context;
  const quiet = await c.sampler.ask(`quiet ${QUIET_SAMPLES}`);
  const run = attack();
  c.sampler.start();
  const verdict = await run.catch((e: unknown) => `threw: ${(e as Error).message}`);
  const during = await c.sampler.ask('stop');
  if (during.length < MIN_ATTACK_SAMPLES) t.log(`${name}: only ${during.length} neighbour samples during the attack`);
  const row: Row = { case: name, expected, verdict, quietMs: round(p50(quiet)), duringMs: round(p50(during)), samples: during.length, nodeServes: await nodeServes(c) };
  t.log(`${name}: verdict ${verdict}; neighbour exec p50 ${row.quietMs} ms quiet, ${row.duringMs} ms during (${during.length} samples)`);
  if (process.env.PADDOCK_ADV_REPORT) await appendFile(process.env.PADDOCK_ADV_REPORT, `${JSON.stringify(row)}\n`);
  t.is(verdict, expected, `${name}: verdict`);
  t.true(row.nodeServes, `${name}: the node still serves`);
  t.true(row.duringMs <= NEIGHBOUR_RATIO_MAX * Math.max(row.quietMs, 1), `${name}: neighbour p50 ${row.duringMs} ms during vs ${row.quietMs} ms quiet`);
  return row;
}

/** Repeats `once` for at least `ms`, so the neighbour is sampled under a sustained attack; returns the verdicts seen. */
export async function sustained(ms: number, once: () => Promise<string>): Promise<string[]> {
  const seen: string[] = [];
  const end = Date.now() + ms;
  do seen.push(await once());
  while (Date.now() < end);
  return seen;
}

/** Whether the sandbox still runs a command after an attack (a killed tree's processes take a moment to be reaped and leave the pids count). */
export async function stillWorks(sb: Sandbox): Promise<boolean> {
  for (let i = 0; i < 20; i++) {
    const r = await sb.exec(['echo', 'ok'], { timeoutMs: 5000 }).catch(() => null);
    if (r?.stdout === 'ok\n') return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}

/** The one verdict all repetitions agree on, or all of them. */
export const only = (verdicts: string[]) => (new Set(verdicts).size === 1 ? (verdicts[0] as string) : verdicts.join(','));

const round = (x: number) => Math.round(x * 100) / 100;

const PROBE_SRC = fileURLToPath(new URL('./probe.c', import.meta.url));

/** The probe program, built static once per source version (the image has no compiler). */
export async function probeBinary(): Promise<Buffer> {
  const src = await readFile(PROBE_SRC);
  const out = join(tmpdir(), `paddock-probe-${createHash('sha256').update(src).digest('hex').slice(0, 16)}`);
  if (!(await stat(out).catch(() => null))) {
    const tmp = `${out}.${process.pid}`;
    await new Promise<void>((resolve, reject) => {
      const cc = spawn('cc', ['-static', '-O1', '-o', tmp, PROBE_SRC], { stdio: ['ignore', 'ignore', 'pipe'] });
      let err = '';
      cc.stderr.on('data', (d: Buffer) => {
        err += d.toString();
      });
      cc.on('error', reject);
      cc.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`cc probe.c: ${err}`))));
    });
    await rename(tmp, out);
  }
  return readFile(out);
}
