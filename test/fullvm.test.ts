/**
 * The full-VM backend through a real node and the SDK: a desktop (Xorg, IceWM, xterm) in a QEMU
 * q35 guest under TCG, its screen read and its input sent through QMP. The test that looks opens
 * a terminal with a keyboard shortcut, types a command that prints a random token, and finds the
 * token in a screenshot with tesseract's OCR; then hibernates, restores and finds it again.
 * Skipped, saying why, where QEMU or tesseract is missing (ops/setup.sh installs both).
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import anyTest, { type TestFn } from 'ava';
import { ensureDesktopImage } from '../runtime/fullvm/image.ts';
import { ImageStore } from '../runtime/images/store.ts';
import type { Sandbox } from '../sdk/index.ts';
import { type ClusterContext, SHARED_IMAGES, startTestCluster, stopTestCluster } from './helpers/cluster.ts';

const missing = [
  process.getuid?.() === 0 ? '' : 'root',
  existsSync('/usr/bin/qemu-system-x86_64') ? '' : 'qemu-system-x86 (apt-get install qemu-system-x86)',
  existsSync('/usr/bin/tesseract') ? '' : 'tesseract (apt-get install tesseract-ocr)',
].filter(Boolean);
type Ctx = ClusterContext & { desktop: Sandbox; ocrDir: string };
const ctxTest = anyTest as TestFn<Ctx>;
const test = missing.length > 0 ? ctxTest.skip : ctxTest.serial;
if (missing.length > 0) console.log(`fullvm tests skipped: needs ${missing.join(', ')}`);

function qemuPids(home: string): number[] {
  try {
    return execFileSync('pgrep', ['-f', `qemu-system-x86_64.*${home}`], { encoding: 'utf8' }).split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** What tesseract reads on a screenshot. */
