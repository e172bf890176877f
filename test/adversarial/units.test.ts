/** The hardening's pure parts, alone: seccomp profile, OCI config, policies, DNS packets, verdicts. */
import test from 'ava';
import { domainAllowed, ProtocolError, parsePolicy, validateNetworkPolicy, validateSpec } from '../../protocol/index.ts';
import { verdictOf } from '../../runtime/backend.ts';
import { ociConfig } from '../../runtime/container/oci.ts';
import { DENIED_IOCTLS, seccompProfile } from '../../runtime/container/seccomp.ts';
import { counter } from '../../runtime/container/verdict.ts';
import { SANDBOX_IDS } from '../../runtime/ids.ts';
import { answersOf, errorReply, parseQuery } from '../../runtime/network/dns.ts';
import { linkAddresses, policyRules } from '../../runtime/network/egress.ts';

interface Rule {
  names: string[];
  action: string;
  errnoRet?: number;
  args?: Array<{ index: number; value: number; valueTwo?: number; op: string }>;
}

test('seccomp: denied calls fail with EPERM, namespace flags and SWAPEXT-like ioctls by argument', (t) => {
  const p = seccompProfile('x64') as { defaultAction: string; architectures: string[]; syscalls: Rule[] };
  t.is(p.defaultAction, 'SCMP_ACT_ALLOW');
  t.true(p.architectures.includes('SCMP_ARCH_X86'), '32-bit calls are filtered too');
  const denied = p.syscalls.filter((r) => !r.args).flatMap((r) => r.names);
  for (const n of ['mount', 'bpf', 'perf_event_open', 'kexec_load', 'init_module', 'finit_module', 'delete_module', 'keyctl', 'add_key', 'request_key', 'userfaultfd', 'ptrace', 'setns', 'open_by_handle_at']) t.true(denied.includes(n), n);
  const ioctls = p.syscalls.filter((r) => r.names.includes('ioctl'));
  const swapext = ('X'.charCodeAt(0) << 8) | 109;
  t.true(ioctls.some((r) => r.args?.[0]?.valueTwo === swapext && r.args[0].value === 0xffff && r.args[0].op === 'SCMP_CMP_MASKED_EQ'));
  t.is(ioctls.length, Object.keys(DENIED_IOCTLS).length);
  const unshare = p.syscalls.filter((r) => r.names.includes('unshare'));
  t.true(unshare.some((r) => r.args?.[0]?.value === 0x10000000), 'CLONE_NEWUSER');
  t.true(p.syscalls.some((r) => r.names.includes('clone3') && r.errnoRet === 38));
});

test('oci: a user namespace maps root to the unprivileged range; seccomp, pinning and lxcfs go in', (t) => {
  const spec = validateSpec({ cpu: 2, memoryMiB: 64 });
  const image = { name: 'busybox', layers: [], env: [], cwd: '/', user: { uid: 0, gid: 0 }, init: ['/bin/sleep', 'infinity'] };
  const c = ociConfig({ spec, image, rootfs: '/r', cgroupsPath: '/p', cgroupMode: 'v1', cpus: '0,1', lxcfs: '/l' }) as {
    process: { args: string[] };
    mounts: Array<{ destination: string; source: string }>;
    linux: { namespaces: { type: string }[]; uidMappings: unknown[]; gidMappings: unknown[]; seccomp: unknown; resources: { cpu: { cpus?: string } } };
  };
  t.true(c.linux.namespaces.some((n) => n.type === 'user'));
  t.deepEqual(c.linux.uidMappings, [{ containerID: 0, hostID: SANDBOX_IDS.hostId, size: 65536 }]);
  t.deepEqual(c.linux.gidMappings, c.linux.uidMappings);
  t.truthy(c.linux.seccomp);
  t.is(c.linux.resources.cpu.cpus, '0,1');
  t.is(c.mounts.find((m) => m.destination === '/proc/meminfo')?.source, '/l/proc/meminfo');
  t.deepEqual(c.process.args.slice(-2), ['/bin/sleep', 'infinity']);
  t.true(SANDBOX_IDS.hostId > 65536 * 16);
});

