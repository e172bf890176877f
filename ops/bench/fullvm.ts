/**
 * The full-VM backend (a QEMU q35 desktop: Xorg, IceWM, xterm) on one local node, through the SDK:
 *
 *   npm run bench:fullvm [-- --starts 10] [-- --shots 30] [-- --json]
 *
 * - cold boot: the first desktop create on a fresh node (its template boots and draws) to its first
 *   screenshot;
 * - template start: create → first screenshot of a copy-on-write clone (p50/p95 over --starts);
 * - screenshot round trip at 1024×768 (p50/p95 over --shots); the floor is QEMU's own screendump of
 *   the same screen, asked over QMP by this process of a clone of the same template it starts
 *   itself (no node, no NATS), as PNG and as PPM (no PNG encoding);
 * - input → visible change: one character typed into a focused xterm, then screenshots back to
 *   back until the decoded pixels of the terminal's window differ from those before the key (the
 *   rest of the screen is left out: IceWM's task bar redraws on its own, its clock for one);
 * - idle host memory (PSS of the QEMU process) and CPU of a desktop started from the template;
 * - hibernate of a desktop, and restore → its first screenshot;
 * - exec `true` in a container on the same node, for the machine's speed at the time.
 *
 * Progress goes to stderr; stdout carries the table and, with --json, one JSON object as its last
 * line.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, existsSync, openSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { inflateSync } from 'node:zlib';
import { desktopSpec, ensureDesktopImage } from '../../runtime/fullvm/image.ts';
import { currentImage } from '../../runtime/images/build.ts';
import { copyImage, LocalLayerStore } from '../../runtime/images/remote.ts';
import { ImageStore } from '../../runtime/images/store.ts';
import { findGenericKernel } from '../../runtime/microvm/kernel.ts';
import { Qmp } from '../../runtime/microvm/qmp.ts';
import type { Sandbox } from '../../sdk/index.ts';
import { cleanUpOnSignals, finishRun, numberArg, onCleanup, progress, runMain, sandboxMaker, sleep, startBenchNode, UsageError } from './harness.ts';
import { round3, type Summary, summarize } from './stats.ts';
import { cpuTicks, hibernatedBytes, pss, qemuOf } from './vm-readings.ts';

const USAGE = 'usage: fullvm.ts [--starts N] [--shots N] [--chars N] [--json]';

function parse(argv: string[]) {
  let starts = 10;
  let shots = 30;
  let chars = 10;
  let json = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === '--json') json = true;
    else if (a === '--starts' || a.startsWith('--starts=')) ({ value: starts, next: i } = numberArg(argv, i, '--starts', USAGE));
    else if (a === '--shots' || a.startsWith('--shots=')) ({ value: shots, next: i } = numberArg(argv, i, '--shots', USAGE));
    else if (a === '--chars' || a.startsWith('--chars=')) ({ value: chars, next: i } = numberArg(argv, i, '--chars', USAGE));
    else throw new UsageError(`unknown argument ${a}\n${USAGE}`);
  }
  return { starts, shots, chars, json };
}

const DESKTOP = { backend: 'fullvm', image: 'desktop', cpu: 1, memoryMiB: 1024 } as const;
const ms = (t0: number) => performance.now() - t0;
const MiB = (b: number) => `${(b / 1048576).toFixed(1)} MiB`;
const p = (s: Summary) => `${round3(s.p50)} / ${round3(s.p95)} ms`;

// ─── The desktop image ──────────────────────────────────────────────────────────────────────────

/** The `desktop` image in the node's store: copied from the tests' store when that has it (seconds), else built (minutes). */
async function ensureDesktop(imagesDir: string): Promise<void> {
  const spec = desktopSpec();
  const store = new ImageStore(imagesDir);
  if (await currentImage(store, spec)) return;
  const shared = join(tmpdir(), 'paddock-test-images');
  if (shared !== imagesDir && (await currentImage(new ImageStore(shared), spec))) {
    progress(`copying the desktop image from ${shared}`);
    await store.init();
    await copyImage(spec.name, new LocalLayerStore(shared), new LocalLayerStore(imagesDir));
    return;
  }
  progress('building the desktop image (a few minutes and ~150 MB of packages the first time)');
  await ensureDesktopImage(store);
}

// ─── Host readings ──────────────────────────────────────────────────────────────────────────────

// ─── Pixels ─────────────────────────────────────────────────────────────────────────────────────

interface Rect {
  x: number;
  y: number;
  w: number;
  h: number;
}

