/**
 * The microVM backend against the container backend, on one local node, through the SDK:
 *
 *   npm run bench:microvm [-- --starts 20] [-- --execs 50] [-- --json]
 *
 * - cold boot: the first microVM create on a fresh node (its template boots) to its first exec;
 * - template start: create → first exec of a copy-on-write clone (p50/p95 over --starts);
 * - exec round trip of `true` (p50/p95), beside a container's on the same node (the floor);
 * - hibernate of a 512 MiB VM that holds a warm process and 64 MiB of written memory: time, bytes
 *   on disk; restore to its first exec;
 * - idle host memory (PSS of the QEMU process) and CPU per running VM, clone against a private boot
 *   (the same VM after a hibernate/restore cycle: every page of its RAM is its own);
 * - fork(8) of a running 256 MiB VM through the SDK: the call until all 8 copies run, then each
 *   answers an exec.
 *
 * Progress goes to stderr; stdout carries the table and, with --json, one JSON object as its last
 * line. Not measured here (null in the JSON): the most idle VMs a node holds and the memory
 * experiment, which need the machine to themselves for minutes.
 */
import { performance } from 'node:perf_hooks';
import type { Sandbox } from '../../sdk/index.ts';
import { cleanUpOnSignals, finishRun, numberArg, progress, runMain, sandboxMaker, startBenchNode, UsageError } from './harness.ts';
import { round3, summarize } from './stats.ts';
import { cpuTicks, hibernatedBytes, pss, qemuOf } from './vm-readings.ts';

const USAGE = 'usage: microvm.ts [--starts N] [--execs N] [--json]';

function parse(argv: string[]) {
  let starts = 20;
  let execs = 50;
  let json = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--json') json = true;
    else if (a === '--starts') ({ value: starts, next: i } = numberArg(argv, i, a, USAGE));
    else if (a === '--execs') ({ value: execs, next: i } = numberArg(argv, i, a, USAGE));
    else throw new UsageError(`unknown argument ${a}\n${USAGE}`);
  }
  return { starts, execs, json };
}

const ms = (t0: number) => performance.now() - t0;

