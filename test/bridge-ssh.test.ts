/**
 * The `ssh` provider against real OpenSSH servers. Each "host" is a network namespace this file
 * makes, joined to this one by a veth pair in a private /30 of its own, with an sshd (as root, its
 * own config, host key and authorized key, no password) and a private /root (a tmpfs in a mount
 * namespace of its own), so each host has its own ~/.paddock-bridge as separate machines would.
 * nats-server listens on the host side of the first veth; every namespace routes to it through its
 * own veth. Placement runs here; the machines' nodes run `sim` sandboxes.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { existsSync, openSync, closeSync } from 'node:fs';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { connect as tcpConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { TestFn } from 'ava';
import anyTest from 'ava';
import type { Provider } from '../bridge/provider.ts';
import { providerFromEnv, startBridge } from '../ops/bridge-main.ts';
import { nodeCommand } from '../ops/launch.ts';
import { createLogger } from '../ops/log.ts';
import { freePorts } from '../ops/nats.ts';
import { type PlacementProcess, startPlacement } from '../ops/placement-process.ts';
import { Paddock } from '../sdk/index.ts';
import { SHARED_IMAGES } from './helpers/paths.ts';
import { eventually } from './helpers/wait.ts';

const run = promisify(execFile);
const SSHD = '/usr/sbin/sshd';
const missing = [SSHD, '/usr/bin/ssh', '/usr/bin/ssh-keygen'].filter((f) => !existsSync(f));
if (process.getuid?.() !== 0) missing.push('root (network namespaces)');

interface SshHostUnderTest {
  name: string;
  ns: string;
  veth: string;
  /** The root namespace's end (a gateway for the namespace) and the host's own address. */
  gw: string;
  addr: string;
  sshd?: ChildProcess;
}

interface Ctx {
  tmp: string;
  hosts: SshHostUnderTest[];
  nats?: ChildProcess;
  natsUrl: string;
  placement?: PlacementProcess;
  pdk?: Paddock;
  env: NodeJS.ProcessEnv;
}

const ctxTest = anyTest as TestFn<Ctx>;
const test = missing.length > 0 ? ctxTest.skip : ctxTest.serial;
if (missing.length > 0) console.log(`bridge-ssh tests skipped: needs ${missing.join(', ')} (Debian's openssh-server: bash ops/setup.sh)`);

const TAG = `ssh${process.pid}`;

function ip4(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

/**
 * A /29 of 10.230.0.0/15 per test process (two /30s): two runs of this file at once never share
 * one, and nothing outside the namespaces made here uses it (checked before use).
 */
function block(): number {
  return ((10 << 24) | (230 << 16)) + (process.pid % 16384) * 8;
}

async function sh(cmd: string, args: string[]): Promise<string> {
  return (await run(cmd, args, { encoding: 'utf8' })).stdout;
}

function listening(addr: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = tcpConnect({ host: addr, port, timeout: 1000 });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
    s.once('timeout', () => {
      s.destroy();
      resolve(false);
    });
  });
}

async function stopProc(p: ChildProcess | undefined): Promise<void> {
  if (!p || p.exitCode !== null || p.signalCode !== null) return;
  const gone = new Promise((r) => p.once('exit', r));
  p.kill('SIGTERM');
  if (!(await Promise.race([gone.then(() => true), new Promise((r) => setTimeout(() => r(false), 5000))]))) {
    p.kill('SIGKILL');
    await gone;
  }
}

/** The command line of this checkout's node, for the host's sh to exec (its variables through `env`). */
function nodeCmdLine(): string {
  const { cmd, args, env } = nodeCommand({ dieWithParent: false });
  const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
  return ['env', ...Object.entries(env).map(([k, v]) => `${k}=${v}`), cmd, ...args].map(q).join(' ');
}

/** A path on host `h` (in its sshd's mount namespace, where its private /root is). */
function onHost(h: SshHostUnderTest, path: string): string {
  return `/proc/${h.sshd?.pid}/root${path}`;
}

