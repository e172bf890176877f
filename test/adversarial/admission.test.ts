/**
 * Admission against what the host has: pids (one kernel table for every sandbox) and writable
 * layers (RAM). The node here is given small fixed capacities so that a few sandboxes fill them.
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { ExecutionContext } from 'ava';
import { PaddockError } from '../../sdk/index.ts';
import { type AdvContext, advTest, only, underAttack } from './harness.ts';

const BURST = fileURLToPath(new URL('./burst.ts', import.meta.url));
const STREAMS = fileURLToPath(new URL('./streams.ts', import.meta.url));

// The neighbour (default spec: 1,024 pids, a 128 MiB layer) takes its share of both first.
const test = advTest({ env: { PADDOCK_NODE_PIDS: '8192', PADDOCK_NODE_DISK_MIB: '2048' } });

/**
 * An attacking trainer script (burst.ts, streams.ts) in a process of its own at nice 19: on two
 * cores its own client work would otherwise be counted against the node. Resolves once it says
 * `ready`; `go()` starts it and resolves with its exit code and the last line it printed.
 */
async function trainer(t: ExecutionContext<AdvContext>, script: string, args: string[]): Promise<{ go(): Promise<{ code: number | null; last: string }> }> {
  const client = spawn('nice', ['-n', '19', process.execPath, '--import', 'tsx', script, ...args], { stdio: ['pipe', 'pipe', 'inherit'] });
  t.teardown(() => {
    if (client.exitCode === null) client.kill('SIGKILL');
  });
  let text = '';
  const exited = new Promise<number | null>((resolve) => client.once('exit', resolve));
  const ready = new Promise<void>((resolve) =>
    client.stdout.on('data', (d: Buffer) => {
      text += d.toString();
      if (text.includes('ready\n')) resolve();
    }),
  );
  await Promise.race([ready, exited]);
  return {
    async go() {
      client.stdin.write('go\n');
      const code = await exited;
      return { code, last: text.trim().split('\n').at(-1) as string };
    },
  };
}

const codeOf = (e: unknown) => (e instanceof PaddockError ? e.code : `threw ${String(e)}`);

test.serial('pids past the node can hold are refused at admission, and a spec that can never fit too: NO_CAPACITY', async (t) => {
  const { pdk } = t.context;
  const made: Array<{ kill: () => Promise<unknown> }> = [];
  t.teardown(async () => {
    for (const sb of made) await sb.kill().catch(() => {});
  });
  await underAttack(t, 'pidsLimit past the host pid table', 'NO_CAPACITY', async () => {
    // 7,168 pids left: three sandboxes of 2,048 fit, a fourth does not.
    for (let i = 0; i < 3; i++) made.push(await pdk.sandboxes.create({ cpu: 0.1, pidsLimit: 2048 }));
    const fourth = await pdk.sandboxes.create({ cpu: 0.1, pidsLimit: 2048 }).then((sb) => {
      made.push(sb);
      return 'admitted';
    }, codeOf);
    const huge = await pdk.sandboxes.create({ cpu: 0.1, pidsLimit: 65536 }).then((sb) => {
      made.push(sb);
      return 'admitted';
    }, codeOf);
    return fourth === huge ? fourth : `${fourth} / ${huge}`;
  });
});

test.serial('writable layers past the node can hold are refused at admission: NO_CAPACITY', async (t) => {
  const { pdk } = t.context;
  const made: Array<{ kill: () => Promise<unknown> }> = [];
  t.teardown(async () => {
    for (const sb of made) await sb.kill().catch(() => {});
  });
  await underAttack(t, 'diskMiB past the node', 'NO_CAPACITY', async () => {
    // 1,920 MiB left: one layer of 1,024 fits, a second does not.
    made.push(await pdk.sandboxes.create({ cpu: 0.1, memoryMiB: 2048, diskMiB: 1024 }));
    return pdk.sandboxes.create({ cpu: 0.1, memoryMiB: 2048, diskMiB: 1024 }).then((sb) => {
      made.push(sb);
      return 'admitted';
    }, codeOf);
  });
});

test.serial('a writable layer larger than half the memory is refused: INVALID_SPEC', async (t) => {
  const { pdk } = t.context;
  await underAttack(t, 'diskMiB > memoryMiB / 2', 'INVALID_SPEC', async () =>
    pdk.sandboxes.create({ cpu: 0.1, memoryMiB: 256, diskMiB: 512 }).then(async (sb) => {
      await sb.kill();
      return 'admitted';
    }, codeOf),
  );
});

test.serial('300 concurrent creates past capacity are refused cheaply, the neighbour keeps its p50: NO_CAPACITY', async (t) => {
  const { pdk } = t.context;
  const made: Array<{ kill: () => Promise<unknown> }> = [];
  t.teardown(async () => {
    for (const sb of made) await sb.kill().catch(() => {});
  });
  // The node holds one sandbox of 4,096 pids besides the neighbour's 1,024, made before the burst:
  // what the neighbour is sampled against is the refusals alone, not a real create beside them.
  made.push(await pdk.sandboxes.create({ cpu: 0.1, pidsLimit: 4096 }));
  // Bursts follow each other for two seconds: one is over in about 200 ms, too short for more
  // than a sample or two of the neighbour.
  const client = await trainer(t, BURST, [t.context.cluster.url, '300', '2000', JSON.stringify({ cpu: 0.1, pidsLimit: 4096 })]);
  await underAttack(t, '300 creates past capacity', 'NO_CAPACITY', async () => {
    const { code, last } = await client.go();
    if (code !== 0) return `the burst client exited with ${code}`;
    const { codes } = JSON.parse(last) as { codes: Record<string, number> };
    const kinds = Object.keys(codes);
    return kinds.length === 1 && kinds[0] === 'NO_CAPACITY' ? 'NO_CAPACITY' : `refused ${codes.NO_CAPACITY ?? 0}: ${kinds.join(',')}`;
  });
});

test.serial("1,000 concurrent execs in one sandbox wait their turn, and the neighbour's execs keep theirs: OK", async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  await underAttack(t, '1,000 concurrent execs in one sandbox', 'OK', async () => {
    const verdicts = await Promise.all(Array.from({ length: 1000 }, () => sb.exec(['true'], { timeoutMs: 120_000 }).then((r) => r.verdict, codeOf)));
    return only(verdicts);
  });
});

test.serial('four sandboxes streaming 64 MiB each at once: every byte arrives, the neighbour keeps its p50: OK', async (t) => {
  t.timeout(300_000);
  const MiB = 1024 * 1024;
  const made = await Promise.all(Array.from({ length: 4 }, () => t.context.pdk.sandboxes.create({ cpu: 0.5 })));
  t.teardown(async () => {
    for (const sb of made) await sb.kill().catch(() => {});
  });
  // The trainer's own decoding of 256 MiB is not the node's cost: it runs at nice 19 (trainer).
  const client = await trainer(t, STREAMS, [t.context.cluster.url, String(64 * MiB), ...made.map((sb) => sb.id)]);
  await underAttack(t, '4 × 64 MiB streamed at once', 'OK', async () => {
    const { code, last } = await client.go();
    if (code !== 0) return `the streaming client exited with ${code}`;
    const { streams } = JSON.parse(last) as { streams: Array<{ verdict: string; received: number; lost: number }> };
    // Nothing vanishes: each stream's bytes arrived, or a gap event said how many did not.
    for (const s of streams) t.is(s.received + s.lost, 64 * MiB, JSON.stringify(s));
    return only(streams.map((s) => s.verdict));
  });
});