async function main(): Promise<void> {
  const o = parse(process.argv.slice(2));
  cleanUpOnSignals();
  let nodes: { id: string; logFile?: string }[] | undefined;
  let ok = false;
  try {
    const { cluster, pdk, home } = await startBenchNode({ prefix: 'bmv', env: { PADDOCK_BACKENDS: 'container,microvm' } });
    nodes = cluster.nodes;
    const make = sandboxMaker(pdk);

    progress('cold boot (the template boots)');
    let t0 = performance.now();
    const first = await make({ backend: 'microvm', memoryMiB: 256 });
    await first.exec(['true']);
    const coldBootMs = ms(t0);

    progress(`template starts ×${o.starts}`);
    const starts: number[] = [];
    for (let i = 0; i < o.starts; i++) {
      // The spare VMM for the next create starts after each take: let it get ready, as between creates in use.
      await new Promise((r) => setTimeout(r, 400));
      t0 = performance.now();
      const sb = await pdk.sandboxes.create({ backend: 'microvm', memoryMiB: 256 });
      await sb.exec(['true']);
      starts.push(ms(t0));
      await sb.kill();
    }

    progress(`exec round trips ×${o.execs}, microvm and container`);
    const ct = await make({ backend: 'container', memoryMiB: 256 });
    const execOf = async (sb: Sandbox) => {
      const s: number[] = [];
      for (let i = 0; i < 5; i++) await sb.exec(['true']);
      for (let i = 0; i < o.execs; i++) {
        const t = performance.now();
        await sb.exec(['true']);
        s.push(ms(t));
      }
      return summarize(s);
    };
    const vmExec = await execOf(first);
    const ctExec = await execOf(ct);

    progress('idle PSS and CPU per running VM: template clone, then the same VM with RAM of its own');
    const clonePid = await qemuOf(home, first.id);
    await new Promise((r) => setTimeout(r, 3000));
    const c0 = clonePid ? await cpuTicks(clonePid) : Number.NaN;
    await new Promise((r) => setTimeout(r, 5000));
    const idleCpuPct = clonePid ? ((await cpuTicks(clonePid)) - c0) / 5 : Number.NaN;
    const idlePssBytes = clonePid ? await pss(clonePid) : Number.NaN;
    // Restored from a full-state file, every page of its RAM is its own: what a private boot holds.
    await first.hibernate();
    await first.restore();
    await first.exec(['true']);
    await new Promise((r) => setTimeout(r, 2000));
    const privPid = await qemuOf(home, first.id);
    const idlePssPrivateBootBytes = privPid ? await pss(privPid) : Number.NaN;

    progress('fork(8) of a running 256 MiB VM');
    t0 = performance.now();
    const kids = await first.fork(8);
    const fork8Ms = ms(t0);
    make.keep(...kids);
    for (const k of kids) if ((await k.exec(['true'])).exitCode !== 0) throw new Error(`fork copy ${k.id} does not run commands`);
    await Promise.all(kids.map((k) => k.kill()));

    progress('hibernate / restore of a 512 MiB VM with a warm process and 64 MiB written');
    const big = await make({ backend: 'microvm', memoryMiB: 512, diskMiB: 128 });
    const warm = await big.exec(['sh', '-c', 'head -c 67108864 /dev/zero | tr "\\0" x > /tmp/blob; sleep 100000 >/dev/null 2>&1 & echo $! > /tmp/warm'], { timeoutMs: 120_000 });
    if (warm.exitCode !== 0) throw new Error(`the warm process did not start: ${warm.stderr}`);
    t0 = performance.now();
    await big.hibernate();
    const hibernateMs = ms(t0);
    const hibernateBytes = await hibernatedBytes(home, 'microvm');
    t0 = performance.now();
    await big.restore();
    await big.exec(['true']);
    const restoreMs = ms(t0);
    const alive = (await big.exec(['sh', '-c', 'kill -0 $(cat /tmp/warm) && echo yes'])).stdout.trim() === 'yes';

    const st = summarize(starts);
    const rows: [string, string, string][] = [
      ['cold boot → first exec', `${round3(coldBootMs)} ms`, ''],
      ['template start → first exec p50 / p95', `${round3(st.p50)} / ${round3(st.p95)} ms`, 'target p50 ≤ 150 ms'],
      ['exec `true` p50 / p95: microvm', `${round3(vmExec.p50)} / ${round3(vmExec.p95)} ms`, `${round3(vmExec.p50 / ctExec.p50)}× container (target ≤ 3×)`],
      ['exec `true` p50 / p95: container (floor)', `${round3(ctExec.p50)} / ${round3(ctExec.p95)} ms`, ''],
      ['hibernate 512 MiB (64 MiB written)', `${round3(hibernateMs)} ms, ${(hibernateBytes / 1048576).toFixed(1)} MiB`, 'target ≤ 1000 ms'],
      ['restore → first exec', `${round3(restoreMs)} ms${alive ? '' : ' (warm process LOST)'}`, 'target ≤ 200 ms'],
      ['idle PSS per VM: clone / private', `${(idlePssBytes / 1048576).toFixed(1)} / ${(idlePssPrivateBootBytes / 1048576).toFixed(1)} MiB`, 'target clone ≤ 30 MiB'],
      ['idle CPU per VM (clone)', `${round3(idleCpuPct)}% of a core`, ''],
      ['fork(8) → 8 running copies', `${round3(fork8Ms)} ms`, 'one snapshot, 8 restores'],
    ];
    for (const [k, v, n] of rows) process.stdout.write(`${k.padEnd(42)} ${v.padEnd(26)} ${n}\n`);
    process.stdout.write('(one run on a shared 2-core host: compare the ratios, not the absolute times)\n');
    if (o.json) {
      process.stdout.write(
        `${JSON.stringify({
          coldBootMs: round3(coldBootMs),
          templateStartP50Ms: round3(st.p50),
          templateStartP95Ms: round3(st.p95),
          execP50Ms: round3(vmExec.p50),
          containerExecP50Ms: round3(ctExec.p50),
          hibernateMs: round3(hibernateMs),
          hibernateBytes,
          restoreMs: round3(restoreMs),
          fork8Ms: round3(fork8Ms),
          idlePssBytes,
          idlePssPrivateBootBytes,
          idleCpuPct: round3(idleCpuPct),
          liveRunning: null,
          liveWithHibernated: null,
          sharedPeakSavingPct: null,
        })}\n`,
      );
    }
    ok = true;
  } finally {
    await finishRun(ok, nodes);
  }
}

runMain(main);
