/**
 * The command log through a real node: steps run at most once, recorded steps replay, bad cases
 * get their codes. (Trainer processes killed mid-rollout: chronus-preempt.test.ts; recorded
 * fixtures and restarts: chronus-replay.test.ts, chronus-restart.test.ts.)
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { connect } from '@nats-io/transport-node';
import pino from 'pino';
import { loadChronusConfig } from '../chronus/config.ts';
import { exportRollout } from '../chronus/export.ts';
import { Journal } from '../chronus/journal.ts';
import { readRollout } from '../chronus/log.ts';
import { subjects } from '../protocol/index.ts';
import { run } from '../runtime/proc.ts';
import { connectionOf } from '../sdk/client.ts';
import {
  AlreadyExistsError,
  InvalidRequestError,
  NotFoundError,
  Paddock,
  type PaddockError,
  ReplayMismatchError,
  type Sandbox,
  StepError,
} from '../sdk/index.ts';
import { clusterTest } from './helpers/cluster.ts';

const test = clusterTest();
const ROOT = fileURLToPath(new URL('..', import.meta.url));
let rollouts = 0;
/** A fresh rollout id per test: ids are global in the log. */
const rid = (name: string) => `t${process.pid}-${++rollouts}-${name}`;

async function sandbox(t: { context: { pdk: Paddock }; teardown: (f: () => Promise<unknown>) => void }): Promise<Sandbox> {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  return sb;
}

test('a step runs once: asking for it again replays the recorded result and runs nothing', async (t) => {
  const sb = await sandbox(t);
  const r = rid('once');
  const append = 'echo ran >> /tmp/log; wc -l < /tmp/log; echo err >&2; exit 3';
  const first = await sb.exec(append, { rolloutId: r, step: 0 });
  t.is(first.exitCode, 3);
  t.is(first.stdout.trim(), '1');
  t.is(first.stderr, 'err\n');
  t.falsy(first.replayed);
  const again = await sb.exec(append, { rolloutId: r, step: 0 });
  t.true(again.replayed);
  t.deepEqual({ ...again, replayed: undefined }, { ...first, replayed: undefined }, 'the recorded result, timings included');
  t.is(await sb.files.readText('/tmp/log'), 'ran\n', 'the command ran once');
  // The next step runs; the log is per rollout, so another rollout's step 0 runs too.
  t.is((await sb.exec(append, { rolloutId: r, step: 1 })).stdout.trim(), '2');
  t.is((await sb.exec(append, { rolloutId: rid('other'), step: 0 })).stdout.trim(), '3');
  // Without a step nothing is recorded: it just runs.
  t.is((await sb.exec(append)).stdout.trim(), '4');
});

test('a different request on a recorded step is REPLAY_MISMATCH, and nothing runs', async (t) => {
  const sb = await sandbox(t);
  const r = rid('mismatch');
  await sb.exec(['sh', '-c', 'echo a >> /tmp/m'], { rolloutId: r, step: 0 });
  const err = await t.throwsAsync(sb.exec(['sh', '-c', 'echo b >> /tmp/m'], { rolloutId: r, step: 0 }), { instanceOf: ReplayMismatchError });
  t.is(err?.code, 'REPLAY_MISMATCH');
  t.false(err?.retryable);
  t.regex(err?.message ?? '', /recorded as `exec sh -c 'echo a >> \/tmp\/m'`/);
  t.is(err?.detail?.step, 0);
  // Request equality covers cwd, env and stdin; limits (the timeout) are not part of it.
  await t.throwsAsync(sb.exec(['sh', '-c', 'echo a >> /tmp/m'], { rolloutId: r, step: 0, env: { X: '1' } }), { code: 'REPLAY_MISMATCH' });
  await t.throwsAsync(sb.exec(['sh', '-c', 'echo a >> /tmp/m'], { rolloutId: r, step: 0, cwd: '/tmp' }), { code: 'REPLAY_MISMATCH' });
  await t.throwsAsync(sb.exec(['sh', '-c', 'echo a >> /tmp/m'], { rolloutId: r, step: 0, stdin: 'x' }), { code: 'REPLAY_MISMATCH' });
  t.true((await sb.exec(['sh', '-c', 'echo a >> /tmp/m'], { rolloutId: r, step: 0, timeoutMs: 1234 })).replayed);
  // An exec where a write was recorded is a mismatch too.
  await sb.files.write('/tmp/w', 'x');
  await t.throwsAsync(sb.call('files.write', { path: '/tmp/m', data: new Uint8Array([1]), rolloutId: r, step: 0 }), { code: 'REPLAY_MISMATCH' });
  t.is(await sb.files.readText('/tmp/m'), 'a\n');
});