async function ocr(t: { context: Ctx }, png: Uint8Array): Promise<string> {
  const f = join(t.context.ocrDir, `s${Date.now()}${Math.random().toString(36).slice(2, 6)}.png`);
  await writeFile(f, png);
  try {
    return execFileSync('tesseract', [f, '-', '--psm', '6'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  } finally {
    await rm(f, { force: true });
  }
}

/** Screenshots until OCR finds `token` (the guest runs under TCG: a key press takes a while to show). */
async function waitForText(t: { context: Ctx }, sb: Sandbox, token: string, tries = 40): Promise<string> {
  let text = '';
  for (let i = 0; i < tries; i++) {
    text = await ocr(t, (await sb.display.screenshot()).png);
    if (text.replace(/\s/g, '').includes(token)) return text;
    await new Promise((r) => setTimeout(r, 500));
  }
  return text;
}

if (missing.length === 0) {
  ctxTest.before(async (t) => {
    await ensureDesktopImage(new ImageStore(SHARED_IMAGES), { progress: process.stderr });
    Object.assign(t.context, await startTestCluster({ env: { PADDOCK_BACKENDS: 'container,fullvm' } }));
    t.context.ocrDir = await mkdtemp(join(tmpdir(), 'paddock-ocr-'));
    // The first create boots the node's desktop template (tens of seconds under TCG).
    t.context.desktop = await t.context.pdk.sandboxes.create({ backend: 'fullvm', image: 'desktop', cpu: 1, memoryMiB: 1024 }, { timeoutMs: 600_000 });
  });
  ctxTest.after.always(async (t) => {
    await t.context.desktop?.kill().catch(() => {});
    if (t.context.ocrDir) await rm(t.context.ocrDir, { recursive: true, force: true });
    await stopTestCluster(t.context.cluster ? t.context : undefined);
  });
}

test('a terminal opened with a shortcut prints a token that a screenshot shows; hibernate and restore keep the screen', async (t) => {
  const sb = t.context.desktop;
  t.is(sb.info.backend, 'fullvm');
  const first = await sb.display.screenshot();
  t.is(first.width, 1024);
  t.is(first.height, 768);
  t.is(Buffer.from(first.png).readUInt32BE(0), 0x89504e47, 'a PNG');
  // IceWM's task bar is drawn: the screen is not one colour.
  t.true(first.png.length > 4000, `a screen with something on it (${first.png.length} bytes)`);

  await sb.display.key('ctrl+alt+t');
  const alphabet = 'ACEFHKMNPRTWXY3479';
  const token = `PDK${Array.from({ length: 6 }, () => alphabet[Math.floor(Math.random() * alphabet.length)]).join('')}`;
  // Wait for the terminal's window before typing into it.
  for (let i = 0; i < 60; i++) {
    const r = await sb.exec(['sh', '-c', 'xdotool search --onlyvisible --class xterm | head -1']);
    if (r.stdout.trim()) break;
    await new Promise((res) => setTimeout(res, 500));
  }
  await sb.display.type(`echo ${token.slice(0, 3)}""${token.slice(3)}\n`);
  const seen = await waitForText(t, sb, token);
  t.true(seen.replace(/\s/g, '').includes(token), `OCR found ${token} in: ${seen}`);
  // exec, as for a microVM, reaches the same X server.
  const name = await sb.exec(['xdotool', 'getactivewindow', 'getwindowname']);
  t.is(name.exitCode, 0, name.stderr);
  t.true(name.stdout.trim().length > 0);

  const pids = qemuPids(t.context.home).length;
  t.is((await sb.hibernate()).state, 'hibernated');
  t.is(qemuPids(t.context.home).length, pids - 1, 'the VMM exited');
  t.is((await sb.restore()).state, 'running');
  const after = await waitForText(t, sb, token, 10);
  t.true(after.replace(/\s/g, '').includes(token), `after restore, OCR found ${token} in: ${after}`);
});

test('the computer-use action set: pointer, clicks, keys, scroll, drag, wait; every action can return a screenshot', async (t) => {
  const sb = t.context.desktop;
  t.deepEqual((await sb.computer({ action: 'mouse_move', coordinate: [100, 200] })).cursor, { x: 100, y: 200 });
  t.deepEqual(await sb.display.cursor(), { x: 100, y: 200 });
  for (const action of ['left_click', 'right_click', 'middle_click', 'double_click', 'triple_click'] as const) {
    t.deepEqual((await sb.computer({ action, coordinate: [500, 300] })).cursor, { x: 500, y: 300 }, action);
  }
  await sb.display.key('Escape');
  await sb.computer({ action: 'left_mouse_down', coordinate: [10, 10] });
  await sb.computer({ action: 'left_mouse_up', coordinate: [20, 20] });
  await sb.display.drag([30, 30], [200, 200]);
  t.deepEqual(await sb.display.cursor(), { x: 200, y: 200 });
  await sb.display.scroll(512, 384, { dy: -3 });
  await sb.display.scroll(512, 384, { dx: 2 });
  await sb.computer({ action: 'hold_key', text: 'shift', duration: 0.2 });
  await sb.computer({ action: 'wait', duration: 0.1 });
  const shot = await sb.computer({ action: 'left_click', coordinate: [1023, 767], screenshot: true });
  t.is(shot.screenshot?.width, 1024);
  t.is(Buffer.from(shot.screenshot!.png).readUInt32BE(0), 0x89504e47);
  const plain = await sb.computer({ action: 'screenshot' });
  t.is(plain.screenshot?.height, 768);
  // Where the pointer is, in the guest's own view: X agrees with the VMM.
  await sb.computer({ action: 'mouse_move', coordinate: [321, 123] });
  let loc = '';
  for (let i = 0; i < 20 && !loc.includes('x:321 y:123'); i++) {
    loc = (await sb.exec(['xdotool', 'getmouselocation'])).stdout;
    if (!loc.includes('x:321 y:123')) await new Promise((r) => setTimeout(r, 250));
  }
  t.regex(loc, /x:321 y:123/);
});

test('bad display input gets a clear error and sends nothing; a flood is bounded; the VM keeps serving', async (t) => {
  const sb = t.context.desktop;
  const bad: [object, string, RegExp][] = [
    [{ action: 'left_click', coordinate: [1024, 10] }, 'INVALID_REQUEST', /off the screen \(1024×768/],
    [{ action: 'left_click', coordinate: [-1, 10] }, 'INVALID_REQUEST', /coordinate/],
    [{ action: 'key', text: 'ctrl+nosuchkey' }, 'INVALID_REQUEST', /unknown key 'nosuchkey'/],
    [{ action: 'key' }, 'INVALID_REQUEST', /text is required/],
    [{ action: 'type', text: 'é' }, 'INVALID_REQUEST', /no key on a US keyboard/],
    [{ action: 'type', text: 'x'.repeat(1024 * 1024) }, 'PAYLOAD_TOO_LARGE', /text/],
    [{ action: 'fly' }, 'INVALID_REQUEST', /unknown action/],
    [{ action: 'wait', duration: 3600 }, 'INVALID_REQUEST', /duration/],
    [{ action: 'scroll', coordinate: [1, 1], scroll_direction: 'sideways' }, 'INVALID_REQUEST', /scroll_direction/],
  ];
  for (const [action, code, message] of bad) {
    const e = await t.throwsAsync(sb.computer(action as never));
    t.is((e as { code?: string }).code, code, JSON.stringify(action).slice(0, 80));
    t.regex(e.message, message);
  }
  // 1,000 actions at once: they run one at a time, those past the queue's bound are refused with BUSY.
  const flood = await Promise.allSettled(Array.from({ length: 1000 }, (_, i) => sb.computer({ action: 'mouse_move', coordinate: [i % 1024, 5] })));
  const ok = flood.filter((r) => r.status === 'fulfilled').length;
  const busy = flood.filter((r) => r.status === 'rejected' && (r.reason as { code?: string }).code === 'BUSY').length;
  t.is(ok + busy, 1000, 'each either ran or was refused with BUSY');
  t.true(ok >= 1 && busy >= 1, `ran ${ok}, BUSY ${busy}`);
  t.is((await sb.display.screenshot()).width, 1024);
  // A sandbox without a display says so.
  const c = await t.context.pdk.sandboxes.create({});
  t.teardown(() => c.kill().catch(() => {}));
  await t.throwsAsync(c.display.screenshot(), { code: 'INVALID_REQUEST', message: /lacks the display capability/ } as never);
  // A screen size out of range is refused at create.
  await t.throwsAsync(t.context.pdk.sandboxes.create({ backend: 'fullvm', image: 'desktop', memoryMiB: 1024, display: { width: 100, height: 100 } }), { code: 'INVALID_SPEC' } as never);
  await t.throwsAsync(t.context.pdk.sandboxes.create({ backend: 'fullvm', image: 'desktop', memoryMiB: 256 }), { code: 'INVALID_SPEC', message: /at least 512/ } as never);
});

test('the screen comes from the VMM: with the X server killed inside, a screenshot still answers; a paused VM is woken for one', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ backend: 'fullvm', image: 'desktop', memoryMiB: 1024 }, { timeoutMs: 600_000 });
  t.teardown(() => sb.kill().catch(() => {}));
  await sb.pause();
  const woke = await sb.display.screenshot();
  t.is(woke.width, 1024);
  t.is((await sb.refresh()).state, 'running');
  await sb.exec(['sh', '-c', 'pkill -9 Xorg; pkill -9 icewm; true']);
  const s = await sb.display.screenshot();
  t.is(s.width, 1024);
  t.truthy((await sb.computer({ action: 'left_click', coordinate: [5, 5] })).cursor);
  const n = qemuPids(t.context.home).length;
  t.is((await sb.kill()).state, 'stopped');
  t.is(qemuPids(t.context.home).length, n - 1, 'its VMM is gone');
});