/** A PNG's inflated scanlines (each row's filter byte, then its filtered samples). */
interface Scan {
  width: number;
  height: number;
  /** Bytes per pixel. */
  ch: number;
  raw: Buffer;
}

/** 8-bit RGB or RGBA, not interlaced: what QEMU's screendump writes. */
function inflatePng(png: Uint8Array): Scan {
  const b = Buffer.from(png.buffer, png.byteOffset, png.byteLength);
  const idat: Buffer[] = [];
  let width = 0;
  let height = 0;
  let ch = 0;
  for (let off = 8; off + 8 <= b.length; ) {
    const len = b.readUInt32BE(off);
    const type = b.toString('latin1', off + 4, off + 8);
    const data = b.subarray(off + 8, off + 8 + len);
    if (type === 'IHDR') {
      width = data.readUInt32BE(0);
      height = data.readUInt32BE(4);
      if (data[8] !== 8 || (data[9] !== 2 && data[9] !== 6) || data[12] !== 0) throw new Error(`a PNG this benchmark cannot decode (depth ${data[8]}, colour type ${data[9]}, interlace ${data[12]})`);
      ch = data[9] === 2 ? 3 : 4;
    } else if (type === 'IDAT') idat.push(data);
    else if (type === 'IEND') break;
    off += 12 + len;
  }
  return { width, height, ch, raw: inflateSync(Buffer.concat(idat)) };
}

/**
 * The filtered scanlines of the rows `r` spans: they differ whenever a pixel of those rows does
 * (each row is filtered against itself and the row above), and comparing them costs only the
 * native inflate, so polling stays as fast as the screenshots come.
 */
function rowsOf(s: Scan, r: Rect): Buffer {
  const line = s.width * s.ch + 1;
  return s.raw.subarray(r.y * line, Math.min(s.height, r.y + r.h) * line);
}

/** The decoded pixels of rectangle `r`, row after row. */
function pixelsIn(s: Scan, r: Rect): Buffer {
  const { width, height, ch, raw } = s;
  const stride = width * ch;
  const y1 = Math.min(height, r.y + r.h);
  // Each row's filter refers to the row above: unfilter from the top down to the rectangle's bottom.
  let prev = Buffer.alloc(stride);
  const rows: Buffer[] = [];
  for (let y = 0; y < y1; y++) {
    const at = y * (stride + 1);
    const f = raw[at];
    const cur = Buffer.from(raw.subarray(at + 1, at + 1 + stride));
    for (let i = 0; i < stride; i++) {
      const a = i >= ch ? (cur[i - ch] as number) : 0;
      const up = prev[i] as number;
      const c = i >= ch ? (prev[i - ch] as number) : 0;
      let add = 0;
      if (f === 1) add = a;
      else if (f === 2) add = up;
      else if (f === 3) add = (a + up) >> 1;
      else if (f === 4) {
        const pa = Math.abs(up - c);
        const pb = Math.abs(a - c);
        const pc = Math.abs(a + up - 2 * c);
        add = pa <= pb && pa <= pc ? a : pb <= pc ? up : c;
      }
      cur[i] = ((cur[i] as number) + add) & 255;
    }
    if (y >= r.y) rows.push(cur.subarray(Math.max(0, r.x) * ch, Math.min(width, r.x + r.w) * ch));
    prev = cur;
  }
  return Buffer.concat(rows);
}

/**
 * What the terminal's window shows: its rows' scanlines for a quick look, and its pixels. Decoded
 * pixels, not the PNG's bytes, decide: a change anywhere on the screen changes the compressed
 * stream (IceWM's task bar redraws on its own), and only the window is watched.
 */
interface Look {
  rows: Buffer;
  pixels: Buffer;
}

function look(png: Uint8Array, r: Rect): Look {
  const s = inflatePng(png);
  return { rows: Buffer.from(rowsOf(s, r)), pixels: pixelsIn(s, r) };
}

/** Whether `png` shows the window other than `before`: the scanlines first, the pixels when they differ. */
function changed(png: Uint8Array, r: Rect, before: Look): boolean {
  const s = inflatePng(png);
  return !rowsOf(s, r).equals(before.rows) && !pixelsIn(s, r).equals(before.pixels);
}

/** The terminal's window on the screen, as X sees it. */
async function windowRect(sb: Sandbox, wid: string): Promise<Rect> {
  const out = (await sb.exec(['xdotool', 'getwindowgeometry', '--shell', wid])).stdout;
  const v = (k: string) => Number(new RegExp(`^${k}=(\\d+)$`, 'm').exec(out)?.[1] ?? Number.NaN);
  const r = { x: v('X'), y: v('Y'), w: v('WIDTH'), h: v('HEIGHT') };
  if (!Object.values(r).every(Number.isFinite)) throw new Error(`xdotool getwindowgeometry: ${out}`);
  return r;
}

