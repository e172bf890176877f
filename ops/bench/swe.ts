/**
 * What a software-engineering agent's sandbox does besides exec, on one local node, through the SDK:
 *
 *   npm run bench:swe [-- --copies 16] [-- --files 10000] [-- --keys 50] [-- --json]
 *
 * - a prepared environment: one `python` sandbox installs a ~10 MiB package tree (800 modules
 *   written, then byte-compiled, as pip does), and `sb.snapshot()` saves its files; then `--copies`
 *   sandboxes start from that snapshot until each imports the package, against the floor of as many
 *   fresh sandboxes each doing the install themselves (target: ≥ 5× faster from the snapshot);
 * - a directory of `--files` small files (100 B … 1 KiB) into a sandbox: one tar upload
 *   (`sb.files.upload`) against one `files.write` per file (target: ≥ 10× faster);
 * - a terminal: keystroke → its echo on a PTY (`sb.pty`), p50 over `--keys`, against exec `true`
 *   (target: p50 ≤ 2× exec).
 *
 * Progress goes to stderr; stdout carries the table and, with --json, one JSON object as its last line.
 */
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { ensurePythonImage } from '../../runtime/images/build.ts';
import { ImageStore } from '../../runtime/images/store.ts';
import type { Sandbox } from '../../sdk/index.ts';
import { cleanUpOnSignals, finishRun, numberArg, onCleanup, progress, runMain, sandboxMaker, startBenchNode, UsageError } from './harness.ts';
import { round3, summarize } from './stats.ts';

const USAGE = 'usage: swe.ts [--copies N] [--files N] [--keys N] [--parts snapshot,upload,pty] [--json]';
const PARTS = ['snapshot', 'upload', 'pty'] as const;

function parse(argv: string[]) {
  let copies = 16;
  let files = 10_000;
  let keys = 50;
  let json = false;
  let parts = new Set<string>(PARTS);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--json') json = true;
    else if (a === '--copies') ({ value: copies, next: i } = numberArg(argv, i, a, USAGE));
    else if (a === '--files') ({ value: files, next: i } = numberArg(argv, i, a, USAGE));
    else if (a === '--keys') ({ value: keys, next: i } = numberArg(argv, i, a, USAGE));
    else if (a === '--parts') {
      parts = new Set((argv[++i] ?? '').split(','));
      for (const p of parts) if (!(PARTS as readonly string[]).includes(p)) throw new UsageError(`--parts: ${p} is not one of ${PARTS.join(', ')}\n${USAGE}`);
    }
    else throw new UsageError(`unknown argument ${a}\n${USAGE}`);
  }
  return { copies, files, keys, json, parts };
}

const ms = (t0: number) => performance.now() - t0;

/** An install: 800 modules of ~13 KiB (~10 MiB of source), then byte-compiled into __pycache__. */
const INSTALL = [
  'python3',
  '-c',
  `
import os, compileall
root = '/opt/site/benchpkg'
os.makedirs(root, exist_ok=True)
open(os.path.join(root, '__init__.py'), 'w').write('VERSION = "1.0"\\n')
for m in range(800):
    body = ''.join(f'def f{m}_{i}(x, y={i}):\\n    """{os.urandom(48).hex()}"""\\n    return [x * y + k for k in range({i % 7 + 1})]\\n\\n' for i in range(48))
    open(os.path.join(root, f'mod{m}.py'), 'w').write(body)
compileall.compile_dir(root, quiet=1, workers=1)
print('installed')
`,
];
/** The check that a sandbox has the package: importing it from its bytecode. */
const CHECK = ['python3', '-c', "import sys; sys.path.insert(0, '/opt/site'); import benchpkg.mod799 as m; print(m.f799_3(2))"];

async function makeTree(dir: string, n: number): Promise<void> {
  for (let i = 0; i < n; i += 100) {
    const sub = join(dir, `d${Math.floor(i / 100)}`);
    await mkdir(sub, { recursive: true });
    await Promise.all(Array.from({ length: Math.min(100, n - i) }, (_, k) => writeFile(join(sub, `f${i + k}.txt`), 'x'.repeat(100 + ((i + k) % 925)))));
  }
}

