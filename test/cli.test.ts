/**
 * The `paddock` CLI as a user runs it: the bin (the compiled CLI in dist/, brought up to date by
 * the set-up first), a separate process talking to a real cluster through NATS_URL. `up` and
 * `down` of what it started are covered by test/readme.test.ts.
 */
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { SandboxInfo } from '../sdk/index.ts';
import { startNats } from '../ops/nats.ts';
import { clusterTest } from './helpers/cluster.ts';

const test = clusterTest();
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const CLI = fileURLToPath(new URL('../ops/bin/paddock.js', import.meta.url));

test.before(() => {
  // Rebuilds dist/ when a source is newer: the tests run the CLI users run, never a stale one.
  execFileSync('bash', ['ops/setup.sh'], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
});

interface Run {
  code: number | null;
  stdout: Buffer;
  stderr: string;
}

function paddock(natsUrl: string | undefined, args: string[], input?: Uint8Array): Promise<Run> {
  const env: NodeJS.ProcessEnv = { ...process.env, PADDOCK_HOME: join(tmpdir(), 'paddock-cli-test-nohome') };
  if (natsUrl === undefined) delete env.NATS_URL;
  else env.NATS_URL = natsUrl;
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], { env, stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout: Buffer.concat(out), stderr: Buffer.concat(err).toString() }));
    child.stdin.end(input);
  });
}

const ALL_BYTES = Uint8Array.from({ length: 256 }, (_, i) => i);

test('create --json, ps --label, rm, info: a sandbox from birth to end', async (t) => {
  const url = t.context.cluster.url;
  const job = `cli${randomBytes(4).toString('hex')}`;
  const created = await paddock(url, ['create', '--label', `job=${job}`, '--label', 'kind=cli', '--memory', '128', '--json']);
  t.is(created.code, 0, created.stderr);
  const info = JSON.parse(created.stdout.toString()) as SandboxInfo;
  t.regex(info.id, /^sb-[a-z2-7]{16}$/);
  t.is(info.state, 'running');
  t.is(info.memoryMiB, 128);
  t.deepEqual(info.labels, { job, kind: 'cli' });

  const ps = await paddock(url, ['ps', '--label', `job=${job}`]);
  t.is(ps.code, 0, ps.stderr);
  const lines = ps.stdout.toString().trim().split('\n');
  t.regex(lines[0] ?? '', /^ID\s+NODE\s+STATE\s+IMAGE\s+CPU\s+MEM\s+AGE\s+LABELS$/);
  t.is(lines.length, 2);
  t.regex(lines[1] ?? '', new RegExp(`^${info.id}\\s+\\S+\\s+running\\s+busybox\\s+1\\s+128Mi\\s+\\d+[smhd]\\s+.*job=${job}`));
  const other = await paddock(url, ['ps', '--label', `job=${job}-other`, '--json']);
  t.deepEqual(JSON.parse(other.stdout.toString()), []);

  const removed = await paddock(url, ['rm', info.id]);
  t.is(removed.code, 0, removed.stderr);
  t.is(removed.stdout.toString(), `${info.id}: stopped (killed)\n`);

  const after = await paddock(url, ['info', info.id, '--json']);
  t.is(after.code, 0, after.stderr);
  const ended = JSON.parse(after.stdout.toString()) as SandboxInfo;
  t.is(ended.state, 'stopped');
  t.is(ended.reason, 'killed');
  const text = await paddock(url, ['info', info.id]);
  t.regex(text.stdout.toString(), /^state: +stopped$/m);

  t.is((await paddock(url, ['ps', '--label', `job=${job}`, '--json'])).stdout.toString().trim(), '[]');
  const all = JSON.parse((await paddock(url, ['ps', '--all', '--label', `job=${job}`, '--json'])).stdout.toString()) as SandboxInfo[];
  t.deepEqual(
    all.map((s) => [s.id, s.state]),
    [[info.id, 'stopped']],
  );
});