/** Live processes of machine `id`'s node (same pid namespace: the hosts only have their own network and /root). */
async function nodeProcesses(id: string): Promise<number[]> {
  const out: number[] = [];
  for (const pid of (await readdir('/proc')).filter((n) => /^\d+$/.test(n))) {
    const env = await readFile(`/proc/${pid}/environ`, 'utf8').catch(() => '');
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
    if (env.split('\0').includes(`PADDOCK_NODE_ID=${id}`) && stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z') out.push(Number(pid));
  }
  return out;
}

async function waitUntil(what: string, f: () => Promise<boolean>, ms = 30_000): Promise<void> {
  if (!(await eventually(async () => (await f()) || undefined, ms))) throw new Error(`timed out waiting for ${what}`);
}

ctxTest.before(async (t) => {
  if (missing.length > 0) return;
  const tmp = await mkdtemp(join(tmpdir(), 'paddock-ssh-'));
  const base = block();
  const hosts: SshHostUnderTest[] = ['a', 'b'].map((name, i) => ({
    name,
    ns: `pdk-ssh-${process.pid}-${name}`,
    veth: `pks${process.pid}${name}`,
    gw: ip4(base + 4 * i + 1),
    addr: ip4(base + 4 * i + 2),
  }));
  Object.assign(t.context, { tmp, hosts, natsUrl: '', env: {} });
  const inUse = await sh('ip', ['-4', '-o', 'addr', 'show']);
  for (const h of hosts) for (const a of [h.gw, h.addr]) if (inUse.includes(` ${a}/`)) throw new Error(`${a} is in use on this machine: the test's /30s must be its own`);

  await sh('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'paddock-bridge-test', '-f', join(tmp, 'client')]);
  await writeFile(join(tmp, 'authorized_keys'), await readFile(join(tmp, 'client.pub')));
  const known: string[] = [];
  // sshd refuses to start without its privilege separation directory (systemd makes it on a host).
  await sh('mkdir', ['-p', '/run/sshd']);
  for (const h of hosts) {
    await sh('ip', ['netns', 'add', h.ns]);
    await sh('ip', ['link', 'add', h.veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', h.ns]);
    await sh('ip', ['addr', 'add', `${h.gw}/30`, 'dev', h.veth]);
    await sh('ip', ['link', 'set', h.veth, 'up']);
    await sh('ip', ['-n', h.ns, 'addr', 'add', `${h.addr}/30`, 'dev', 'eth0']);
    await sh('ip', ['-n', h.ns, 'link', 'set', 'eth0', 'up']);
    await sh('ip', ['-n', h.ns, 'link', 'set', 'lo', 'up']);
    // NATS listens on the first host's gateway: the others reach it through their own veth.
    await sh('ip', ['-n', h.ns, 'route', 'add', 'default', 'via', h.gw]);
    const key = join(tmp, `host-${h.name}`);
    await sh('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', `host-${h.name}`, '-f', key]);
    known.push(`${h.addr} ${(await readFile(`${key}.pub`, 'utf8')).trim()}`);
    const conf = join(tmp, `sshd-${h.name}.conf`);
    await writeFile(
      conf,
      [
        `ListenAddress ${h.addr}:22`,
        `HostKey ${key}`,
        `PidFile ${join(tmp, `sshd-${h.name}.pid`)}`,
        `AuthorizedKeysFile ${join(tmp, 'authorized_keys')}`,
        'AuthenticationMethods publickey',
        'PasswordAuthentication no',
        'KbdInteractiveAuthentication no',
        'PermitRootLogin prohibit-password',
        'UsePAM no',
        // The key lives in a temp dir under /tmp (world-writable), which StrictModes refuses.
        'StrictModes no',
        'AllowAgentForwarding no',
        'AllowTcpForwarding no',
        'X11Forwarding no',
        'PrintMotd no',
        'LogLevel VERBOSE',
        '',
      ].join('\n'),
    );
    const log = openSync(join(tmp, `sshd-${h.name}.log`), 'a');
    // setpriv: an sshd whose test worker was killed goes with it. nsenter, not `ip netns exec`:
    // that one mounts a fresh /sys, without the cgroup mounts a node needs. A private /root per
    // host: two hosts of one machine must not share ~/.paddock-bridge.
    h.sshd = spawn(
      'setpriv',
      ['--pdeathsig', 'TERM', '--', 'nsenter', `--net=/run/netns/${h.ns}`, '--', 'unshare', '--mount', '--propagation', 'private', '--', 'sh', '-c', 'mount -t tmpfs -o mode=700 paddock-ssh-root /root && exec "$@"', 'sh', SSHD, '-D', '-e', '-f', conf],
      { stdio: ['ignore', log, log] },
    );
    closeSync(log);
  }
  await writeFile(join(tmp, 'known_hosts'), `${known.join('\n')}\n`);

  const [port] = await freePorts(1);
  const first = hosts[0] as SshHostUnderTest;
  t.context.natsUrl = `nats://${first.gw}:${port}`;
  t.context.nats = spawn('setpriv', ['--pdeathsig', 'TERM', '--', 'nats-server', '-a', first.gw, '-p', String(port), '-js', '-sd', join(tmp, 'jetstream')], { stdio: 'ignore' });
  for (const h of hosts) await waitUntil(`sshd of ${h.name} to listen`, () => listening(h.addr, 22));
  await waitUntil('nats-server to listen', () => listening(first.gw, port as number));
  t.context.placement = await startPlacement({ natsUrl: t.context.natsUrl, log: createLogger('placement', 'warn') });
  t.context.pdk = await Paddock.connect({ servers: t.context.natsUrl, timeoutMs: 30_000 });
  t.context.env = {
    PADDOCK_BRIDGE_PROVIDER: 'ssh',
    PADDOCK_BRIDGE_SSH_HOSTS: hosts.map((h) => `root@${h.addr}`).join(','),
    PADDOCK_BRIDGE_SSH_KEY: join(tmp, 'client'),
    PADDOCK_BRIDGE_SSH_KNOWN_HOSTS: join(tmp, 'known_hosts'),
    PADDOCK_BRIDGE_SSH_NODE_CMD: nodeCmdLine(),
    PADDOCK_BRIDGE_NODE_ENV: JSON.stringify({ PADDOCK_BACKENDS: 'sim', PADDOCK_HEARTBEAT_MS: '500', PADDOCK_IMAGES_DIR: SHARED_IMAGES, PADDOCK_FN_BUILD: '0' }),
  };
});

ctxTest.after.always(async (t) => {
  const c = t.context;
  if (!c.hosts) return;
  // Whatever a failed test left running on the hosts goes back before their sshd does.
  if (c.env?.PADDOCK_BRIDGE_SSH_HOSTS) {
    const p = providerFromEnv(c.env, c.tmp);
    for (const m of await p.list({}).catch(() => [])) await p.release(m.id).catch(() => {});
  }
  await Promise.race([c.pdk?.close().catch(() => {}), new Promise((r) => setTimeout(r, 5000).unref())]);
  await c.placement?.stop().catch(() => {});
  await stopProc(c.nats);
  for (const h of c.hosts) {
    await stopProc(h.sshd);
    // Deleting the namespace deletes its end of the veth, and so the pair; the link delete is for
    // a run that failed between making the pair and moving nothing else.
    await sh('ip', ['netns', 'del', h.ns]).catch(() => {});
    await sh('ip', ['link', 'del', h.veth]).catch(() => {});
  }
  await rm(c.tmp, { recursive: true, force: true });
});

test('provision starts a node on a host of the pool that joins NATS and runs a sandbox; a restarted bridge adopts it; release stops it and removes its directory', async (t) => {
  const { pdk, env, hosts, natsUrl } = t.context as Ctx & { pdk: Paddock };
  const [a, b] = hosts as [SshHostUnderTest, SshHostUnderTest];
  const provider = providerFromEnv(env, t.context.tmp);
  const shape = { cpu: 2, memoryMiB: 2048, sandboxes: 8 };
  const tags = { 'paddock-bridge': TAG };
  const m1 = `${TAG}-m1`;
  const m2 = `${TAG}-m2`;

  const first = await provider.provision({ id: m1, shape, tags, natsUrl });
  t.regex(first.where, new RegExp(`^root@${a.addr} pid \\d+$`));
  // The first host is taken: the next machine goes to the second.
  const second = await provider.provision({ id: m2, shape, tags: { ...tags, extra: 'yes' }, natsUrl });
  t.regex(second.where, new RegExp(`^root@${b.addr} `));
  await waitUntil('both nodes to join', async () => {
    const ids = (await pdk.nodes.query({ state: 'serving' })).map((n) => n.node);
    return ids.includes(m1) && ids.includes(m2);
  });
  const sb = await pdk.sandboxes.create({ backend: 'sim' });
  t.true([m1, m2].includes(sb.info.node), 'the sandbox runs on a machine of the pool');
  await sb.kill();

  // The tag store: a file on the host, read back by list.
  const rec = JSON.parse(await readFile(onHost(a, `/root/.paddock-bridge/${m1}/machine.json`), 'utf8')) as { tags: Record<string, string> };
  t.deepEqual(rec.tags, tags);
  t.deepEqual((await provider.list(tags)).map((m) => [m.id, m.gone ?? false]).sort((x, y) => String(x[0]).localeCompare(String(y[0]))), [
    [m1, false],
    [m2, false],
  ]);
  t.deepEqual((await provider.list({ ...tags, extra: 'yes' })).map((m) => m.id), [m2]);
  t.deepEqual(await provider.list({ 'paddock-bridge': 'someone-else' }), []);
  await t.throwsAsync(provider.provision({ id: `${TAG}-m3`, shape, tags, natsUrl }), { message: /no host of the pool can take machine .*it runs machine/ });

  // A bridge restarted: a new provider instance, knowing nothing, lists the machines and adopts them.
  const fresh: Provider = providerFromEnv(env, t.context.tmp);
  const bridge = await startBridge({ natsUrl, provider: fresh, env: { PADDOCK_BRIDGE_TAG: TAG, PADDOCK_BRIDGE_IDLE_MS: '600000' }, log: createLogger('bridge', 'warn'), owner: 'restarted' });
  try {
    await waitUntil('the bridge to adopt both machines', async () => bridge.host.status().machines.map((m) => m.id).sort((x, y) => x.localeCompare(y)).join() === [m1, m2].join());
    t.true(bridge.host.status().decisions.some((d) => d.action === 'adopt'));
    const hostsSeen = (fresh.describe().hosts as { host: string; machines: string[] }[]).map((h) => [h.host, h.machines]);
    t.deepEqual(hostsSeen, [
      [`root@${a.addr}`, [m1]],
      [`root@${b.addr}`, [m2]],
    ]);
  } finally {
    await bridge.stop();
  }

  t.not((await nodeProcesses(m1)).length, 0);
  await fresh.release(m1);
  t.deepEqual(await nodeProcesses(m1), [], 'its node is stopped');
  t.false(existsSync(onHost(a, `/root/.paddock-bridge/${m1}`)), 'its directory is gone');
  await waitUntil('the node to leave', async () => !(await pdk.nodes.query({ state: 'serving' })).some((n) => n.node === m1));
  t.deepEqual((await fresh.list(tags)).map((m) => m.id), [m2]);
  await fresh.release(m1);
  await fresh.release(`${TAG}-never-started`);
  await fresh.release(m2);
  t.deepEqual(await nodeProcesses(m2), []);
  t.false(existsSync(onHost(b, `/root/.paddock-bridge/${m2}`)));
  t.deepEqual(await fresh.list({}), []);
});

test('an unreachable host: provision says so, list skips it, a release of what it cannot find is no error', async (t) => {
  const { env, hosts, natsUrl } = t.context;
  const [a, b] = hosts as [SshHostUnderTest, SshHostUnderTest];
  // Nothing listens on port 2222 of the first host: as good as a machine that is down, at once.
  const dead = `root@${a.addr}:2222`;
  const only = providerFromEnv({ ...env, PADDOCK_BRIDGE_SSH_HOSTS: dead }, t.context.tmp);
  const err = await t.throwsAsync(only.provision({ id: `${TAG}-u1`, shape: { cpu: 1, memoryMiB: 512, sandboxes: 1 }, tags: { 'paddock-bridge': TAG }, natsUrl }));
  t.regex(err?.message ?? '', new RegExp(`no host of the pool can take machine ${TAG}-u1: root@${a.addr.replace(/\./g, '\\.')}:2222: unreachable: .*Connection refused`));
  await only.release(`${TAG}-u1`);

  const mixed = providerFromEnv({ ...env, PADDOCK_BRIDGE_SSH_HOSTS: `${dead},root@${b.addr}` }, t.context.tmp);
  const m = `${TAG}-u2`;
  const started = await mixed.provision({ id: m, shape: { cpu: 1, memoryMiB: 512, sandboxes: 1 }, tags: { 'paddock-bridge': TAG }, natsUrl });
  t.regex(started.where, new RegExp(`^root@${b.addr} `), 'the reachable host takes it');
  t.deepEqual((await mixed.list({ 'paddock-bridge': TAG })).map((x) => x.id), [m]);
  const pool = mixed.describe().hosts as { host: string; unreachable?: string }[];
  t.regex(pool[0]?.unreachable ?? '', /Connection refused/);
  t.is(pool[1]?.unreachable, undefined);
  await mixed.release(m);
  t.deepEqual(await mixed.list({}), []);
});
