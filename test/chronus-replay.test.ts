/**
 * Replay compatibility: rollouts recorded by older Paddocks (test/fixtures/chronus/v<N>-*, made by
 * record-fixture.ts) are loaded, byte for byte, into a fresh log and replayed through a real node
 * and through the SDK. Every step must come back replayed with exactly what the trainer got when it
 * was recorded; a format change that breaks this breaks resumption of rollouts already running.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { jetstream } from '@nats-io/jetstream';
import { Kvm } from '@nats-io/kv';
import { parseStepSubject } from '../chronus/log.ts';
import { RECORD_VERSION, type RolloutRecord } from '../chronus/record.ts';
import { Buckets, encode } from '../protocol/index.ts';
import { connectionOf } from '../sdk/client.ts';
import { NotFoundError, PaddockError, type Sandbox } from '../sdk/index.ts';
import { defined, type Expect, type PlanStep } from './fixtures/chronus/record-fixture.ts';
import { clusterTest } from './helpers/cluster.ts';

const test = clusterTest();
const DIR = fileURLToPath(new URL('./fixtures/chronus/', import.meta.url));
const versions = readdirSync(DIR)
  .map((f) => /^v(\d+)-rollout\.jsonl$/.exec(f)?.[1])
  .filter((v): v is string => v !== undefined)
  .sort((a, b) => Number(a) - Number(b));

const bytes = (b64: string) => Buffer.from(b64, 'base64');
const utf8 = new TextDecoder();

/** A planned step sent straight to the node; what came back, in the plan's terms. */
async function viaNode(sb: Sandbox, rolloutId: string, s: PlanStep): Promise<Expect & { replayed?: boolean }> {
  try {
    if (s.op === 'write') {
      const { replayed, ...result } = await sb.call<{ size: number; replayed?: boolean }>('files.write', defined({ path: s.path, data: bytes(s.data), mode: s.mode, offset: s.offset, rolloutId, step: s.step }));
      return { ok: true, result, replayed };
    }
    const { replayed, ...r } = await sb.call<Record<string, unknown>>(
      'exec',
      defined({ cmd: s.cmd, cwd: s.cwd, env: s.env, stdin: s.stdin === undefined ? undefined : bytes(s.stdin), timeoutMs: s.timeoutMs ?? 60_000, maxOutputBytes: s.maxOutputBytes, rolloutId, step: s.step }),
    );
    return { ok: true, result: { ...r, stdout: Buffer.from(r.stdout as Uint8Array).toString('base64'), stderr: Buffer.from(r.stderr as Uint8Array).toString('base64') }, replayed: replayed as boolean };
  } catch (err) {
    if (!(err instanceof PaddockError)) throw err;
    if (err.code === 'UNKNOWN_OUTCOME') return { unknown: true };
    return { ok: false, code: err.code, message: err.message, replayed: err.detail?.replayed === true };
  }
}

for (const v of versions) {
  test(`a rollout recorded with record version ${v} replays through the node and the SDK, identical`, async (t) => {
    const { pdk } = t.context;
    const records = readFileSync(join(DIR, `v${v}-rollout.jsonl`), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { subject: string; data: string });
    const plan = JSON.parse(readFileSync(join(DIR, `v${v}-plan.json`), 'utf8')) as PlanStep[];
    const rolloutId = parseStepSubject(records[0]?.subject ?? '')?.rolloutId as string;
    t.truthy(rolloutId);
    const js = jetstream(connectionOf(pdk));
    for (const r of records) await js.publish(r.subject, bytes(r.data));

    const sb = await pdk.sandboxes.create({});
    t.teardown(() => sb.kill());
    for (const s of plan) {
      const got = await viaNode(sb, rolloutId, s);
      if (s.expect && 'unknown' in s.expect) t.deepEqual(got, { unknown: true }, `step ${s.step}`);
      else t.deepEqual(got, { ...s.expect, replayed: true }, `step ${s.step}`);
    }
    // Nothing ran in this sandbox: the replayed writes wrote nothing.
    await t.throwsAsync(sb.files.read('/work/data.txt'), { instanceOf: NotFoundError });
    // The log still guards the steps, and the rollout goes on after them.
    const first = plan[0] as PlanStep & { op: 'exec' };
    await t.throwsAsync(sb.exec([...first.cmd, 'changed'], { rolloutId, step: 0 }), { code: 'REPLAY_MISMATCH' });
    t.falsy((await sb.exec(['echo', 'next'], { rolloutId, step: plan.length })).replayed);

    // The SDK's prefetched replay gives the same answers.
    const rec: RolloutRecord = { v: 1, rolloutId, sandbox: sb.id, createdAt: Date.now(), touchedAt: Date.now(), retentionSec: 3600 };
    await (await new Kvm(connectionOf(pdk)).open(Buckets.rollouts)).put(rolloutId, encode(rec));
    const ro = await pdk.rollouts.attach(rolloutId);
    t.is(ro.lastStep, plan.length);
    for (const s of plan) {
      const call =
        s.op === 'write'
          ? ro.files.write(s.path, bytes(s.data), defined({ mode: s.mode, offset: s.offset }))
          : ro.exec(s.cmd, defined({ cwd: s.cwd, env: s.env, stdin: s.stdin === undefined ? undefined : bytes(s.stdin), timeoutMs: s.timeoutMs, maxOutputBytes: s.maxOutputBytes }));
      const got = await call.then(
        (r) => ({ ok: true, r }),
        (e: PaddockError) => ({ ok: false, code: e.code, message: e.message, replayed: e.detail?.replayed }),
      );
      const want = s.expect as Expect;
      if ('unknown' in want) t.like(got, { ok: false, code: 'UNKNOWN_OUTCOME' }, `step ${s.step}`);
      else if (!want.ok) t.deepEqual(got, { ok: false, code: want.code, message: want.message, replayed: true }, `step ${s.step}`);
      else if (s.op === 'write') t.deepEqual(got, { ok: true, r: { step: s.step, replayed: true, ...want.result } }, `step ${s.step}`);
      else {
        const { stdout, stderr, ...rest } = want.result as { stdout: string; stderr: string };
        t.deepEqual(got, { ok: true, r: { step: s.step, replayed: true, ...rest, stdout: utf8.decode(bytes(stdout)), stderr: utf8.decode(bytes(stderr)) } }, `step ${s.step}`);
      }
    }
  });
}

test('there is a replay fixture for the current record version', (t) => {
  t.true(versions.includes(String(RECORD_VERSION)), `run test/fixtures/chronus/record-fixture.ts to record v${RECORD_VERSION}`);
});