test('exec streams stdout and stderr apart and exits with the command’s code', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ labels: { test: 'cli-exec' } });
  const url = t.context.cluster.url;
  const r = await paddock(url, ['exec', sb.id, '--', 'sh', '-c', 'echo out; echo err >&2; exit 7']);
  t.is(r.code, 7);
  t.is(r.stdout.toString(), 'out\n');
  t.is(r.stderr, 'err\n');

  const opts = await paddock(url, ['exec', sb.id, '--cwd', '/tmp', '--env', 'GREETING=a=b', '--', 'sh', '-c', 'pwd; echo "$GREETING"']);
  t.is(opts.code, 0, opts.stderr);
  t.is(opts.stdout.toString(), '/tmp\na=b\n');

  const piped = await paddock(url, ['exec', sb.id, '--stdin', '--', 'cat'], ALL_BYTES);
  t.is(piped.code, 0, piped.stderr);
  t.deepEqual(new Uint8Array(piped.stdout), ALL_BYTES);

  const loud = await paddock(url, ['exec', sb.id, '--', 'yes']);
  t.not(loud.code, 0);
  t.is(loud.stdout.length, 1024 * 1024);
  t.regex(loud.stderr, /output passed its cap/);

  const slow = await paddock(url, ['exec', sb.id, '--timeout', '300', '--', 'sleep', '10']);
  t.not(slow.code, 0);
  t.regex(slow.stderr, /ran past 300 ms and was killed/);
});

