/**
 * FnCall's pure parts: request validation, output comparison, verdicts, the runner's wire format,
 * pool configuration, the CLI's exit status. No cluster, no containers.
 */
import test from 'ava';
import { ProtocolError, validateFnInvoke } from '../protocol/index.ts';
import { parsePool } from '../runtime/config.ts';
import { exitStatusOf } from '../ops/cli/fn.ts';
import { aggregate, judgeRun, previewOf, sameOutput } from '../runtime/fncall/judge.ts';
import type { RunLimits, RunOutcome } from '../runtime/fncall/member.ts';
import { decodeAnswer, encodeJob, FrameReader, waitStatus } from '../runtime/fncall/runner.ts';

const b = (s: string) => Buffer.from(s);
const LIMITS: RunLimits = { timeMs: 1000, wallMs: 2200, memoryMiB: 64, outputBytes: 1000 };
const outcome = (o: Partial<RunOutcome> = {}): RunOutcome => ({ exitCode: 0, stdout: b(''), stderr: b(''), cpuMs: 10, wallMs: 12, maxRssBytes: 8 << 20, ...o });

function code(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    if (e instanceof ProtocolError) return `${e.code}:${String(e.detail?.field ?? '')}`;
    throw e;
  }
  return undefined;
}

test('an invocation gets its defaults: CPU time, a wall clock of twice that, memory, output', (t) => {
  const r = validateFnInvoke({ language: 'python', code: 'print(1)' });
  t.deepEqual(r.limits, { timeMs: 2000, wallMs: 4200, memoryMiB: 256, outputBytes: 1024 * 1024 });
  t.deepEqual(Buffer.from(r.code ?? []).toString(), 'print(1)');
  t.is(r.compare, 'lines');
  t.deepEqual(validateFnInvoke({ language: 'c', code: 'x', limits: { timeMs: 100 } }).limits.wallMs, 400);
  const img = validateFnInvoke({ image: 'busybox', command: ['sh', '-c', 'cat'], stdin: new Uint8Array([1, 2]) });
  t.deepEqual(img.command, ['sh', '-c', 'cat']);
  t.deepEqual([...img.stdin], [1, 2]);
});

test('bad invocations are refused with a code and the field at fault', (t) => {
  t.is(code(() => validateFnInvoke({ language: 'cobol', code: 'x' })), 'INVALID_SPEC:language');
  t.is(code(() => validateFnInvoke({ code: 'x' })), 'INVALID_REQUEST:language');
  t.is(code(() => validateFnInvoke({ language: 'python', image: 'python', code: 'x' })), 'INVALID_REQUEST:language');
  t.is(code(() => validateFnInvoke({ language: 'python' })), 'INVALID_REQUEST:code');
  t.is(code(() => validateFnInvoke({ image: 'busybox' })), 'INVALID_REQUEST:command');
  t.is(code(() => validateFnInvoke({ image: '../etc', command: ['x'] })), 'INVALID_REQUEST:image');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 'x', limits: { timeMs: -1 } })), 'INVALID_REQUEST:limits.timeMs');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 'x', limits: { memoryMiB: 1e9 } })), 'INVALID_REQUEST:limits.memoryMiB');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 'x', limits: { gpus: 1 } })), 'INVALID_REQUEST:limits.gpus');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 'x', files: { '../x': 'y' } })), 'INVALID_REQUEST:files');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 'x', files: { '/etc/passwd': 'y' } })), 'INVALID_REQUEST:files');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 'x', tests: [] })), 'INVALID_REQUEST:tests');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 'x', tests: [{}], stdin: 'y' })), 'INVALID_REQUEST:stdin');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 'x', compare: 'fuzzy' })), 'INVALID_REQUEST:compare');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 'x', nonsense: 1 })), 'INVALID_REQUEST:nonsense');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 5 })), 'INVALID_REQUEST:code');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 'x', args: ['a\0b'] })), 'INVALID_REQUEST:args.0');
  t.is(code(() => validateFnInvoke('print(1)')), 'INVALID_REQUEST:invoke');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 'x', files: { a: '1', 'a/b': '2' } })), 'INVALID_REQUEST:files');
  t.is(code(() => validateFnInvoke({ language: 'python', code: 'x', files: { 'data/in.txt': 'ok', 'data/b/c': 'ok' } })), undefined);
});

