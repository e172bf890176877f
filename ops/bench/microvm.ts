/**
 * The microVM backend against the container backend, on one local node, through the SDK:
 *
 *   npm run bench:microvm [-- --starts 20] [-- --execs 50] [-- --json]
 *
 * - cold boot: the first microVM create on a fresh node (its template boots) to its first exec;
 * - template start: create → first exec of a copy-on-write clone (p50/p95 over --starts);
 * - exec round trip of `true` (p50/p95), beside a container's on the same node (the floor);
 * - hibernate of a 512 MiB VM that holds a warm process and 64 MiB of written memory: time, bytes
 *   on disk (only what differs from its template); restore to its first exec;
 * - idle host memory (PSS of the QEMU process) and CPU per running VM: a clone, the same clone
 *   hibernated and restored, and a private one (a copy started from a whole-state snapshot: every
 *   page of its RAM is its own);
 * - fork(8) of a running 256 MiB VM through the SDK: the call until all 8 copies run, then each
 *   answers an exec.
 *
 * `--memory N` runs the memory experiment instead: N VMs of 512 MiB on one node run the same
 * workload at once (a 192 MiB buffer filled, then freed), twice — as copy-on-write clones of their
 * template, then each with RAM of its own (copies from whole-state snapshots) — on a node with
 * virtio-balloon free-page reporting and on one without. For each: the peak of the VMs' host
 * memory (the sum of their QEMU processes' PSS, sampled every 200 ms) and what they hold once the
 * guests have freed it (after 10 s). `sharedPeakSavingPct`: how much lower the clones' peak is
 * than the private VMs', with reporting.
 *
 * `--density MAX` measures instead how many idle microVMs (256 MiB, a quarter CPU each) one node
 * holds: it creates them one after another until one of these stops it — a create fails, the
 * host has less than 2 GiB available, a probe VM's exec p50 over its last 5 passes 10× its quiet
 * p50, or MAX in all — (liveRunning), then in waves hibernates those running and creates again
 * until the same, while a wave still adds some (liveWithHibernated: hibernated + running). Tens of
 * minutes of the machine to itself.
 *
 * Progress goes to stderr; stdout carries the table and, with --json, one JSON object as its last
 * line.
 */
import { readFile } from 'node:fs/promises';
import { performance } from 'node:perf_hooks';
import type { Paddock, Sandbox } from '../../sdk/index.ts';
import { cleanUpOnSignals, finishRun, numberArg, progress, runMain, sandboxMaker, startBenchNode, UsageError } from './harness.ts';
import { round3, summarize } from './stats.ts';
import { cpuTicks, hibernatedBytes, pss, qemuOf } from './vm-readings.ts';

const USAGE = 'usage: microvm.ts [--starts N] [--execs N] [--memory N] [--density MAX] [--json]';

function parse(argv: string[]) {
  let starts = 20;
  let execs = 50;
  let json = false;
  let memory = 0;
  let density = 0;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--json') json = true;
    else if (a === '--density') ({ value: density, next: i } = numberArg(argv, i, a, USAGE));
    else if (a === '--memory') ({ value: memory, next: i } = numberArg(argv, i, a, USAGE));
    else if (a === '--starts') ({ value: starts, next: i } = numberArg(argv, i, a, USAGE));
    else if (a === '--execs') ({ value: execs, next: i } = numberArg(argv, i, a, USAGE));
    else throw new UsageError(`unknown argument ${a}\n${USAGE}`);
  }
  return { starts, execs, json, memory, density };
}

const ms = (t0: number) => performance.now() - t0;

/** Peak and settled host memory of `vms` while each runs the workload at once (see the header). */
async function underWorkload(home: string, vms: Sandbox[]): Promise<{ peak: number; settled: number }> {
  const pids = (await Promise.all(vms.map((v) => qemuOf(home, v.id)))).filter((p): p is number => p !== undefined);
  if (pids.length !== vms.length) throw new Error(`found ${pids.length} QEMU processes for ${vms.length} VMs`);
  const total = async () => (await Promise.all(pids.map((p) => pss(p)))).reduce((a, b) => a + b, 0);
  let peak = await total();
  let running = true;
  const sampler = (async () => {
    while (running) {
      peak = Math.max(peak, await total());
      await new Promise((r) => setTimeout(r, 200));
    }
  })();
  const runs = await Promise.all(vms.map((v) => v.exec(['dd', 'if=/dev/zero', 'of=/dev/null', 'bs=192M', 'count=1'], { timeoutMs: 300_000 })));
  running = false;
  await sampler;
  for (const r of runs) if (r.exitCode !== 0) throw new Error(`the workload failed: ${r.stderr}`);
  // Free page reporting waits 2 s after pages are freed, then reports them in 2 MiB blocks.
  await new Promise((r) => setTimeout(r, 10_000));
  return { peak, settled: await total() };
}

