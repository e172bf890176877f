/**
 * What one invocation leaves cannot reach the next, on a node whose python pool is one member (so
 * every call here lands in the same warm sandbox), and what a full node does: BUSY with a hint.
 */
import { readdir, readFile } from 'node:fs/promises';
import anyTest, { type TestFn } from 'ava';
import { BusyError, type FnResult, type NodeInfo } from '../sdk/index.ts';
import { type ClusterContext, startTestCluster, stopTestCluster } from './helpers/cluster.ts';
import { ensureFnImages } from './helpers/fncall.ts';

const test = anyTest as TestFn<ClusterContext>;

test.before(async (t) => {
  t.timeout(15 * 60_000);
  await ensureFnImages();
  Object.assign(t.context, await startTestCluster({ env: { PADDOCK_FN_POOL: 'python=1', PADDOCK_FN_MAX_MEMBERS: '1', PADDOCK_FN_QUEUE: '2' } }));
});

test.after.always(async (t) => {
  await stopTestCluster(t.context.cluster ? t.context : undefined);
});

const py = (code: string) => ({ language: 'python' as const, code });

/** The member's cgroup directories (one per pool member) under the node's. */
async function memberCgroups(node: string): Promise<string[]> {
  return (await readdir(`/sys/fs/cgroup/pids/paddock/${node}`).catch(() => [] as string[])).filter((d) => d.startsWith('fn-'));
}

test.serial('a file written by one invocation is absent in the next', async (t) => {
  const { pdk } = t.context;
  const w = await pdk.fn.invoke({
    language: 'bash',
    code: 'for d in /work /tmp /dev/shm; do echo secret > $d/left-behind; mkdir -p $d/dir/deeper; echo x > $d/dir/deeper/f; done; chmod 000 /work/dir; chmod 700 /work; ls /work /tmp /dev/shm | wc -l',
    files: { 'given.txt': 'mine' },
  });
  t.is(w.verdict, 'OK', w.stderr);
  const r = await pdk.fn.invoke({ language: 'bash', code: 'ls -A /work /tmp /dev/shm /box; stat -c %a /work; cat /box/main.sh | head -c 4' });
  t.is(r.verdict, 'OK', r.stderr);
  t.is(r.stdout, '/box:\nmain.sh\n\n/dev/shm:\n\n/tmp:\n\n/work:\n755\nls -');
});

test.serial('a background process left by one invocation is gone before the next', async (t) => {
  const { pdk } = t.context;
  const leave = await pdk.fn.invoke({
    language: 'bash',
    code: '(exec -a fn-leak-1 sleep 1000) & setsid bash -c "exec -a fn-leak-2 sleep 1000" < /dev/null > /dev/null 2>&1 & disown -a; python3 -c "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(1000)" & echo left',
  });
  t.is(leave.verdict, 'OK', leave.stderr);
  t.is(leave.stdout, 'left\n');
  const look = await pdk.fn.invoke(
    py(`
import os
mine = {os.getpid()}
rows = []
for p in os.listdir('/proc'):
    if not p.isdigit() or int(p) in mine:
        continue
    try:
        rows.append(open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode().strip())
    except OSError:
        pass
print(sorted(rows))
`),
  );
  t.is(look.verdict, 'OK', look.stderr);
  // Only the sandbox's init and the runner remain beside the program itself (both handed in as fds).
  t.notRegex(look.stdout, /fn-leak|sleep 1000|time\.sleep/);
  t.is(look.stdout, "['/proc/self/fd/3', '/proc/self/fd/3']\n");
});

test.serial('stdin, environment and limits do not carry over either', async (t) => {
  const { pdk } = t.context;
  await pdk.fn.invoke({ language: 'python', code: 'import os\nos.environ["LEAK"] = "1"\nprint(input())', stdin: 'first\n', env: { GIVEN: 'yes' } });
  const r = await pdk.fn.invoke(py('import os, sys\nprint(os.environ.get("LEAK"), os.environ.get("GIVEN"), repr(sys.stdin.read()))'));
  t.is(r.stdout, "None None ''\n");
  // A memory limit set for one call is not the next call's.
  const small = await pdk.fn.invoke({ ...py('x = bytearray(96 * 1024 * 1024)\nprint(len(x))'), limits: { memoryMiB: 32 } });
  t.is(small.verdict, 'MEMORY_LIMIT');
  const big = await pdk.fn.invoke({ ...py('x = bytearray(96 * 1024 * 1024)\nprint(len(x))'), limits: { memoryMiB: 256 } });
  t.is(big.verdict, 'OK', big.reason);
});

test.serial('past its queue the node answers BUSY with a retry hint; invokeMany waits and retries', async (t) => {
  const { pdk } = t.context;
  const slow = py('import time\ntime.sleep(0.4)\nprint("done")');
  const settled = await Promise.allSettled(Array.from({ length: 6 }, () => pdk.fn.invoke(slow)));
  const busy = settled.filter((s): s is PromiseRejectedResult => s.status === 'rejected');
  const ok = settled.filter((s): s is PromiseFulfilledResult<FnResult> => s.status === 'fulfilled');
  // One member running, two waiting: the other three are refused at once, never left hanging.
  t.is(ok.length, 3);
  t.is(busy.length, 3);
  for (const b of busy) {
    t.true(b.reason instanceof BusyError, String(b.reason));
    const e = b.reason as BusyError;
    t.is(e.code, 'BUSY');
    t.true(e.retryable);
    t.true(e.retryAfterMs >= 20 && e.retryAfterMs <= 5000, `retryAfterMs ${e.retryAfterMs}`);
  }
  t.true(ok.every((s) => s.value.stdout === 'done\n'));
  t.true(ok.some((s) => s.value.queuedMs > 300), 'the queued calls waited for the member');
  const many = await pdk.fn.invokeMany(Array.from({ length: 6 }, () => slow), { concurrency: 6 });
  t.true(
    many.every((r) => !(r instanceof Error) && r.stdout === 'done\n'),
    many.map((r) => (r instanceof Error ? r.message : r.verdict)).join(', '),
  );
});

test.serial('a pool member that dies is replaced in the background', async (t) => {
  const { pdk, cluster } = t.context;
  const node = cluster.nodes[0]?.id as string;
  await pdk.fn.invoke(py('print(1)'));
  const [before] = await memberCgroups(node);
  t.truthy(before);
  // The runner is the member's process executed from the node's descriptor (/proc/self/fd/3).
  const procs = (await readFile(`/sys/fs/cgroup/pids/paddock/${node}/${before}/cgroup.procs`, 'utf8')).trim().split('\n');
  let runner: number | undefined;
  for (const p of procs) if ((await readFile(`/proc/${p}/cmdline`, 'utf8').catch(() => '')).startsWith('/proc/self/fd/3')) runner = Number(p);
  t.truthy(runner, 'found the runner');
  process.kill(runner as number, 'SIGKILL');
  let after: string[] = [];
  for (const until = Date.now() + 30_000; Date.now() < until; await new Promise((r) => setTimeout(r, 100))) {
    after = await memberCgroups(node);
    const pools = ((await pdk.nodes.info(node)) as NodeInfo & { fnPools?: Record<string, { members: number; idle: number }> }).fnPools;
    if (after.length === 1 && after[0] !== before && pools?.python?.idle === 1) break;
  }
  t.is(after.length, 1);
  t.not(after[0], before);
  t.is((await pdk.fn.invoke(py('print("new member")'))).stdout, 'new member\n');
});