async function main(): Promise<void> {
  const o = parse(process.argv.slice(2));
  cleanUpOnSignals();
  const imagesDir = process.env.PADDOCK_IMAGES_DIR || '/var/lib/paddock/images';
  progress(`the python image (built once into ${imagesDir})`);
  const store = new ImageStore(imagesDir);
  await store.init();
  await ensurePythonImage(store, { progress: process.stderr });
  let nodes: { id: string; logFile?: string }[] | undefined;
  let ok = false;
  try {
    const { cluster, pdk } = await startBenchNode({ prefix: 'bswe', env: {} });
    nodes = cluster.nodes;
    const make = sandboxMaker(pdk);
    const must = async (sb: Sandbox, cmd: string[], what: string) => {
      const r = await sb.exec(cmd, { timeoutMs: 600_000 });
      if (r.exitCode !== 0) throw new Error(`${what} in ${sb.id}: exit ${r.exitCode}: ${r.stderr.slice(0, 500)}`);
      return r;
    };
    const spec = { image: 'python', memoryMiB: 512, diskMiB: 256, cpu: 1 };

    const r3 = (x: number | null) => (x === null ? null : round3(x));
    const msOr = (x: number | null, extra = '') => (x === null ? '—' : `${round3(x)} ms${extra}`);
    const ratio = (a: number | null, b: number | null) => (a === null || b === null ? '—' : `${round3(a / b)}×`);

    let installOneMs: number | null = null;
    let snapshotMs: number | null = null;
    let snapBytes = 0;
    let forkMs: number | null = null;
    let installMs: number | null = null;
    if (o.parts.has('snapshot')) {
      progress('one install, then a snapshot of its files');
      const base = await make(spec);
      let t0 = performance.now();
      await must(base, INSTALL, 'install');
      installOneMs = ms(t0);
      t0 = performance.now();
      const snap = await base.snapshot();
      snapshotMs = ms(t0);
      snapBytes = snap.bytes;
      onCleanup('snapshot', async () => {
        await pdk.snapshots.delete(snap.id).catch(() => {});
      });

      progress(`${o.copies} sandboxes from the snapshot, until each imports the package`);
      t0 = performance.now();
      const fromSnap = await Promise.all(
        Array.from({ length: o.copies }, async () => {
          const sb = await make({ fromSnapshot: snap.id, memoryMiB: 512, cpu: 1 });
          await must(sb, CHECK, 'import from the snapshot');
          return sb;
        }),
      );
      forkMs = ms(t0);
      await Promise.all(fromSnap.map((x) => x.kill()));

      progress(`${o.copies} fresh sandboxes, each installing (the floor)`);
      t0 = performance.now();
      const fresh = await Promise.all(
        Array.from({ length: o.copies }, async () => {
          const sb = await make(spec);
          await must(sb, INSTALL, 'install');
          await must(sb, CHECK, 'import after install');
          return sb;
        }),
      );
      installMs = ms(t0);
      await Promise.all(fresh.map((x) => x.kill()));
    }

    let uploadTarMs: number | null = null;
    let uploadEachMs: number | null = null;
    if (o.parts.has('upload')) {
      progress(`a directory of ${o.files} small files: one tar upload, then one files.write each`);
      const dir = await mkdtemp(join(tmpdir(), 'paddock-bench-tree-'));
      onCleanup('tree', () => rm(dir, { recursive: true, force: true }));
      await makeTree(dir, o.files);
      const up = await make({ memoryMiB: 512, diskMiB: 256 });
      await must(up, ['mkdir', '-p', '/work/tar'], 'mkdir');
      let t0 = performance.now();
      await up.files.upload(dir, '/work/tar');
      uploadTarMs = ms(t0);
      const n = (await must(up, ['sh', '-c', 'find /work/tar -type f | wc -l'], 'count')).stdout.trim();
      if (Number(n) !== o.files) throw new Error(`the tar upload left ${n} files, not ${o.files}`);
      t0 = performance.now();
      for (const d of await readdir(dir)) {
        for (const f of await readdir(join(dir, d))) await up.files.write(`/work/each/${d}/${f}`, await readFile(join(dir, d, f)));
      }
      uploadEachMs = ms(t0);
      await up.kill();
    }

    let ex: { p50: number; p95: number } | null = null;
    let ec: { p50: number; p95: number } | null = null;
    if (o.parts.has('pty')) {
      progress(`exec \`true\` ×${o.keys}, then keystroke → echo on a terminal ×${o.keys}`);
      const sb = await make({});
      const execs: number[] = [];
      for (let i = 0; i < o.keys; i++) {
        const t0 = performance.now();
        await sb.exec(['true']);
        execs.push(ms(t0));
      }
      const pty = await sb.pty.create({ cols: 80, rows: 24, cmd: ['/bin/sh'] });
      const it = pty[Symbol.asyncIterator]();
      const readUntil = async (want: string) => {
        let seen = '';
        while (!seen.includes(want)) {
          const r = await it.next();
          if (r.done) throw new Error(`the terminal ended before printing ${JSON.stringify(want)}`);
          seen += Buffer.from(r.value).toString('latin1');
        }
      };
      await pty.write('stty echo; echo ready\r');
      await readUntil('ready');
      const echoes: number[] = [];
      const keys = 'abcdefghijklmnopqrstuvwxyz';
      for (let i = 0; i < o.keys; i++) {
        const k = keys[i % keys.length] as string;
        const t0 = performance.now();
        await pty.write(k);
        await readUntil(k);
        echoes.push(ms(t0));
      }
      await pty.kill().catch(() => {});
      ex = summarize(execs);
      ec = summarize(echoes);
    }

    const rows: [string, string, string][] = [
      ['install (~10 MiB, byte-compiled), one sandbox', msOr(installOneMs), ''],
      ['snapshot of its files', msOr(snapshotMs, `, ${(snapBytes / 1048576).toFixed(1)} MiB layer`), ''],
      [`${o.copies} from the snapshot → each imports`, msOr(forkMs), `${ratio(installMs, forkMs)} faster than installing (target ≥ 5×)`],
      [`${o.copies} fresh, each installing (floor)`, msOr(installMs), ''],
      [`upload ${o.files} files: one tar`, msOr(uploadTarMs), `${ratio(uploadEachMs, uploadTarMs)} faster than one write each (target ≥ 10×)`],
      [`upload ${o.files} files: files.write each (floor)`, msOr(uploadEachMs), ''],
      ['terminal keystroke → echo p50 / p95', ec ? `${round3(ec.p50)} / ${round3(ec.p95)} ms` : '—', `${ratio(ec?.p50 ?? null, ex?.p50 ?? null)} exec \`true\` (target ≤ 2×)`],
      ['exec `true` p50 / p95', ex ? `${round3(ex.p50)} / ${round3(ex.p95)} ms` : '—', ''],
    ];
    for (const [k, v, n] of rows) process.stdout.write(`${k.padEnd(48)} ${v.padEnd(28)} ${n}\n`);
    process.stdout.write('(one run on a shared host: compare the ratios, not the absolute times)\n');
    if (o.json) {
      process.stdout.write(
        `${JSON.stringify({
          snapshotMs: r3(snapshotMs),
          fork16Ms: r3(forkMs),
          install16Ms: r3(installMs),
          copies: o.copies,
          uploadTarMs: r3(uploadTarMs),
          uploadEachMs: r3(uploadEachMs),
          files: o.files,
          ptyEchoP50Ms: r3(ec?.p50 ?? null),
          execP50Ms: r3(ex?.p50 ?? null),
        })}\n`,
      );
    }
    ok = true;
  } finally {
    await finishRun(ok, nodes);
  }
}

runMain(main);