/**
 * A copy of `vm` whose every page of RAM is its own: started from a named snapshot, which holds the
 * whole state (one that may go to another node), so loading it writes every page. A hibernation no
 * longer does that: it keeps, and restores, only what differs from the template. `vm` is killed.
 */
async function privateCopy(pdk: Paddock, make: ReturnType<typeof sandboxMaker>, vm: Sandbox): Promise<Sandbox> {
  const snap = await vm.snapshot();
  await vm.kill();
  const copy = await make({ fromSnapshot: snap.id });
  await pdk.snapshots.delete(snap.id);
  return copy;
}

async function memoryExperiment(n: number, json: boolean): Promise<void> {
  let nodes: { id: string; logFile?: string }[] = [];
  let ok = false;
  try {
    const rows: Array<{ reporting: boolean; ram: 'shared' | 'private'; peak: number; settled: number }> = [];
    for (const reporting of [true, false]) {
      const { cluster, pdk, home } = await startBenchNode({ prefix: reporting ? 'bmr' : 'bmn', env: { PADDOCK_BACKENDS: 'container,microvm', PADDOCK_MICROVM_BALLOON: reporting ? '1' : '0' } });
      nodes = [...nodes, ...cluster.nodes];
      const make = sandboxMaker(pdk);
      progress(`${n} VMs of 512 MiB, free-page reporting ${reporting ? 'on' : 'off'}: clones of their template`);
      const vms: Sandbox[] = [];
      for (let i = 0; i < n; i++) vms.push(await make({ backend: 'microvm', memoryMiB: 512 }));
      await new Promise((r) => setTimeout(r, 3000));
      rows.push({ reporting, ram: 'shared', ...(await underWorkload(home, vms)) });
      progress('copies of the same VMs, each with RAM of its own (started from a whole-state snapshot)');
      const own = await Promise.all(vms.map((v) => privateCopy(pdk, make, v)));
      await new Promise((r) => setTimeout(r, 3000));
      rows.push({ reporting, ram: 'private', ...(await underWorkload(home, own)) });
      await Promise.all(own.map((v) => v.kill()));
    }
    const mib = (b: number) => `${(b / 1048576).toFixed(0)} MiB`;
    process.stdout.write(`memory experiment: ${n} VMs of 512 MiB, each filling and freeing a 192 MiB buffer at once\n`);
    process.stdout.write(`${'RAM'.padEnd(10)} ${'reporting'.padEnd(10)} ${'peak'.padEnd(10)} ${'after'.padEnd(10)}\n`);
    for (const r of rows) process.stdout.write(`${r.ram.padEnd(10)} ${(r.reporting ? 'on' : 'off').padEnd(10)} ${mib(r.peak).padEnd(10)} ${mib(r.settled).padEnd(10)}\n`);
    const find = (ram: string, reporting: boolean) => rows.find((r) => r.ram === ram && r.reporting === reporting) as (typeof rows)[number];
    const sharedPeakSavingPct = round3((1 - find('shared', true).peak / find('private', true).peak) * 100);
    const reportingSavingPct = round3((1 - find('shared', true).settled / find('shared', false).settled) * 100);
    process.stdout.write(`clones' peak ${sharedPeakSavingPct}% below private VMs'; after the workload, reporting leaves clones ${reportingSavingPct}% below no reporting\n`);
    if (json) process.stdout.write(`${JSON.stringify({ vms: n, rows, sharedPeakSavingPct, reportingSavingPct })}\n`);
    ok = true;
  } finally {
    await finishRun(ok, nodes);
  }
}