test('a step that skips ahead is refused with STEP_OUT_OF_ORDER; steps start at 0', async (t) => {
  const sb = await sandbox(t);
  const r = rid('order');
  const err = await t.throwsAsync(sb.exec(['true'], { rolloutId: r, step: 1 }), { instanceOf: StepError });
  t.is(err?.code, 'STEP_OUT_OF_ORDER');
  t.regex(err?.message ?? '', /step 0 is not recorded/);
  await sb.exec(['true'], { rolloutId: r, step: 0 });
  await t.throwsAsync(sb.exec(['true'], { rolloutId: r, step: 5 }), { code: 'STEP_OUT_OF_ORDER' });
  await sb.exec(['true'], { rolloutId: r, step: 1 });
  // Going back is a replay, not a skip.
  t.true((await sb.exec(['true'], { rolloutId: r, step: 0 })).replayed);
  t.false((await sb.exec(['true'], { rolloutId: r, step: 2 })).replayed ?? false);
});

test('bad step fields are INVALID_REQUEST', async (t) => {
  const sb = await sandbox(t);
  for (const body of [{ rolloutId: 'r' }, { step: 0 }, { rolloutId: 'a.b', step: 0 }, { rolloutId: 'r', step: -1 }, { rolloutId: 'r', step: 1.5 }, { rolloutId: 'r', step: '0' }, { rolloutId: '', step: 0 }]) {
    const err = await t.throwsAsync(sb.call('exec', { cmd: ['true'], ...body }), { instanceOf: InvalidRequestError }, JSON.stringify(body));
    t.regex(err?.detail?.field as string, /^(rolloutId|step)$/);
    await t.throwsAsync(sb.call('files.write', { path: '/tmp/x', data: new Uint8Array(1), ...body }), { instanceOf: InvalidRequestError });
  }
});

test('a streamed exec as a rollout step streams as it runs, is recorded whole, and replays its recorded output without running', async (t) => {
  const sb = await sandbox(t);
  const rolloutId = rid('stream');
  const run = async () => {
    const events = [];
    for await (const ev of sb.execStream(['sh', '-c', 'echo run >> /tmp/runs; echo out; echo err >&2; exit 4'], { rolloutId, step: 0 })) events.push(ev);
    return events;
  };
  const first = await run();
  t.is(first.filter((e) => e.type === 'stdout').map((e) => (e as { text: string }).text).join(''), 'out\n');
  t.like(first.at(-1), { type: 'exit', exitCode: 4, verdict: 'OK' });
  t.falsy((first.at(-1) as { replayed?: boolean }).replayed);
  const again = await run();
  t.is(again.filter((e) => e.type === 'stdout').map((e) => (e as { text: string }).text).join(''), 'out\n');
  t.is(again.filter((e) => e.type === 'stderr').map((e) => (e as { text: string }).text).join(''), 'err\n');
  t.like(again.at(-1), { type: 'exit', exitCode: 4, replayed: true });
  t.is(await sb.files.readText('/tmp/runs'), 'run\n');
  // The plain exec of the same step is answered from the same record.
  const plain = await sb.exec(['sh', '-c', 'echo run >> /tmp/runs; echo out; echo err >&2; exit 4'], { rolloutId, step: 0 });
  t.like(plain, { replayed: true, stdout: 'out\n', stderr: 'err\n', exitCode: 4 });
  // A step whose output could not fit one record is refused before it runs.
  const big = sb.execStream(['true'], { rolloutId, step: 1, maxOutputBytes: 64 * 1024 * 1024 });
  const err = await t.throwsAsync(async () => {
    for await (const _ of big) {
      // nothing arrives
    }
  });
  t.is((err as PaddockError).code, 'INVALID_REQUEST');
});