test('exec output a slow reader has not taken yet is all written before the CLI exits', async (t) => {
  // Writes to a pipe are asynchronous: with the pipe full (64 KiB) and a few KiB more queued,
  // under the stream's high-water mark, the CLI goes on to the exit event, and exiting dropped
  // them. The reader (wc behind a real pipe) starts only once the command has ended. Three sizes
  // past the pipe's 64 KiB: which one lands a chunk under the mark depends on how output is cut.
  const sb = await t.context.pdk.sandboxes.create({ labels: { test: 'cli-slow-reader' } });
  const env: NodeJS.ProcessEnv = { ...process.env, NATS_URL: t.context.cluster.url, PADDOCK_HOME: join(tmpdir(), 'paddock-cli-test-nohome') };
  for (const bytes of [65_536 + 1000, 65_536 + 4096, 65_536 + 6000]) {
    const line = `"${process.execPath}" "${CLI}" exec ${sb.id} -- sh -c 'head -c ${bytes} /dev/zero; touch /tmp/written-${bytes}' | { read -r _ <&3; wc -c; }`;
    const child = spawn('sh', ['-c', line], { env, stdio: ['ignore', 'pipe', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout?.on('data', (d: Buffer) => {
      out += d.toString();
    });
    child.stderr?.on('data', (d: Buffer) => {
      err += d.toString();
    });
    const closed = new Promise<number | null>((resolve) => child.on('close', resolve));
    for (let i = 0; i < 600; i++) {
      if ((await sb.exec(['test', '-f', `/tmp/written-${bytes}`])).exitCode === 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    // The exit event reaches the CLI just after the command's last write.
    await new Promise((r) => setTimeout(r, 1000));
    (child.stdio[3] as NodeJS.WritableStream).end('go\n');
    t.is(await closed, 0, err);
    t.is(out.trim(), String(bytes));
  }
});

test('files put then get round-trips bytes, from a file and from stdin', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ labels: { test: 'cli-files' } });
  const url = t.context.cluster.url;
  const dir = await mkdtemp(join(tmpdir(), 'paddock-cli-files-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const src = join(dir, 'all.bin');
  await writeFile(src, ALL_BYTES);

  const put = await paddock(url, ['files', 'put', sb.id, src, '/work/in/all.bin']);
  t.is(put.code, 0, put.stderr);
  const get = await paddock(url, ['files', 'get', sb.id, '/work/in/all.bin']);
  t.is(get.code, 0, get.stderr);
  t.deepEqual(new Uint8Array(get.stdout), ALL_BYTES);

  const dest = join(dir, 'back.bin');
  const toFile = await paddock(url, ['files', 'get', sb.id, '/work/in/all.bin', dest]);
  t.is(toFile.code, 0, toFile.stderr);
  t.deepEqual(new Uint8Array(await readFile(dest)), ALL_BYTES);

  const big = randomBytes(3 * 1024 * 1024 + 17);
  const fromStdin = await paddock(url, ['files', 'put', sb.id, '-', '/work/big.bin'], big);
  t.is(fromStdin.code, 0, fromStdin.stderr);
  const bigBack = await paddock(url, ['files', 'get', sb.id, '/work/big.bin', '-']);
  t.true(bigBack.stdout.equals(big));

  const ls = await paddock(url, ['files', 'ls', sb.id, '/work/in']);
  t.is(ls.code, 0, ls.stderr);
  t.regex(ls.stdout.toString(), /^-rw\S+\s+256\s+\S+\s+all\.bin$/m);
  const missing = await paddock(url, ['files', 'get', sb.id, '/work/nope']);
  t.is(missing.code, 2);
  t.regex(missing.stderr, /^paddock: NOT_FOUND: /);
});

test('an unknown sandbox id is NOT_FOUND with exit code 2', async (t) => {
  const url = t.context.cluster.url;
  for (const args of [['info', 'sb-doesnotexist00000'], ['exec', 'sb-doesnotexist00000', '--', 'true'], ['rm', 'sb-doesnotexist00000'], ['info', 'not.a.token']]) {
    const r = await paddock(url, args);
    t.is(r.code, 2, args.join(' '));
    t.regex(r.stderr, /NOT_FOUND: sandbox .* does not exist/, args.join(' '));
    t.is(r.stdout.length, 0);
  }
});

test('a bad spec is the caller’s fault: INVALID_SPEC, exit code 2', async (t) => {
  const r = await paddock(t.context.cluster.url, ['create', '--memory', '1']);
  t.is(r.code, 2);
  t.regex(r.stderr, /^paddock: INVALID_SPEC: memoryMiB/);
});

test('an unknown command or flag prints the usage and exits 2', async (t) => {
  const cmd = await paddock(undefined, ['frobnicate']);
  t.is(cmd.code, 2);
  t.regex(cmd.stderr, /unknown command 'frobnicate'/);
  t.regex(cmd.stderr, /Usage: paddock/);
  const flag = await paddock(undefined, ['ps', '--frobnicate']);
  t.is(flag.code, 2);
  t.regex(flag.stderr, /unknown option --frobnicate/);
  t.regex(flag.stderr, /Usage: paddock/);
  const help = await paddock(undefined, ['--help']);
  t.is(help.code, 0);
  t.regex(help.stdout.toString(), /^Usage: paddock/);
});

test('no reachable NATS is the platform’s fault: UNAVAILABLE, exit code 1', async (t) => {
  const r = await paddock('nats://127.0.0.1:1', ['ps']);
  t.is(r.code, 1);
  t.regex(r.stderr, /^paddock: UNAVAILABLE: /);
});

test('files put of a local file that does not exist is the caller’s fault: exit 2', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ labels: { test: 'cli-put-missing' } });
  const r = await paddock(t.context.cluster.url, ['files', 'put', sb.id, '/nonexistent/solution.py', '/work/x']);
  t.is(r.code, 2);
  t.regex(r.stderr, /^paddock: files put: cannot read \/nonexistent\/solution\.py: ENOENT/);
});

// In the three below PADDOCK_HOME points elsewhere (paddock() sets it): only the node records can
// say where the running Paddock keeps things.
test('status finds the running Paddock through NATS: its nodes, homes and logs', async (t) => {
  const url = t.context.cluster.url;
  const node = t.context.cluster.nodes[0]!;
  const status = await paddock(url, ['status']);
  t.is(status.code, 0, status.stderr);
  const text = status.stdout.toString();
  t.regex(text, /^NATS: +127\.0\.0\.1:\d+ \(nats-server [\d.]+, JetStream\)$/m);
  t.regex(text, /^placement: +1 replica/m);
  t.regex(text, new RegExp(`^${node.id}\\s+serving\\s+\\d+\\s+[\\d.]+/[\\d.]+\\s+\\d+/\\d+Mi\\s+\\S*busybox\\S*\\s+${t.context.home}$`, 'm'));
  t.true(text.includes(`${t.context.home}/logs/`), 'where the logs are');
  const js = JSON.parse((await paddock(url, ['status', '--json'])).stdout.toString()) as { nodes: { node: string; home: string; store: string }[] };
  t.is(js.nodes[0]?.home, t.context.home);
});

test('logs finds a node’s log through its record', async (t) => {
  const url = t.context.cluster.url;
  const node = t.context.cluster.nodes[0]!;
  const logs = await paddock(url, ['logs', node.id, '-n', '50']);
  t.is(logs.code, 0, logs.stderr);
  t.regex(logs.stdout.toString(), /^\d\d:\d\d:\d\d\.\d{3} INFO +node ready/m);
  const raw = await paddock(url, ['logs', '--json', '-n', '1']);
  t.notThrows(() => JSON.parse(raw.stdout.toString()));
  const unknown = await paddock(url, ['logs', 'no-such-node']);
  t.is(unknown.code, 2);
  t.regex(unknown.stderr, /no log of node no-such-node/);
});

test('image ls lists the store the running nodes read, not $PADDOCK_HOME/images', async (t) => {
  const url = t.context.cluster.url;
  const images = await paddock(url, ['image', 'ls', '--json']);
  t.is(images.code, 0, images.stderr);
  const names = (JSON.parse(images.stdout.toString()) as { name: string }[]).map((i) => i.name);
  t.true(names.includes('busybox'), `the node's store, not $PADDOCK_HOME/images: ${names.join(' ')}`);
});

test('down does not stop nodes that no `paddock up` of this host started', async (t) => {
  const r = await paddock(t.context.cluster.url, ['down']);
  t.is(r.code, 1);
  t.regex(r.stderr, /no 'paddock up' of this host serves the live nodes/);
  // The node still serves.
  const node = t.context.cluster.nodes[0]!;
  t.is((await t.context.pdk.nodes.info(node.id, { timeoutMs: 30_000 })).node, node.id);
});

test('ps against a NATS that no Paddock serves says so: UNAVAILABLE, exit 1', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'paddock-cli-bare-'));
  const nats = await startNats({ dataDir: join(dir, 'nats') });
  t.teardown(async () => {
    await nats.stop();
    await rm(dir, { recursive: true, force: true });
  });
  const r = await paddock(nats.url, ['ps']);
  t.is(r.code, 1);
  t.regex(r.stderr, /^paddock: UNAVAILABLE: nothing answers \S+, and there is no sandbox directory .*is a Paddock node running\?$/m);
});