/** The window once two screenshots 250 ms apart agree (the previous key drawn, the prompt printed). */
async function steadyLook(sb: Sandbox, r: Rect): Promise<Look> {
  let last = look((await sb.display.screenshot()).png, r);
  for (let i = 0; i < 40; i++) {
    await sleep(250);
    const now = look((await sb.display.screenshot()).png, r);
    if (now.pixels.equals(last.pixels)) return now;
    last = now;
  }
  throw new Error('the terminal never stopped changing');
}

// ─── The floor: QEMU's own screendump ───────────────────────────────────────────────────────────

interface Floor {
  png: Summary;
  pngRead: Summary;
  ppm: Summary;
  pngBytes: number;
}

/**
 * Starts a clone of the template `pid`'s VMM came from, with `pid`'s own command line but a
 * directory (and so QMP socket) of this process's, loads the template's device state and times
 * screendump over QMP: what QEMU takes to encode and write the screen, without the node. A VMM's
 * QMP socket takes one client, and the node holds each of its own.
 */
async function qemuFloor(pid: number, home: string, shots: number): Promise<Floor | string> {
  const argv = (await readFile(`/proc/${pid}/cmdline`, 'utf8')).split('\0').filter(Boolean);
  const pidfile = argv[argv.indexOf('-pidfile') + 1];
  const memArg = argv.find((a) => a.includes('mem-path='));
  if (!pidfile || !memArg) return 'its VMM has no -pidfile or no RAM file';
  if (argv.some((a) => a.includes('/run/paddock-vm'))) return 'its sockets are outside its directory';
  const vmDir = dirname(pidfile);
  const tmplDir = dirname(/mem-path=([^,]+)/.exec(memArg)?.[1] ?? '');
  const dir = await mkdtemp(join(home, 'floor-'));
  // Its machine, without the jail: no chroot, user or seccomp filter of its own (this one reads
  // its state with `exec:` and writes screendumps where this process reads them). In the VMM's
  // mount namespace, the node's: a lazily loaded layer file is a FUSE mount of the node's.
  const args: string[] = [];
  const rest = argv.slice(1).map((a) => a.split(vmDir).join(dir));
  for (let i = 0; i < rest.length; i++) {
    if (['-chroot', '-runas', '-sandbox'].includes(rest[i] as string)) i++;
    else args.push(rest[i] as string);
  }
  const name = args.indexOf('-name');
  if (name >= 0) args[name + 1] = 'paddock-bench-floor';
  const errFd = openSync(join(dir, 'qemu.err'), 'a');
  const proc: ChildProcess = spawn('nsenter', ['--target', String(pid), '--mount', '--', argv[0] as string, ...args], { stdio: ['ignore', 'ignore', errFd] });
  closeSync(errFd);
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  const stop = async () => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
    await exited;
  };
  onCleanup('floor VMM', stop);
  let qmp: Qmp | undefined;
  try {
    qmp = await Qmp.open(join(dir, 'qmp.sock'));
    await qmp.cmd('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: true }] });
    await qmp.cmd('migrate-incoming', { uri: `exec:cat ${join(tmplDir, 'dev')}` });
    await qmp.migrated(true);
    await qmp.cmd('cont');
    await sleep(2000);
    const q = qmp;
    const dump = async (format: 'png' | 'ppm') => {
      const file = join(dir, `s.${format}`);
      const t0 = performance.now();
      await q.cmd('screendump', { filename: file, format });
      const dumped = ms(t0);
      const bytes = (await readFile(file)).length;
      const read = ms(t0);
      await rm(file, { force: true });
      return { dumped, read, bytes };
    };
    for (let i = 0; i < 3; i++) await dump('png');
    const png: number[] = [];
    const pngRead: number[] = [];
    let pngBytes = 0;
    for (let i = 0; i < shots; i++) {
      const d = await dump('png');
      png.push(d.dumped);
      pngRead.push(d.read);
      pngBytes = d.bytes;
    }
    const ppm: number[] = [];
    for (let i = 0; i < shots; i++) ppm.push((await dump('ppm')).dumped);
    return { png: summarize(png), pngRead: summarize(pngRead), ppm: summarize(ppm), pngBytes };
  } catch (e) {
    const err = await readFile(join(dir, 'qemu.err'), 'utf8').catch(() => '');
    return `${(e as Error).message}${err ? `: ${err.trim().split('\n').slice(-2).join(' ')}` : ''}`;
  } finally {
    qmp?.close();
    await stop();
    await rm(dir, { recursive: true, force: true });
  }
}