test('writes are steps too; a recorded failure replays as the same error', async (t) => {
  const sb = await sandbox(t);
  const r = rid('write');
  const w = (step: number, path: string, text: string) => sb.call<{ size: number; replayed?: boolean }>('files.write', { path, data: new TextEncoder().encode(text), rolloutId: r, step });
  t.deepEqual(await w(0, '/work/a.txt', 'hello'), { size: 5 });
  await sb.files.write('/work/a.txt', 'changed by hand');
  t.deepEqual(await w(0, '/work/a.txt', 'hello'), { size: 5, replayed: true });
  t.is(await sb.files.readText('/work/a.txt'), 'changed by hand', 'a replayed write writes nothing');
  await t.throwsAsync(w(0, '/work/a.txt', 'hellO'), { code: 'REPLAY_MISMATCH' });
  // A write onto a directory fails; the failure is the step's recorded outcome.
  const e1 = await t.throwsAsync(w(1, '/work', 'x'), { instanceOf: InvalidRequestError });
  t.falsy(e1?.detail?.replayed);
  const e2 = await t.throwsAsync(w(1, '/work', 'x'), { instanceOf: InvalidRequestError });
  t.is(e2?.message, e1?.message);
  t.true(e2?.detail?.replayed);
});

test('huge output: the capped output is what is recorded and replayed', async (t) => {
  const sb = await sandbox(t);
  const r = rid('huge');
  const first = await sb.exec(['yes'], { rolloutId: r, step: 0, timeoutMs: 20_000 });
  t.true(first.truncated);
  t.is(first.stdout.length, 1024 * 1024);
  const again = await sb.exec(['yes'], { rolloutId: r, step: 0, timeoutMs: 20_000 });
  t.true(again.replayed);
  t.is(again.stdout, first.stdout);
  // An output cap whose result could not fit one message is refused before anything is recorded…
  await t.throwsAsync(sb.exec(['true'], { rolloutId: r, step: 1, maxOutputBytes: 8 * 1024 * 1024 }), { instanceOf: InvalidRequestError });
  // …so the step is still free. 4 MiB of stdin is recorded whole.
  const stdin = new Uint8Array(4 * 1024 * 1024).fill(97);
  const big = await sb.exec(['wc', '-c'], { rolloutId: r, step: 1, stdin });
  t.is(big.stdout.trim(), String(stdin.length));
  t.true((await sb.exec(['wc', '-c'], { rolloutId: r, step: 1, stdin })).replayed);
  await t.throwsAsync(sb.exec(['wc', '-c'], { rolloutId: r, step: 1, stdin: stdin.subarray(1) }), { code: 'REPLAY_MISMATCH' });
});

test('two trainers racing on one step: one runs it; the other gets REPLAY_MISMATCH, or STEP_CONFLICT until the result is in', async (t) => {
  const sb = await sandbox(t);
  const other = await Paddock.connect({ servers: t.context.cluster.url });
  t.teardown(() => other.close());
  const sb2 = await other.sandboxes.get(sb.id);
  const r = rid('race');
  const cmd = 'sleep 0.5; echo A >> /tmp/race; echo A';
  const a = sb.exec(cmd, { rolloutId: r, step: 0 });
  await new Promise((res) => setTimeout(res, 150));
  // Another command for the step, while the first runs: it can never be this step.
  await t.throwsAsync(sb2.exec('echo B >> /tmp/race; echo B', { rolloutId: r, step: 0 }), { instanceOf: ReplayMismatchError });
  // The same command: it is running; retrying once it has finished gets its result.
  const b = await t.throwsAsync(sb2.exec(cmd, { rolloutId: r, step: 0 }), { instanceOf: StepError });
  t.is(b?.code, 'STEP_CONFLICT');
  t.true(b?.retryable);
  t.true(b?.detail?.inFlight);
  t.is((await a).stdout, 'A\n');
  t.true((await sb2.exec(cmd, { rolloutId: r, step: 0 })).replayed);
  await t.throwsAsync(sb2.exec('echo B >> /tmp/race; echo B', { rolloutId: r, step: 0 }), { code: 'REPLAY_MISMATCH' });
  t.is(await sb.files.readText('/tmp/race'), 'A\n');

  // Many at once, the same step with the same command: exactly one runs, the others replay it or wait.
  const r2 = rid('race-many');
  const settled = await Promise.allSettled(Array.from({ length: 8 }, (_, i) => (i % 2 ? sb : sb2).exec('echo x >> /tmp/many; echo ok', { rolloutId: r2, step: 0 })));
  const ran = settled.filter((s) => s.status === 'fulfilled' && !s.value.replayed).length;
  const conflicts = settled.filter((s) => s.status === 'rejected' && (s.reason as PaddockError).code === 'STEP_CONFLICT').length;
  t.is(ran, 1);
  t.is(ran + conflicts + settled.filter((s) => s.status === 'fulfilled' && s.value.replayed).length, 8);
  t.is(await sb.files.readText('/tmp/many'), 'x\n');
});