test('output is compared by lines (trailing blanks ignored), by tokens, or exactly', (t) => {
  t.true(sameOutput(b('1 2\r\n3  \n\n\n'), b('1 2\n3'), 'lines'));
  t.false(sameOutput(b('1  2\n'), b('1 2\n'), 'lines'));
  t.false(sameOutput(b('1\n2\n'), b('1\n'), 'lines'));
  t.true(sameOutput(b('1  2\n\t3'), b('1 2 3\n'), 'tokens'));
  t.false(sameOutput(b('1 2 3 4'), b('1 2 3'), 'tokens'));
  t.true(sameOutput(b('x\n'), b('x\n'), 'exact'));
  t.false(sameOutput(b('x\n'), b('x'), 'exact'));
  t.true(sameOutput(b(''), b('\n\n'), 'lines'));
});

test('a run gets one verdict: limits first, then how it ended, then what it printed', (t) => {
  const v = (o: Partial<RunOutcome>, expected?: string) => judgeRun(outcome(o), LIMITS, expected === undefined ? undefined : b(expected), 'lines', 128).verdict;
  t.is(v({ stdout: b('42\n') }, '42'), 'OK');
  t.is(v({ stdout: b('41\n') }, '42'), 'WRONG_ANSWER');
  t.is(v({ stdout: b('41\n') }), 'OK');
  t.is(v({ exitCode: 1, stdout: b('42\n') }, '42'), 'RUNTIME_ERROR');
  t.is(v({ exitCode: 139, signal: 11 }), 'RUNTIME_ERROR');
  t.is(v({ execErrno: 2, exitCode: 127 }), 'RUNTIME_ERROR');
  t.is(v({ limit: 'time', exitCode: 137, signal: 9 }), 'TIME_LIMIT');
  t.is(v({ limit: 'memory', exitCode: 137, signal: 9 }), 'MEMORY_LIMIT');
  t.is(v({ limit: 'output', exitCode: 137, signal: 9 }, '42'), 'OUTPUT_LIMIT');
  t.is(v({ limit: 'pids', exitCode: 137, signal: 9 }), 'RUNTIME_ERROR');
  const seg = judgeRun(outcome({ exitCode: 139, signal: 11 }), LIMITS, undefined, 'lines', 128);
  t.is(seg.signal, 'SIGSEGV');
  t.regex(seg.reason ?? '', /SIGSEGV/);
  t.regex(judgeRun(outcome({ execErrno: 2, exitCode: 127 }), LIMITS, undefined, 'lines', 128).reason ?? '', /ENOENT/);
  t.regex(judgeRun(outcome({ limit: 'time', cpuMs: 1001 }), LIMITS, undefined, 'lines', 128).reason ?? '', /CPU time/);
  t.regex(judgeRun(outcome({ limit: 'time', cpuMs: 1, wallMs: 2300 }), LIMITS, undefined, 'lines', 128).reason ?? '', /wall-clock/);
  t.regex(judgeRun(outcome({ limit: 'pids' }), LIMITS, undefined, 'lines', 128).reason ?? '', /128 processes/);
});

