/**
 * The preemption story end to end: a trainer process drives a 20-step rollout with non-idempotent
 * steps, is killed with SIGKILL at a random point, and a new trainer process attaches and replays
 * the same 20 steps from step 0. The recorded steps come back replayed, the rest run, and the
 * sandbox's own files show every command ran exactly once. 20 repetitions, 4 at a time.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { ExecutionContext } from 'ava';
import { type ClusterContext, clusterTest } from './helpers/cluster.ts';
import { scriptBundle } from './helpers/script.ts';
import { SLOW_STEP, STEPS } from './fixtures/chronus/trainer.ts';

const test = clusterTest();
const TRAINER = fileURLToPath(new URL('./fixtures/chronus/trainer.ts', import.meta.url));
const REPS = 20;
const PER_TEST = 5;

type Line = { attached?: number; begin?: number; step?: number; replayed?: boolean; out?: string; done?: boolean; error?: string };
interface Run {
  lines: Line[];
  signal: NodeJS.Signals | null;
  stderr: string;
}

/** Runs a trainer process; SIGKILLs it `delayMs` after it announces step `kill.step` (-1: its attach). */
async function trainer(url: string, rolloutId: string, kill?: { step: number; delayMs: number }): Promise<Run> {
  const child: ChildProcess = spawn(process.execPath, [await scriptBundle(TRAINER), url, rolloutId], { stdio: ['ignore', 'pipe', 'pipe'] });
  const lines: Line[] = [];
  let buf = '';
  let stderr = '';
  child.stdout?.on('data', (d: Buffer) => {
    buf += d.toString();
    for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
      const line = JSON.parse(buf.slice(0, nl)) as Line;
      buf = buf.slice(nl + 1);
      lines.push(line);
      const at = kill?.step === -1 ? line.attached !== undefined : line.begin === kill?.step;
      if (kill && at) setTimeout(() => child.kill('SIGKILL'), kill.delayMs);
    }
  });
  child.stderr?.on('data', (d: Buffer) => {
    stderr += d.toString();
  });
  return new Promise((resolve) => child.on('close', (_code, signal) => resolve({ lines, signal, stderr })));
}

const execSteps = Array.from({ length: STEPS }, (_, i) => i).filter((i) => i % 5 !== 2);
const logSteps = Array.from({ length: STEPS }, (_, i) => i).filter((i) => i % 5 === 0 || i % 5 === 3 || i === SLOW_STEP);

/**
 * Where repetition `rep` kills its first trainer (step -1: as soon as it has attached). Fixed cases
 * first: while the slow step runs (the next trainer then finds it still running), before any step,
 * at the first step; the rest at random.
 */
function killPoint(rep: number): { step: number; delayMs: number } {
  if (rep === 0) return { step: SLOW_STEP, delayMs: 50 };
  if (rep === 1) return { step: -1, delayMs: 0 };
  if (rep === 2) return { step: 0, delayMs: 0 };
  return { step: Math.floor(Math.random() * STEPS), delayMs: Math.floor(Math.random() * 60) };
}

/** One repetition: a trainer killed at `killPoint(rep)`, a new one replaying; returns a summary line. */
async function repetition(t: ExecutionContext<ClusterContext>, rep: number): Promise<string> {
  const { pdk, cluster } = t.context;
  const ro = await pdk.rollouts.start({ rolloutId: `pre${process.pid}-${rep}` });
  try {
    const kill = killPoint(rep);
    const first = await trainer(cluster.url, ro.rolloutId, kill);
    const finishedFirst = first.lines.filter((l) => l.step !== undefined);
    const second = await trainer(cluster.url, ro.rolloutId);
    t.true(second.lines.at(-1)?.done, `rep ${rep}: second trainer did not finish: ${JSON.stringify(second.lines.at(-1))} ${second.stderr}`);
    const steps = second.lines.filter((l) => l.step !== undefined);
    t.is(steps.length, STEPS);
    // The first trainer's answers come back, replayed and identical; then the rest run.
    for (const f of finishedFirst) t.deepEqual(steps[f.step as number], { ...f, replayed: true }, `rep ${rep} step ${f.step}`);
    const replayed = steps.filter((s) => s.replayed).length;
    t.true(replayed === finishedFirst.length || replayed === finishedFirst.length + 1, `rep ${rep}: ${replayed} replayed after ${finishedFirst.length} finished`);
    t.deepEqual(
      steps.map((s) => s.replayed),
      steps.map((_, i) => i < replayed),
    );
    // Attach reports the last recorded step: every recorded step replays (one still running is waited for).
    t.is(second.lines[0]?.attached, replayed - 1);

    const ledger = (await ro.sandbox.files.readText('/work/ledger')).trim().split('\n').map(Number);
    t.is(ledger.length - new Set(ledger).size, 0, `rep ${rep}: duplicate executions`);
    t.deepEqual(ledger, execSteps, `rep ${rep}: each command ran once, in order`);
    t.is((await ro.sandbox.files.readText('/work/counter')).trim(), '4');
    t.deepEqual((await ro.sandbox.files.readText('/work/log')).trim().split('\n'), logSteps.map((i) => `step-${i}`));
    return `${rep}: killed ${first.signal ? `at ${kill.step < 0 ? 'attach' : `step ${kill.step}`}+${kill.delayMs}ms` : 'never (it finished first)'}, ${finishedFirst.length} done, ${replayed} replayed`;
  } finally {
    await pdk.rollouts.delete(ro.rolloutId, { kill: true });
  }
}

// Four tests of five repetitions each: ava runs them at once, so four rollouts go at a time.
for (let batch = 0; batch < REPS / PER_TEST; batch++) {
  const reps = Array.from({ length: PER_TEST }, (_, i) => batch * PER_TEST + i);
  test(`a trainer SIGKILLed at a random point and restarted runs every command exactly once (repetitions ${reps[0]}-${reps.at(-1)})`, async (t) => {
    const summary: string[] = [];
    for (const rep of reps) summary.push(await repetition(t, rep));
    t.log(summary.join('\n'));
  });
}