test('rollouts: start, attach finds the same sandbox and the last step, the counter replays from 0', async (t) => {
  const { pdk } = t.context;
  const ro = await pdk.rollouts.start({ sandbox: { labels: { job: 'chronus' } } });
  t.teardown(() => pdk.rollouts.delete(ro.rolloutId, { kill: true }));
  t.regex(ro.rolloutId, /^ro-[a-z2-7]{16}$/);
  t.is(ro.lastStep, -1);
  t.is(ro.sandbox.info.labels['paddock.rollout'], ro.rolloutId);
  const s0 = await ro.exec('echo one >> /work/log; cat /work/log', { cwd: '/' });
  const s1 = await ro.files.write('/work/note', 'n1');
  const s2 = await ro.exec(['sh', '-c', 'n=$(cat /work/n 2>/dev/null || echo 0); echo $((n+1)) | tee /work/n']);
  t.deepEqual([s0.step, s1.step, s2.step], [0, 1, 2]);
  t.false(s0.replayed || s1.replayed || s2.replayed);

  const again = await pdk.rollouts.attach(ro.rolloutId);
  t.is(again.sandbox.id, ro.sandbox.id);
  t.is(again.lastStep, 2);
  const r0 = await again.exec('echo one >> /work/log; cat /work/log', { cwd: '/' });
  t.true(r0.replayed);
  t.deepEqual({ ...r0, replayed: false }, s0);
  t.deepEqual(await again.files.write('/work/note', 'n1'), { ...s1, replayed: true });
  t.deepEqual({ ...(await again.exec(['sh', '-c', 'n=$(cat /work/n 2>/dev/null || echo 0); echo $((n+1)) | tee /work/n'])), replayed: false }, s2);
  const s3 = await again.exec('cat /work/log /work/n');
  t.false(s3.replayed);
  t.is(s3.stdout, 'one\n1\n');

  // Without the prefetch, the node replays: the same results.
  const third = await pdk.rollouts.attach(ro.rolloutId, { prefetch: false });
  t.is(third.lastStep, 3);
  t.deepEqual(await third.exec('echo one >> /work/log; cat /work/log', { cwd: '/' }), { ...s0, replayed: true });
  await t.throwsAsync(third.exec('echo two >> /work/log'), { instanceOf: ReplayMismatchError });
  // The prefetched path says mismatch the same way.
  const fourth = await pdk.rollouts.attach(ro.rolloutId);
  await fourth.exec('echo one >> /work/log; cat /work/log', { cwd: '/' });
  const mm = await t.throwsAsync(fourth.exec('echo two >> /work/log'), { instanceOf: ReplayMismatchError });
  t.regex(mm?.message ?? '', /step 1 of rollout .* is recorded as `write \/work\/note \(2 bytes\)`/);

  // A failure that is not the step's outcome leaves the counter on the step; one that is uses it up.
  const next = fourth.lastStep + 1;
  await t.throwsAsync(fourth.exec('true', { step: next, cwd: 'relative' }), { instanceOf: InvalidRequestError });
  t.is(fourth.nextStep, next);
  const failed = await t.throwsAsync(fourth.files.write('/work', 'x', { step: next }), { instanceOf: InvalidRequestError });
  t.is(failed?.detail?.step, next);
  t.is(fourth.nextStep, next + 1);
  t.is((await fourth.exec('true')).step, next + 1);

  await t.throwsAsync(pdk.rollouts.start({ rolloutId: ro.rolloutId }), { instanceOf: AlreadyExistsError });
  await t.throwsAsync(pdk.rollouts.attach('no-such-rollout'), { instanceOf: NotFoundError });
  await t.throwsAsync(pdk.rollouts.attach('bad.id'), { instanceOf: InvalidRequestError });
});