test('network policies: CIDR:port parsing, domains, and the errors a caller sees', (t) => {
  const p = parsePolicy({ allow: ['10.1.2.3/8:443', '1.2.3.4', '5.6.7.0/24:1000-2000'], domains: ['PyPI.org.', '*.example.com'] });
  t.deepEqual(
    p.allow.map((a) => [a.net >>> 24, a.prefix, a.portLo, a.portHi]),
    [
      [10, 8, 443, 443],
      [1, 32, 0, 65535],
      [5, 24, 1000, 2000],
    ],
  );
  t.deepEqual(p.ports, [80, 443]);
  t.true(domainAllowed(p, 'pypi.org'));
  t.true(domainAllowed(p, 'files.example.com.'));
  t.false(domainAllowed(p, 'example.com'));
  t.false(domainAllowed(p, 'pypi.org.evil.net'));
  t.false(domainAllowed(p, 'notexample.com'));
  for (const bad of [{ allow: ['300.1.1.1'] }, { allow: ['1.1.1.1/33'] }, { allow: ['1.1.1.1:0'] }, { allow: ['1.1.1.1:9-8'] }, { domains: ['-bad.com'] }, { ports: [70000] }, { extra: 1 }, 'all']) {
    const e = t.throws(() => validateNetworkPolicy(bad, 'INVALID_REQUEST'), { instanceOf: ProtocolError });
    t.is(e?.code, 'INVALID_REQUEST', JSON.stringify(bad));
  }
  t.is(t.throws(() => validateSpec({ network: { allow: ['nope'] } }), { instanceOf: ProtocolError })?.code, 'INVALID_SPEC');
});

test('egress rules: each sandbox gets its own /30, its allow-list, then reject', (t) => {
  t.deepEqual(linkAddresses(0), { gw: '100.72.0.1', addr: '100.72.0.2' });
  t.deepEqual(linkAddresses(16383), { gw: '100.72.255.253', addr: '100.72.255.254' });
  const rules = policyRules('pdk_n', 7, '100.72.0.29', parsePolicy({ allow: ['198.18.0.0/24:443'] }));
  t.true(rules.some((r) => r.includes('ip daddr 198.18.0.0/24 meta l4proto { tcp, udp } th dport 443 accept')));
  t.regex(rules.at(-3) as string, /reject/);
  t.regex(rules.at(-2) as string, /ip daddr 100\.72\.0\.29 .* th dport 53 accept/);
  t.regex(rules.at(-1) as string, /reject/);
});

test('dns: queries parse, refusals echo the question, A records are read through compression', (t) => {
  const q = Buffer.from([0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 3, ...Buffer.from('pkg'), 4, ...Buffer.from('test'), 0, 0, 1, 0, 1]);
  const parsed = parseQuery(q);
  t.deepEqual(parsed && { id: parsed.id, name: parsed.name, type: parsed.type }, { id: 0x1234, name: 'pkg.test', type: 1 });
  const refused = errorReply(q, parsed as NonNullable<typeof parsed>, 5);
  t.is(refused[3], 0x80 | 5);
  t.is(refused.readUInt16BE(6), 0);
  const answer = Buffer.concat([q, Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 198, 18, 0, 2])]);
  answer.writeUInt16BE(1, 6);
  t.deepEqual(answersOf(answer), [{ addr: '198.18.0.2', ttl: 30 }]);
  t.is(parseQuery(Buffer.from([1, 2, 3])), null);
  // A pointer loop is not followed forever.
  t.is(parseQuery(Buffer.from([0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1])), null);
});

test('verdicts: cgroup counters say which limit ended an exec', (t) => {
  t.is(counter('max 3\n', 'max'), 3);
  t.is(counter('oom_kill_disable 0\nunder_oom 0\noom_kill 2\n', 'oom_kill'), 2);
  const base = { exitCode: 1, timedOut: false, truncated: false };
  const z = { pidsMax: 0, oomKills: 0 };
  t.is(verdictOf(base, z, { pidsMax: 0, oomKills: 1 }, false), 'MEMORY_LIMIT');
  t.is(verdictOf({ ...base, timedOut: true }, z, { pidsMax: 1, oomKills: 0 }, false), 'PIDS_LIMIT');
  t.is(verdictOf(base, z, z, true), 'DISK_LIMIT');
  t.is(verdictOf({ ...base, exitCode: 0 }, z, z, true), 'OK');
  t.is(verdictOf({ ...base, timedOut: true }, z, z, false), 'TIMEOUT');
  t.is(verdictOf({ ...base, truncated: true }, z, z, false), 'OUTPUT_LIMIT');
});