test('tests add up: the first failure decides, time and memory are the largest, wall the sum', (t) => {
  const runs = [
    judgeRun(outcome({ stdout: b('1\n'), cpuMs: 5, wallMs: 6 }), LIMITS, b('1'), 'lines', 128),
    judgeRun(outcome({ stdout: b('3\n'), cpuMs: 9, wallMs: 10, maxRssBytes: 9 << 20 }), LIMITS, b('2'), 'lines', 128),
    judgeRun(outcome({ limit: 'time', cpuMs: 1001, wallMs: 1002 }), LIMITS, b('3'), 'lines', 128),
  ];
  const all = aggregate(runs);
  t.is(all.verdict, 'WRONG_ANSWER');
  t.is(Buffer.from(all.stdout).toString(), '3\n');
  t.is(all.passed, 1);
  t.is(all.timeMs, 1001);
  t.is(all.wallMs, 1018);
  t.is(all.memoryBytes, 9 << 20);
  t.is(aggregate([runs[0]!, runs[0]!]).verdict, 'OK');
  const p = previewOf({ ...runs[0]!, stdout: b('x'.repeat(10)) }, 4);
  t.is(Buffer.from(p.stdout).toString(), 'xxxx');
  t.true(p.outputCut);
  t.is(previewOf(runs[0]!, 4).outputCut, undefined);
});

test('the runner wire: a job encodes, an answer decodes, frames split across chunks', (t) => {
  const job = encodeJob({ argv: ['python3', '/box/main.py'], env: ['A=1'], cwd: '/work', stdin: b('in'), outputBytes: 99, uid: 1000, gid: 1000, cpuSec: 3, nofile: 1024, stackMiB: 64 });
  t.is(job.toString('latin1', 0, 4), 'FNJB');
  t.is(job.readUInt32LE(4), job.length - 8);
  t.is(job.readUInt32LE(8), 2); // stdin length first
  t.true(job.toString().endsWith('/work\0python3\0/box/main.py\0A=1\0in'));

  const out = b('hello');
  const err = b('e');
  const a = Buffer.alloc(60 + out.length + err.length);
  a.write('FNRS');
  a.writeUInt32LE(a.length - 8, 4);
  a.writeInt32LE(9, 8); // killed by SIGKILL
  a.writeUInt32LE(1, 12); // truncated
  a.writeUInt32LE(1500, 20);
  a.writeUInt32LE(500, 28);
  a.writeUInt32LE(2048, 36);
  a.writeUInt32LE(7, 44);
  a.writeUInt32LE(1, 48); // wall: 7 + 2^32 µs
  a.writeUInt32LE(out.length, 52);
  a.writeUInt32LE(err.length, 56);
  out.copy(a, 60);
  err.copy(a, 65);
  const frames: Buffer[] = [];
  const r = new FrameReader((f) => frames.push(f));
  r.push(Buffer.concat([b('FNOK\0\0\0\0'), a.subarray(0, 20)]));
  r.push(a.subarray(20));
  t.is(frames.length, 2);
  const d = decodeAnswer(frames[1]!);
  t.deepEqual({ ...d, stdout: d.stdout.toString(), stderr: d.stderr.toString() }, { status: 9, truncated: true, cpuUs: 2000, maxRssKiB: 2048, wallUs: 7 + 2 ** 32, stdout: 'hello', stderr: 'e' });
  t.deepEqual(waitStatus(9), { exitCode: 137, signal: 9 });
  t.deepEqual(waitStatus(3 << 8), { exitCode: 3 });
});

test('pool sizes and CLI exit statuses', (t) => {
  t.deepEqual(parsePool('python=2, c=1,busybox=0'), { python: 2, c: 1, busybox: 0 });
  t.deepEqual(parsePool(''), {});
  t.throws(() => parsePool('python'), { message: /runtime=count/ });
  t.throws(() => parsePool('python=-1'));
  t.is(exitStatusOf({ verdict: 'OK', exitCode: 0 }), 0);
  t.is(exitStatusOf({ verdict: 'RUNTIME_ERROR', exitCode: 3 }), 3);
  t.is(exitStatusOf({ verdict: 'TIME_LIMIT', exitCode: 137 }), 124);
  t.is(exitStatusOf({ verdict: 'COMPILE_ERROR', exitCode: 1 }), 1);
  t.is(exitStatusOf({ verdict: 'MEMORY_LIMIT', exitCode: 137 }), 1);
});