test('attach to a hibernated sandbox: replay needs nothing of it, a new step wakes it', async (t) => {
  const { pdk } = t.context;
  const ro = await pdk.rollouts.start({ rolloutId: rid('sleepy') });
  t.teardown(() => pdk.rollouts.delete(ro.rolloutId, { kill: true }));
  await ro.exec('echo 1 > /work/x');
  await ro.sandbox.hibernate();
  const again = await pdk.rollouts.attach(ro.rolloutId);
  t.is(again.sandbox.info.state, 'hibernated');
  t.true((await again.exec('echo 1 > /work/x')).replayed);
  t.is((await again.sandbox.refresh()).state, 'hibernated', 'a replay does not wake the sandbox');
  t.is((await again.exec('cat /work/x')).stdout, '1\n');
  t.is((await again.sandbox.refresh()).state, 'running');
});

test('deleting a rollout deletes its records; retention deletes them once it runs out', async (t) => {
  const { pdk, cluster } = t.context;
  const ro = await pdk.rollouts.start({ rolloutId: rid('del') });
  t.teardown(() => ro.sandbox.kill());
  await ro.exec('echo x >> /tmp/d');
  await ro.exec('echo y >> /tmp/d');
  t.is((await readRollout(connectionOf(pdk), ro.rolloutId, 'all')).length, 4);
  await pdk.rollouts.delete(ro.rolloutId);
  t.deepEqual(await readRollout(connectionOf(pdk), ro.rolloutId, 'all'), []);
  t.is(await pdk.rollouts.get(ro.rolloutId), null);
  // The log is gone: step 0 runs again (this is what deleting a rollout means).
  t.falsy((await ro.sandbox.exec('echo x >> /tmp/d', { rolloutId: ro.rolloutId, step: 0 })).replayed);
  t.is(await ro.sandbox.files.readText('/tmp/d'), 'x\ny\nx\n');

  // Retention: a rollout kept 60 s, looked at 61 s after its last record, is swept; a fresh one is not.
  const short = await pdk.rollouts.start({ rolloutId: rid('short'), retentionSec: 60 });
  const long = await pdk.rollouts.start({ rolloutId: rid('long'), retentionSec: 3600 });
  t.teardown(() => short.sandbox.kill());
  t.teardown(() => pdk.rollouts.delete(long.rolloutId, { kill: true }));
  await short.exec('true');
  await long.exec('true');
  const nc = await connect({ servers: cluster.url });
  t.teardown(() => nc.close());
  const journal = await Journal.open(nc, { nodeId: 'sweeper-test', log: pino({ level: 'silent' }), config: loadChronusConfig({}), maxPayload: 1024 * 1024 });
  t.false((await journal.sweep(Date.now() + 30_000)).includes(short.rolloutId));
  const gone = await journal.sweep(Date.now() + 61_000);
  t.true(gone.includes(short.rolloutId));
  t.false(gone.includes(long.rolloutId));
  t.is(await pdk.rollouts.get(short.rolloutId), null);
  t.deepEqual(await readRollout(connectionOf(pdk), short.rolloutId, 'all'), []);
  t.is((await readRollout(connectionOf(pdk), long.rolloutId, 'all')).length, 2);
  // One sweep per period for the whole cluster: of two nodes that look at once, one sweeps, and
  // neither again until the period has passed (an hour ahead: the cluster's own nodes look now).
  const other = await Journal.open(nc, { nodeId: 'sweeper-test-2', log: pino({ level: 'silent' }), config: loadChronusConfig({}), maxPayload: 1024 * 1024 });
  const later = Date.now() + 3_600_000;
  const claims = await Promise.all([journal.claimSweep(later), other.claimSweep(later)]);
  t.is(claims.filter(Boolean).length, 1);
  t.false(await journal.claimSweep(later + 30_000));
  t.false(await other.claimSweep(later + 30_000));
  t.true(await other.claimSweep(later + 61_000));
});