test('shell with stdin not a terminal runs the command without one: stdin piped in, stdout and stderr apart, its exit code', async (t) => {
  const url = t.context.cluster.url;
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const r = await paddock(url, ['shell', sb.id], new TextEncoder().encode('echo hi; echo oops >&2; [ -t 0 ] || echo no-tty; exit 3\n'));
  t.is(r.code, 3, r.stderr);
  t.is(r.stdout.toString(), 'hi\nno-tty\n');
  t.is(r.stderr, 'oops\n');
  const cat = await paddock(url, ['shell', sb.id, '--', 'cat'], ALL_BYTES);
  t.is(cat.code, 0, cat.stderr);
  t.deepEqual(new Uint8Array(cat.stdout), ALL_BYTES);
});

/**
 * Runs the CLI on a real pseudo-terminal of 100x30 (python3's pty), types `keys` into it once the
 * sandbox's prompt shows, and returns all it printed and its exit status.
 */
function onTerminal(natsUrl: string, args: string[], keys: string): Promise<Run> {
  const script = `
import fcntl, os, pty, struct, sys, termios, time, select
pid, fd = pty.fork()
if pid == 0:
    os.execvpe(sys.argv[1], sys.argv[1:], os.environ)
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', 30, 100, 0, 0))
os.kill(pid, 28)
out = b''
sent = False
deadline = time.time() + 60
while time.time() < deadline:
    r, _, _ = select.select([fd], [], [], 0.2)
    if r:
        try:
            d = os.read(fd, 65536)
        except OSError:
            break
        if not d:
            break
        out += d
    if not sent and (b'# ' in out or b'$ ' in out):
        os.write(fd, os.environ['KEYS'].encode())
        sent = True
_, status = os.waitpid(pid, 0)
sys.stdout.buffer.write(out)
sys.exit(os.waitstatus_to_exitcode(status))
`;
  const env: NodeJS.ProcessEnv = { ...process.env, PADDOCK_HOME: join(tmpdir(), 'paddock-cli-test-nohome'), NATS_URL: natsUrl, KEYS: keys };
  return new Promise((resolve, reject) => {
    const child = spawn('python3', ['-c', script, process.execPath, CLI, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout: Buffer.concat(out), stderr: Buffer.concat(err).toString() }));
  });
}

test('shell on a terminal: a pseudo-terminal of the same size inside, keys go through raw, exit code is the shell’s', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const r = await onTerminal(t.context.cluster.url, ['shell', sb.id], 'tty; stty size; exit 5\r');
  const text = r.stdout.toString();
  t.is(r.code, 5, `${text}\n${r.stderr}`);
  t.regex(text, /\/dev\/pts\/\d+/);
  t.regex(text, /^30 100\r?$/m);
});