/** How many idle VMs the node holds, running, then counting hibernated ones (see the header). */
async function density(max: number, json: boolean): Promise<void> {
  let nodes: { id: string; logFile?: string }[] | undefined;
  let ok = false;
  try {
    // Admission must not be what stops it: room for `max` of them in memory and CPU.
    const { cluster, pdk } = await startBenchNode({ prefix: 'bmd', env: { PADDOCK_BACKENDS: 'container,microvm', PADDOCK_MEMORY_OVERCOMMIT: '100', PADDOCK_CPU_OVERCOMMIT: '1000' } });
    nodes = cluster.nodes;
    const make = sandboxMaker(pdk);
    const spec = { backend: 'microvm' as const, memoryMiB: 256, cpu: 0.25 };
    const probe = await make(spec);
    const pass = async () => {
      const t = performance.now();
      await probe.exec(['true']);
      return ms(t);
    };
    // Its first execs translate the guest's code afresh (TCG): not what quiet means.
    for (let i = 0; i < 10; i++) await pass();
    // Spaced as the passes between creates are: back to back, a quarter CPU's quota (25 ms of each
    // 100 ms) runs out and the exec waits for the next period (p50 77–93 ms against a minimum of
    // ~20 ms, measured), which is the quota's throughput, not the latency the stop compares.
    const quiet: number[] = [];
    for (let i = 0; i < 20; i++) {
      await new Promise((r) => setTimeout(r, 300));
      quiet.push(await pass());
    }
    const quietP50 = summarize(quiet).p50;
    /** Creates until a stop; returns the sandboxes made and why it stopped. */
    const fill = async (limit: number): Promise<{ made: Sandbox[]; why: string }> => {
      const made: Sandbox[] = [];
      const recent: number[] = [];
      for (;;) {
        if (made.length >= limit) return { made, why: `reached ${limit}` };
        const availMiB = Number(/^MemAvailable:\s+(\d+)/m.exec(await readFile('/proc/meminfo', 'utf8'))?.[1]) / 1024;
        if (availMiB < 2048) return { made, why: `host memory available ${availMiB.toFixed(0)} MiB` };
        try {
          made.push(await make(spec, { timeoutMs: 120_000 }));
        } catch (err) {
          return { made, why: `create failed: ${(err as Error).message}` };
        }
        recent.push(await pass());
        if (recent.length > 5) recent.shift();
        const p50 = summarize(recent).p50;
        if (recent.length === 5 && p50 > 10 * quietP50) return { made, why: `probe exec p50 ${p50.toFixed(0)} ms, 10× its quiet ${quietP50.toFixed(1)} ms` };
        if (made.length % 10 === 0) progress(`${made.length} running; probe exec p50 ${p50.toFixed(1)} ms`);
      }
    };
    progress(`idle microVMs of 256 MiB until a stop (at most ${max})`);
    let wave = await fill(max - 1);
    const liveRunning = wave.made.length + 1;
    const firstWhy = wave.why;
    let hibernated = 0;
    // Waves: the running ones go to sleep, and new ones are made until a stop, while a wave adds some.
    for (;;) {
      if (hibernated + wave.made.length + 1 >= max) break;
      progress(`${hibernated + wave.made.length + 1} held (${wave.made.length + 1} running: ${wave.why}); hibernating the running ones`);
      let failed = '';
      for (const sb of wave.made) {
        try {
          await sb.hibernate();
          hibernated++;
        } catch (err) {
          failed = `hibernate failed: ${(err as Error).message}`;
          break;
        }
      }
      const room = max - 1 - hibernated;
      if (failed || room <= 0) {
        wave = { made: [], why: failed || `reached ${max}` };
        break;
      }
      wave = await fill(room);
      if (wave.made.length < 10) break;
    }
    const liveWithHibernated = hibernated + wave.made.length + 1;
    const rows: [string, string, string][] = [
      ['idle microVMs running', `${liveRunning}`, `stopped by: ${firstWhy} (target ≥ 300)`],
      ['counting hibernated ones', `${liveWithHibernated} (${hibernated} hibernated)`, `stopped by: ${wave.why} (target ≥ 800)`],
    ];
    for (const [k, v, n] of rows) process.stdout.write(`${k.padEnd(30)} ${v.padEnd(24)} ${n}\n`);
    if (json) process.stdout.write(`${JSON.stringify({ liveRunning, liveWithHibernated, hibernated, stoppedBy: [firstWhy, wave.why], probeQuietP50Ms: round3(quietP50) })}\n`);
    ok = true;
  } finally {
    await finishRun(ok, nodes);
  }
}

async function main(): Promise<void> {
  const o = parse(process.argv.slice(2));
  cleanUpOnSignals();
  if (o.memory > 0) return memoryExperiment(o.memory, o.json);
  if (o.density > 0) return density(o.density, o.json);
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
    // Hibernated and restored: only what differs from the template was written and read back.
    await first.hibernate();
    await first.restore();
    await first.exec(['true']);
    await new Promise((r) => setTimeout(r, 2000));
    const restoredPid = await qemuOf(home, first.id);
    const idlePssRestoredBytes = restoredPid ? await pss(restoredPid) : Number.NaN;
    // Started from a whole state, every page of its RAM is its own: what a private boot holds.
    const priv = await privateCopy(pdk, make, await make({ backend: 'microvm', memoryMiB: 256 }));
    await priv.exec(['true']);
    await new Promise((r) => setTimeout(r, 2000));
    const privPid = await qemuOf(home, priv.id);
    const idlePssPrivateBootBytes = privPid ? await pss(privPid) : Number.NaN;
    await priv.kill();

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
    // A restore comes when a job is back, not the moment its sandboxes slept: by then the node has
    // a VMM of the template started and waiting (a blank one, started by the hibernation).
    await new Promise((r) => setTimeout(r, 2000));
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
      ['idle PSS of a clone hibernated and restored', `${(idlePssRestoredBytes / 1048576).toFixed(1)} MiB`, 'still sharing its template'],
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
          idlePssRestoredBytes,
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