test('export writes the trajectory as JSONL, one line per step', async (t) => {
  const { pdk } = t.context;
  const ro = await pdk.rollouts.start({ rolloutId: rid('export') });
  t.teardown(() => pdk.rollouts.delete(ro.rolloutId, { kill: true }));
  await ro.exec(['sh', '-c', 'echo out; echo err >&2; exit 2'], { env: { A: 'b' } });
  await ro.files.write('/work/f.txt', 'content\n');
  await ro.exec('printf "\\377\\376"');
  const lines: string[] = [];
  const n = await exportRollout(connectionOf(pdk), ro.rolloutId, (line) => {
    lines.push(line);
  });
  t.is(n, 3);
  const [a, b, c] = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  t.like(a, { rolloutId: ro.rolloutId, step: 0, op: 'exec', cmd: ['sh', '-c', 'echo out; echo err >&2; exit 2'], env: { A: 'b' }, status: 'ok', exitCode: 2, stdout: 'out\n', stderr: 'err\n', sandbox: ro.sandbox.id });
  t.true(typeof a?.durationMs === 'number' && typeof a.startedAt === 'string' && typeof a.endedAt === 'string');
  t.like(b, { step: 1, op: 'write', path: '/work/f.txt', size: 8, data: 'content\n', status: 'ok' });
  t.like(c, { step: 2, stdoutBase64: Buffer.from([0xff, 0xfe]).toString('base64') });
  t.is(subjects.chronusStep(ro.rolloutId, 2), `pdk.v1.chronus.${ro.rolloutId}.2`);

  // The CLI: to stdout, and to a file.
  const cli = (...args: string[]) => run(process.execPath, ['--import', 'tsx', join(ROOT, 'ops/cli/main.ts'), '--nats', t.context.cluster.url, 'chronus', 'export', ...args], { allowFail: true });
  const stdout = await cli(ro.rolloutId);
  t.is(stdout.code, 0, stdout.stderr);
  t.deepEqual(stdout.stdout.trimEnd().split('\n'), lines);
  const file = join(t.context.home, 'trajectory.jsonl');
  t.is((await cli(ro.rolloutId, file)).code, 0);
  t.deepEqual((await readFile(file, 'utf8')).trimEnd().split('\n'), lines);
  const missing = await cli('no-such-rollout');
  t.is(missing.code, 2);
  t.regex(missing.stderr, /NOT_FOUND: rollout no-such-rollout does not exist/);
  t.is((await cli()).code, 2);
});

test('racing requests, on one node or two, run a step once and never report it lost', async (t) => {
  const nc = await connect({ servers: t.context.cluster.url });
  t.teardown(() => nc.close());
  const open = (nodeId: string) => Journal.open(nc, { nodeId, log: pino({ level: 'silent' }), config: loadChronusConfig({}), maxPayload: 1024 * 1024 });
  const [a, b, c] = await Promise.all([open('race-a'), open('race-b'), open('race-c')]);
  let runs = 0;
  const result = { verdict: 'OK' as const, exitCode: 0, stdout: new Uint8Array(0), stderr: new Uint8Array(0), durationMs: 50, truncated: false, timedOut: false };
  const run = async () => {
    runs++;
    await new Promise((r) => setTimeout(r, 50));
    return result;
  };
  const req = { cmd: ['true'], timeoutMs: 1000, maxOutputBytes: 10 };
  for (let i = 0; i < 5; i++) {
    // Step 0 recorded elsewhere: a and b look it up before they claim step 1 (the window a race needs).
    const rolloutId = rid('journal');
    await c.exec({ rolloutId, step: 0, sandbox: 'sb-test' }, req, async () => result);
    const key = { rolloutId, step: 1, sandbox: 'sb-test' };
    const settled = await Promise.allSettled(Array.from({ length: 12 }, (_, i) => (i % 2 ? a : b).exec(key, req, run)));
    const codes = settled.map((s) => (s.status === 'fulfilled' ? (s.value.replayed ? 'replayed' : 'ran') : (s.reason as { code: string }).code));
    t.is(codes.filter((c) => c === 'ran').length, 1, codes.join(' '));
    t.deepEqual(
      codes.filter((c) => c !== 'ran' && c !== 'replayed' && c !== 'STEP_CONFLICT'),
      [],
    );
    t.like(await b.exec(key, req, run), { replayed: true, exitCode: 0 });
  }
  t.is(runs, 5);
});