// ─── The run ────────────────────────────────────────────────────────────────────────────────────

async function main(): Promise<void> {
  const o = parse(process.argv.slice(2));
  cleanUpOnSignals();
  let nodes: { id: string; logFile?: string }[] | undefined;
  let ok = false;
  try {
    // Outside the cold boot: the image and the guest kernel are a machine's one-off downloads.
    await ensureDesktop(process.env.PADDOCK_IMAGES_DIR || '/var/lib/paddock/images');
    await findGenericKernel();
    const load0 = loadavg()[0] as number;
    const { cluster, pdk, home } = await startBenchNode({ prefix: 'bfv', env: { PADDOCK_BACKENDS: 'container,fullvm' } });
    nodes = cluster.nodes;
    const make = sandboxMaker(pdk);
    const desktop = (timeoutMs = 120_000) => make({ ...DESKTOP }, { timeoutMs });

    progress('cold boot (the desktop template boots and draws)');
    let t0 = performance.now();
    const first = await desktop(900_000);
    const firstShot = await first.display.screenshot();
    const coldBootMs = ms(t0);
    if (firstShot.width !== 1024 || firstShot.height !== 768) throw new Error(`the screen is ${firstShot.width}×${firstShot.height}, not 1024×768`);

    progress(`template starts ×${o.starts}`);
    const starts: number[] = [];
    for (let i = 0; i < o.starts; i++) {
      // The spare VMM for the next create (a q35 QEMU, started and loaded) starts after each take:
      // let it get ready, as between creates in use.
      await sleep(1500);
      t0 = performance.now();
      const sb = await pdk.sandboxes.create({ ...DESKTOP });
      await sb.display.screenshot();
      starts.push(ms(t0));
      await sb.kill();
    }

    progress(`screenshots ×${o.shots} through the SDK`);
    for (let i = 0; i < 3; i++) await first.display.screenshot();
    const shotSamples: number[] = [];
    let shotBytes = 0;
    for (let i = 0; i < o.shots; i++) {
      t0 = performance.now();
      const s = await first.display.screenshot();
      shotSamples.push(ms(t0));
      shotBytes = s.png.length;
    }
    const shots = summarize(shotSamples);

    progress(`the floor: QEMU's screendump of the same screen, ×${o.shots} PNG and ×${o.shots} PPM, over QMP from here`);
    const firstPid = await qemuOf(home, first.id);
    const floor = firstPid ? await qemuFloor(firstPid, home, o.shots) : 'its VMM was not found';
    if (typeof floor === 'string') progress(`no floor: ${floor}`);

    progress(`input → visible change ×${o.chars}: a terminal opened with ctrl+alt+t`);
    await first.display.key('ctrl+alt+t');
    let wid = '';
    for (let i = 0; i < 120 && !wid; i++) {
      wid = (await first.exec(['sh', '-c', 'xdotool search --onlyvisible --class xterm | head -1'])).stdout.trim();
      if (!wid) await sleep(500);
    }
    if (!wid) throw new Error('no xterm window after ctrl+alt+t');
    const rect = await windowRect(first, wid);
    const inputSamples: number[] = [];
    let polls = 0;
    const alphabet = 'abcdefghijklmnopqrstuvwxyz';
    for (let i = 0; i < o.chars; i++) {
      const before = await steadyLook(first, rect);
      t0 = performance.now();
      await first.display.type(alphabet[i % alphabet.length] as string);
      for (;;) {
        const s = await first.display.screenshot();
        const t = ms(t0);
        polls++;
        if (changed(s.png, rect, before)) {
          inputSamples.push(t);
          break;
        }
        if (t > 15_000) throw new Error(`a typed key did not show in the terminal within ${Math.round(t)} ms`);
      }
    }
    const input = summarize(inputSamples);

    progress('exec `true` in a container, for the machine speed');
    const ct = await make({ backend: 'container', memoryMiB: 256 });
    for (let i = 0; i < 5; i++) await ct.exec(['true']);
    const ctSamples: number[] = [];
    for (let i = 0; i < 30; i++) {
      t0 = performance.now();
      await ct.exec(['true']);
      ctSamples.push(ms(t0));
    }
    const ctExec = summarize(ctSamples);
    await ct.kill();
    await first.kill();

    progress('an idle desktop from the template: PSS and CPU over 5 s');
    const idle = await desktop();
    await idle.display.screenshot();
    const idlePid = await qemuOf(home, idle.id);
    await sleep(3000);
    const c0 = idlePid ? await cpuTicks(idlePid) : Number.NaN;
    await sleep(5000);
    // 100 ticks a second: ticks over 5 s ÷ 5 is % of one core.
    const idleCpuPct = idlePid ? ((await cpuTicks(idlePid)) - c0) / 5 : Number.NaN;
    const idlePssBytes = idlePid ? await pss(idlePid) : Number.NaN;

    progress('hibernate and restore of that desktop');
    t0 = performance.now();
    await idle.hibernate();
    const hibernateMs = ms(t0);
    const hibernateBytes = await hibernatedBytes(home, 'fullvm');
    t0 = performance.now();
    await idle.restore();
    const restored = await idle.display.screenshot();
    const restoreMs = ms(t0);
    const load1 = loadavg()[0] as number;

    const st = summarize(starts);
    const f = typeof floor === 'string' ? undefined : floor;
    const noFloor = typeof floor === 'string' ? floor : '';
    const rows: [string, string, string][] = [
      ['cold boot → desktop ready (first screenshot)', `${round3(coldBootMs)} ms`, ''],
      ['template start → first screenshot p50 / p95', p(st), `target p50 ≤ 2000 ms${st.p50 <= 2000 ? '' : ' (missed)'}`],
      [`screenshot 1024×768 p50 / p95 (SDK, ${(shotBytes / 1024).toFixed(0)} KiB PNG)`, p(shots), `target p50 ≤ 100 ms${shots.p50 <= 100 ? '' : ' (missed)'}`],
      ['  floor: QEMU screendump PNG (QMP, encode + write)', f ? p(f.png) : 'not measured', f ? `SDK p50 ${round3(shots.p50 / f.png.p50)}× this` : noFloor],
      ['  floor: the same + reading the file', f ? p(f.pngRead) : '—', f ? `SDK p50 − this = ${round3(shots.p50 - f.pngRead.p50)} ms (node, NATS, SDK)` : ''],
      ['  floor: QEMU screendump PPM (no PNG encoding)', f ? p(f.ppm) : '—', f ? `PNG − PPM p50 = ${round3(f.png.p50 - f.ppm.p50)} ms` : ''],
      ['input → visible change p50 / p95 (decoded pixels)', p(input), `target p50 ≤ 300 ms${input.p50 <= 300 ? '' : ' (missed)'}; ${round3(polls / o.chars)} screenshots per key`],
      ['idle desktop from the template: PSS', MiB(idlePssBytes), `target ≤ 300 MiB${idlePssBytes <= 300 * 1048576 ? '' : ' (missed)'}`],
      ['idle desktop: CPU over 5 s', `${round3(idleCpuPct)}% of a core`, ''],
      ['hibernate', `${round3(hibernateMs)} ms, ${MiB(hibernateBytes)}`, ''],
      ['restore → first screenshot', `${round3(restoreMs)} ms`, restored.width === 1024 ? '' : `(screen ${restored.width}×${restored.height})`],
      ['exec `true` p50 / p95: container (machine speed)', p(ctExec), ''],
    ];
    for (const [k, v, n] of rows) process.stdout.write(`${k.padEnd(54)} ${v.padEnd(22)} ${n}\n`);
    process.stdout.write(`(one run on a shared 2-core host, QEMU under ${existsSync('/dev/kvm') ? 'KVM' : 'TCG'}; load average ${load0.toFixed(1)} at the start, ${load1.toFixed(1)} at the end)\n`);
    if (o.json) {
      process.stdout.write(
        `${JSON.stringify({
          coldBootMs: round3(coldBootMs),
          templateStartP50Ms: round3(st.p50),
          screenshotP50Ms: round3(shots.p50),
          screenshotP95Ms: round3(shots.p95),
          inputToPixelsP50Ms: round3(input.p50),
          idlePssBytes,
          idleCpuPct: round3(idleCpuPct),
          hibernateMs: round3(hibernateMs),
          restoreMs: round3(restoreMs),
          templateStartP95Ms: round3(st.p95),
          screenshotBytes: shotBytes,
          qemuScreendumpPngP50Ms: f ? round3(f.png.p50) : null,
          qemuScreendumpPpmP50Ms: f ? round3(f.ppm.p50) : null,
          inputToPixelsP95Ms: round3(input.p95),
          hibernateBytes,
          containerExecP50Ms: round3(ctExec.p50),
        })}\n`,
      );
    }
    ok = true;
  } finally {
    await finishRun(ok, nodes);
  }
}

runMain(main);
