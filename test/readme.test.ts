/**
 * The README's tour, run exactly as it stands there (its two shell blocks are read from
 * README.md, so the two cannot drift), and `npm start` stopped every way a person stops it: from
 * another shell with `paddock down` (the tour's last line), SIGTERM to npm from another shell,
 * and Ctrl-C in its terminal (SIGINT to the whole process group). Each time nothing is left.
 *
 * What the harness sets around the commands: a PADDOCK_HOME of its own (the tour says any works),
 * a node id of its own (node ids name cgroups: test files run side by side), and PADDOCK_FN_BUILD=0
 * (a first start otherwise spends minutes making the FnCall images, which the tour does not use).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** The shell blocks of the README's tour section. */
function tourBlocks(): string[] {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const start = readme.indexOf('## A five-minute tour');
  const end = readme.indexOf('From TypeScript:', start);
  const section = readme.slice(start, end);
  return [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1] as string);
}

interface Started {
  child: ChildProcess;
  home: string;
  env: NodeJS.ProcessEnv;
  out: () => string;
  exited: Promise<number | null>;
  up: { pid: number; natsPid?: number; nodePid?: number; http?: string };
}

let n = 0;

async function start(t: { teardown(fn: () => Promise<void>): void }, command: string): Promise<Started> {
  const home = await mkdtemp(join(tmpdir(), 'paddock-tour-'));
  const env: NodeJS.ProcessEnv = { ...process.env, PADDOCK_HOME: home, PADDOCK_NODE_ID: `tour${process.pid}n${++n}`, PADDOCK_FN_BUILD: '0' };
  delete env.NATS_URL;
  // detached: a process group of its own, as a terminal gives what it runs.
  const child = spawn('bash', ['-c', command], { cwd: ROOT, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let text = '';
  child.stdout?.on('data', (d: Buffer) => {
    text += d.toString();
  });
  child.stderr?.on('data', (d: Buffer) => {
    text += d.toString();
  });
  const exited = new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
  t.teardown(async () => {
    if (child.exitCode === null && child.signalCode === null && child.pid) process.kill(-child.pid, 'SIGTERM');
    await exited;
    await rm(home, { recursive: true, force: true });
  });
  const until = Date.now() + 300_000;
  while (!text.includes('Paddock is up') && Date.now() < until && child.exitCode === null) await new Promise((r) => setTimeout(r, 200));
  if (!text.includes('Paddock is up')) throw new Error(`npm start did not come up:\n${text}`);
  const up = JSON.parse(await readFile(join(home, 'paddock.pid'), 'utf8')) as Started['up'];
  return { child, home, env, out: () => text, exited, up };
}

function alive(pid: number | undefined): boolean {
  if (!pid) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function nothingLeft(t: { false(v: boolean, m?: string): void }, s: Started): Promise<void> {
  // Unref'd: a pending two-minute timer held the test file's worker (and an ava slot) open that long.
  const code = await Promise.race([s.exited, new Promise<'hung'>((r) => setTimeout(() => r('hung'), 120_000).unref())]);
  t.false(code === 'hung', `npm start is still running:\n${s.out()}`);
  for (const [what, pid] of [['paddock up', s.up.pid], ['nats-server', s.up.natsPid], ['node', s.up.nodePid]] as const) t.false(alive(pid), `${what} (pid ${pid}) is still running`);
  t.false(existsSync(join(s.home, 'paddock.pid')), 'the pid file is gone');
  t.false(existsSync(join(s.home, 'nats.url')), 'the NATS URL file is gone');
}

test.serial('the README tour runs as written, and its `paddock down` leaves nothing running', async (t) => {
  t.timeout(600_000);
  const [first, second] = tourBlocks();
  t.truthy(first && second, 'the tour has two shell blocks');
  t.regex(first as string, /^npm start\b/);
  const s = await start(t, first as string);
  t.teardown(() => rm(join(ROOT, 'solution.py'), { force: true }));
  const tour = spawn('bash', ['-c', second as string], { cwd: ROOT, env: s.env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  tour.stdout.on('data', (d: Buffer) => {
    out += d.toString();
  });
  tour.stderr.on('data', (d: Buffer) => {
    err += d.toString();
  });
  const code = await new Promise<number | null>((r) => tour.on('exit', r));
  t.is(code, 0, `${out}\n${err}`);
  const id = /^sb-[a-z2-7]{16}$/m.exec(out)?.[0] ?? /(sb-[a-z2-7]{16})/.exec(out)?.[1];
  t.truthy(id, out);
  t.regex(out, /^NATS: +\S+ \(nats-server/m, 'paddock status');
  t.regex(out, new RegExp(`^gateway: +http://${s.up.http}/ \\(in paddock up, pid ${s.up.pid}\\)$`, 'm'), 'paddock status names the gateway npm start runs');
  t.regex(out, /^hi\nexit=3$/m, 'exec streams and exits with the command’s code');
  t.regex(out, /^print\(6 \* 7\)$/m, 'files put, then read back');
  t.regex(out, new RegExp(`^${id}\\s+\\S+\\s+running\\s+busybox\\s.*task=demo$`, 'm'), 'ps --label');
  t.regex(out, new RegExp(`^${id}: stopped \\(killed\\)$`, 'm'), 'rm');
  t.regex(out, /INFO +sandbox stopped/, 'logs: the sandbox’s lifecycle at info');
  t.regex(err, /paddock: stopped/, 'down waited for the stop');
  t.notRegex(err, /paddock: [A-Z_]+: /, 'no command failed');
  await nothingLeft(t, s);
  t.is(await s.exited, 0);
});

test.serial('SIGTERM to npm start from another shell stops it cleanly', async (t) => {
  t.timeout(600_000);
  const s = await start(t, 'exec npm start');
  t.regex(s.out(), new RegExp(`^  HTTP: +http://${s.up.http}/ `, 'm'), 'the banner names the gateway');
  const api = await fetch(`http://${s.up.http}/v1/openapi.json`);
  t.is(api.status, 200, 'the gateway the banner names answers');
  // bash execs npm: the child is npm itself, as `kill <npm pid>` from another shell would hit.
  process.kill(s.child.pid as number, 'SIGTERM');
  await nothingLeft(t, s);
  t.regex(s.out(), /paddock: stopped/);
});

test.serial('Ctrl-C in npm start’s terminal (SIGINT to its process group) stops it cleanly', async (t) => {
  t.timeout(600_000);
  const s = await start(t, 'exec npm start');
  process.kill(-(s.child.pid as number), 'SIGINT');
  await nothingLeft(t, s);
  t.regex(s.out(), /paddock: stopped/);
});
