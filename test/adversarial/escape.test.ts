/** Attempts to reach past the sandbox: kernel interfaces, host files, Paddock itself, later sandboxes. */
import { execFile } from 'node:child_process';
import { readFile, rm, statfs, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { ExecutionContext } from 'ava';
import type { CreateSpec, Sandbox } from '../../sdk/index.ts';
import { nodeRunPath } from '../helpers/cluster.ts';
import { type AdvContext, advTest, only, probeBinary, sustained, underAttack } from './harness.ts';

const test = advTest();
const run = promisify(execFile);

/**
 * Sandboxes of `specs`, each with the probe at /usr/local/bin/probe, and the probe on the host
 * too (`host`), to hold a kernel counter from one and try it from the others; all gone after.
 */
async function probing<const S extends readonly CreateSpec[]>(t: ExecutionContext<AdvContext>, specs: S): Promise<{ sbs: { [K in keyof S]: Sandbox }; host: string }> {
  const sbs: Sandbox[] = [];
  t.teardown(async () => {
    for (const sb of sbs) await sb.kill();
  });
  for (const spec of specs) sbs.push(await t.context.pdk.sandboxes.create(spec));
  const probe = await probeBinary();
  for (const sb of sbs) await sb.files.write('/usr/local/bin/probe', probe, { mode: 0o755 });
  const host = join(tmpdir(), `paddock-probe-host-${process.pid}`);
  await writeFile(host, probe, { mode: 0o755 });
  t.teardown(() => rm(host, { force: true }));
  return { sbs: sbs as unknown as { [K in keyof S]: Sandbox }, host };
}

test.serial('mount, unshare, ptrace, module load, bpf, keyrings, raw sockets and the SWAPEXT ioctl are all refused', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  await sb.files.write('/usr/local/bin/probe', await probeBinary(), { mode: 0o755 });
  const results = new Map<string, string>();
  await underAttack(t, 'mount/unshare/ptrace/modules/bpf/keyctl/raw sockets/SWAPEXT', 'DENIED', async () => {
    const end = Date.now() + 1500;
    do {
      const r = await sb.exec(['/usr/local/bin/probe'], { timeoutMs: 10_000 });
      for (const line of r.stdout.trim().split('\n')) {
        const [name, res] = line.split(' ');
        if (name && res) results.set(name, res);
      }
    } while (Date.now() < end);
    const allowed = [...results].filter(([, r]) => r === 'OK').map(([n]) => n);
    return allowed.length === 0 && results.size > 0 ? 'DENIED' : `ALLOWED ${allowed.join(' ')}`;
  });
  t.log(Object.fromEntries(results));
  t.is(results.size, 28);
  for (const name of ['mount', 'unshare_user', 'setns', 'ptrace_attach', 'init_module', 'bpf', 'keyctl', 'userfaultfd', 'ioctl_swapext', 'ioctl_swapext_high', 'ioctl_shutdown']) {
    t.is(results.get(name), 'EPERM', name);
  }
  t.is(results.get('clone3'), 'ENOSYS');
});

test.serial('kpage* and other masked /proc files read as empty, and a recursive grep from / ends with the node intact', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  const sizes = await sb.exec(['sh', '-c', 'for f in /proc/kpagecgroup /proc/kpageflags /proc/kpagecount /proc/kcore /proc/sysrq-trigger /proc/kallsyms; do echo "$f $(head -c 4096 $f 2>/dev/null | wc -c)"; done']);
  for (const line of sizes.stdout.trim().split('\n')) t.regex(line, / 0$/, line);
  t.not((await sb.exec(['sh', '-c', 'echo b > /proc/sysrq-trigger'])).exitCode, 0);
  t.not((await sb.exec(['sh', '-c', 'echo 1 > /proc/sys/vm/drop_caches'])).exitCode, 0);
  await underAttack(t, 'recursive grep from /', 'OK', async () =>
    only(await sustained(1500, async () => (await sb.exec(['sh', '-c', 'grep -r -s -I -D skip paddock-grep-needle / >/dev/null; true'], { timeoutMs: 60_000, maxOutputBytes: 64 * 1024 })).verdict)),
  );
});

test.serial('overwriting /bin/sh changes only this sandbox: a fresh one of the same image has the original', async (t) => {
  const { pdk } = t.context;
  const a = await pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => a.kill());
  const before = (await a.exec(['sha256sum', '/bin/busybox'])).stdout.split(' ')[0];
  await underAttack(t, 'overwrite /bin/sh, then a fresh sandbox', 'ISOLATED', async () => {
    await sustained(1500, async () => {
      await a.exec(['/bin/busybox', 'sh', '-c', 'rm -f /bin/sh; printf "#!/bin/busybox ash\\necho pwned\\n" > /bin/sh; chmod 755 /bin/sh']);
      return '';
    });
    t.is((await a.exec(['/bin/sh', '-c', 'echo hi'])).stdout, 'pwned\n');
    const b = await pdk.sandboxes.create({ cpu: 1 });
    try {
      const r = await b.exec(['sh', '-c', 'echo clean; sha256sum /bin/busybox']);
      return r.stdout.startsWith('clean\n') && r.stdout.includes(before as string) ? 'ISOLATED' : `LEAKED ${r.stdout}`;
    } finally {
      await b.kill();
    }
  });
});

test.serial('host files stay out of reach through /proc/1/root, mountinfo and the files API', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  const hostHostname = (await readFile('/etc/hostname', 'utf8').catch(() => '')).trim();
  const once = async () => {
    // /proc/1/root is the sandbox's own `/`, or (pid 1 not dumpable) not open to the sandbox at all.
    const root = await sb.exec(['sh', '-c', 'cat /proc/1/root/etc/hostname 2>/dev/null || echo sandbox; ls /proc/1/root/ 2>/dev/null']);
    // Host paths the overlay's options name in mountinfo do not exist inside.
    const paths = await sb.exec(['sh', '-c', "grep -o 'lowerdir=[^,]*' /proc/self/mountinfo | head -1 | cut -d= -f2 | tr ':' '\\n' | while read p; do ls -d \"$p\" 2>/dev/null; done; true"]);
    const viaApi = await sb.files.readText('/proc/1/root/etc/hostname').catch((e: { code?: string }) => e.code ?? 'error');
    const ok = root.stdout.startsWith('sandbox\n') && paths.stdout.trim() === '' && viaApi !== hostHostname;
    return ok ? 'CONTAINED' : `REACHED ${root.stdout} ${paths.stdout} ${viaApi}`;
  };
  await underAttack(t, 'host files via /proc/1/root and mountinfo', 'CONTAINED', async () => only(await sustained(1500, once)));
});

test.serial('nothing of Paddock inside: no socket, log, config, credential or environment', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  const r = await sb.exec(['sh', '-c', "find / -xdev \\( -type s -o -iname '*paddock*' -o -iname '*nats*' -o -iname '*.creds' \\) 2>/dev/null; cat /proc/1/environ | tr '\\0' '\\n'; env"]);
  t.notRegex(r.stdout, /paddock|nats|PADDOCK|NATS|\.creds/i);
  const socks = await sb.exec(['sh', '-c', 'cat /proc/net/unix | wc -l; find /run /var/run -mindepth 1 2>/dev/null | wc -l']);
  t.deepEqual(socks.stdout.trim().split('\n'), ['1', '0']);
});

test.serial('socket families past unix, inet, inet6 and netlink route (vsock, alg, packet, netlink audit, …) are refused: DENIED', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  await sb.files.write('/usr/local/bin/probe', await probeBinary(), { mode: 0o755 });
  const results = new Map<string, string>();
  const allowed = ['socket_unix', 'socket_inet', 'socket_inet6', 'socket_netlink_route', 'socketpair_unix'];
  await underAttack(t, 'socket(AF_VSOCK, AF_ALG, AF_PACKET, netlink audit, …)', 'DENIED', async () =>
    only(
      await sustained(1500, async () => {
        const r = await sb.exec(['/usr/local/bin/probe', 'sockets'], { timeoutMs: 10_000 });
        for (const line of r.stdout.trim().split('\n')) {
          const [name, res] = line.split(' ');
          if (name && res) results.set(name, res);
        }
        const opened = [...results].filter(([n, res]) => !allowed.includes(n) && res === 'OK').map(([n]) => n);
        return opened.length === 0 ? 'DENIED' : `ALLOWED ${opened.join(' ')}`;
      }),
    ),
  );
  t.log(Object.fromEntries(results));
  for (const name of allowed) t.is(results.get(name), 'OK', name);
  for (const name of ['socket_vsock', 'socket_alg', 'socket_packet', 'socket_netlink_audit', 'socket_netlink_kobject_uevent', 'socket_netlink_netfilter', 'socket_key', 'socket_family_200']) {
    t.is(results.get(name), 'EPERM', name);
  }
});

test.serial("the init's stdio is no node file: writing /proc/1/fd/2 fills nothing of the node's run tmpfs: CONTAINED", async (t) => {
  const { pdk, cluster, home } = t.context;
  const sb = await pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  const node = cluster.nodes[0] as { id: string; proc: { pid?: number } };
  const run = nodeRunPath(home, node);
  const before = await statfs(run);
  let lowest = before.bavail;
  await underAttack(t, 'dd of=/proc/1/fd/2 (the init stderr)', 'CONTAINED', async () =>
    only(
      await sustained(1500, async () => {
        const r = await sb.exec(['sh', '-c', 'dd if=/dev/zero of=/proc/1/fd/2 bs=1M count=16 2>&1; ls -l /proc/1/fd/ 2>&1'], { timeoutMs: 30_000 });
        lowest = Math.min(lowest, (await statfs(run)).bavail);
        const grew = (before.bavail - lowest) * before.bsize;
        return grew < 8 * 1024 * 1024 && !r.stdout.includes(home) ? 'CONTAINED' : `REACHED ${grew} bytes: ${r.stdout.slice(0, 200)}`;
      }),
    ),
  );
});

test.serial('no host path inside: /proc/1/exe, /proc/1/fd and mountinfo name no node directory, node id or sandbox id: HIDDEN', async (t) => {
  const { pdk, cluster, home } = t.context;
  const sb = await pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  const nodeId = cluster.nodes[0]?.id as string;
  const secrets = [home, nodeId, sb.id, '/var/cache/paddock', 'paddock'];
  await underAttack(t, 'host paths via /proc/1/exe, /proc/1/fd, mountinfo', 'HIDDEN', async () =>
    only(
      await sustained(1500, async () => {
        const r = await sb.exec(['sh', '-c', 'readlink /proc/1/exe /proc/1/fd/0 /proc/1/fd/1 /proc/1/fd/2 /proc/self/exe; cat /proc/self/mountinfo /proc/1/mountinfo; cat /proc/1/maps; ls -l /proc/1/fd /proc/self/fd; true'], { timeoutMs: 10_000 });
        const text = `${r.stdout}\n${r.stderr}`;
        const leaked = secrets.filter((x) => text.includes(x));
        return leaked.length === 0 ? 'HIDDEN' : `LEAKED ${leaked.join(' ')}: ${text.slice(0, 600)}`;
      }),
    ),
  );
});

test.serial('pid 1 cannot be killed from inside: its oom_score_adj and /proc/1/mem are closed, a memory hog is the OOM victim: MEMORY_LIMIT', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1, memoryMiB: 64 });
  t.teardown(() => sb.kill());
  const tries = await sb.exec(['sh', '-c', 'echo 1000 > /proc/1/oom_score_adj && echo adj-written; dd if=/dev/zero of=/proc/1/mem bs=1 count=1 seek=4194304 2>/dev/null && echo mem-written; cat /proc/self/oom_score_adj']);
  t.notRegex(tries.stdout, /adj-written|mem-written/);
  t.is(tries.stdout.trim(), '500');
  const hog = `awk 'BEGIN { s = "x"; while (1) s = s s }'`;
  await underAttack(t, 'oom_score_adj on pid 1, then a memory hog', 'MEMORY_LIMIT', async () =>
    only(
      await sustained(1500, async () => {
        await sb.exec(['sh', '-c', 'echo 1000 > /proc/1/oom_score_adj'], { timeoutMs: 10_000 });
        return (await sb.exec(['sh', '-c', hog], { timeoutMs: 30_000 })).verdict;
      }),
    ),
  );
  t.is((await sb.exec(['echo', 'ok'])).stdout, 'ok\n');
  t.is((await sb.refresh()).state, 'running');
});

test.serial('a sandbox whose init dies ends failed with reason crashed, at once: CRASHED', async (t) => {
  const { pdk, cluster } = t.context;
  const sb = await pdk.sandboxes.create({ cpu: 1 });
  const nodeId = cluster.nodes[0]?.id as string;
  await underAttack(t, 'the init killed (as by an OOM kill)', 'CRASHED', async () => {
    // From the host, as the OOM killer would: every process of the sandbox's cgroup.
    const procs = await readFile(`/sys/fs/cgroup/pids/paddock/${nodeId}/${sb.id}/cgroup.procs`, 'utf8');
    for (const pid of procs.split('\n').filter(Boolean)) process.kill(Number(pid), 'SIGKILL');
    for (let i = 0; i < 100; i++) {
      const info = await sb.refresh();
      if (info.state === 'failed') return info.reason === 'crashed' ? 'CRASHED' : `failed ${info.reason}`;
      await new Promise((r) => setTimeout(r, 100));
    }
    const r = await sb.exec(['echo', 'ok']).catch((e: { code?: string }) => e.code ?? 'error');
    return `still ${sb.info.state}; exec: ${typeof r === 'string' ? r : `${r.exitCode} ${r.verdict}`}`;
  });
  const e = await sb.exec(['echo', 'ok']).catch((err: { code?: string }) => err);
  t.is((e as { code?: string }).code, 'NOT_FOUND');
});

test.serial('a sandbox holding every inotify instance it may leaves host root and another sandbox theirs: ISOLATED', async (t) => {
  const { sbs: [a, b], host } = await probing(t, [{ cpu: 1 }, { cpu: 1 }]);
  let seen = '';
  await underAttack(t, 'inotify instances held by one sandbox', 'ISOLATED', async () => {
    const holding = a.exec(['/usr/local/bin/probe', 'inotify', '100000', '4'], { timeoutMs: 30_000 });
    await new Promise((r) => setTimeout(r, 1500));
    // Nearly all root may have (128 by default): the sandbox's 64 charged to root too would not leave that.
    const rootMay = Math.min(200, Number((await readFile('/proc/sys/fs/inotify/max_user_instances', 'utf8')).trim()) - 16);
    const fromHost = (await run(host, ['inotify', String(rootMay), '0'])).stdout.trim();
    const fromOther = (await b.exec(['/usr/local/bin/probe', 'inotify', '32', '0'])).stdout.trim();
    const held = (await holding).stdout.trim();
    seen = `${held} | host ${fromHost} | other ${fromOther}`;
    const n = Number(held.split(' ')[1]);
    return n <= 64 && fromHost === `inotify ${rootMay} none` && fromOther === 'inotify 32 none' ? 'ISOLATED' : `SHARED ${seen}`;
  });
  t.log(seen);
});

test.serial("a sandbox holding 1 MiB pipes leaves another sandbox its pipes (no F_SETPIPE_SZ EPERM): ISOLATED", async (t) => {
  const { sbs: [a, b] } = await probing(t, [{ cpu: 1, memoryMiB: 512 }, { cpu: 1 }]);
  let seen = '';
  await underAttack(t, 'pipe buffers held by one sandbox', 'ISOLATED', async () => {
    // 400 pipes of 1 MiB: 100,000 pages promised, past the host's per-user soft limit of 16,384.
    const holding = a.exec(['/usr/local/bin/probe', 'pipes', '400', '4'], { timeoutMs: 30_000 });
    await new Promise((r) => setTimeout(r, 1500));
    const fromOther = (await b.exec(['/usr/local/bin/probe', 'pipes', '32', '0'])).stdout.trim();
    const held = (await holding).stdout.trim();
    seen = `${held} | other ${fromOther}`;
    return fromOther === 'pipes 32 none' ? 'ISOLATED' : `SHARED ${seen}`;
  });
  t.log(seen);
});

test.serial('root in each sandbox is a host user of its own: two sandboxes map to two ranges, neither the first', async (t) => {
  const { pdk } = t.context;
  const a = await pdk.sandboxes.create({ cpu: 1 });
  const b = await pdk.sandboxes.create({ cpu: 1 });
  t.teardown(async () => {
    await a.kill();
    await b.kill();
  });
  const map = async (sb: typeof a) => (await sb.exec(['cat', '/proc/self/uid_map'])).stdout.trim().split(/\s+/).map(Number);
  const [ma, mb] = [await map(a), await map(b)];
  t.is(ma[0], 0);
  t.is(ma[2], 65536);
  t.not(ma[1], mb[1]);
  t.true(Math.abs((ma[1] as number) - (mb[1] as number)) >= 65536, `${ma} / ${mb}`);
  // Files of the image are still root's inside, and what root writes stays root's.
  t.is((await a.exec(['sh', '-c', 'stat -c %u /bin/busybox && touch /tmp/x && stat -c %u /tmp/x'])).stdout, '0\n0\n');
});

test.serial('a sandbox holding inotify and epoll watches leaves host root and another sandbox theirs, under host limits it alone could nearly exhaust: ISOLATED', async (t) => {
  const { sbs: [a, b], host } = await probing(t, [{ cpu: 1 }, { cpu: 1 }]);
  // Host-wide per-user limits low enough that one sandbox's share, charged to the same user as
  // another's (or to root), would leave that one too little: 24,000 inotify watches and 120,000
  // epoll watches, for the few seconds of the case (the node reads neither at run time).
  const limits: Record<string, string> = { '/proc/sys/fs/inotify/max_user_watches': '24000', '/proc/sys/fs/epoll/max_user_watches': '120000' };
  const before: Record<string, string> = {};
  for (const [f, v] of Object.entries(limits)) {
    before[f] = (await readFile(f, 'utf8')).trim();
    await writeFile(f, v);
  }
  t.teardown(async () => {
    for (const [f, v] of Object.entries(before)) await writeFile(f, v);
  });
  let seen = '';
  await underAttack(t, 'inotify and epoll watches held by one sandbox', 'ISOLATED', async () => {
    const watching = a.exec(['/usr/local/bin/probe', 'watches', '100000', '5'], { timeoutMs: 30_000 });
    const polling = a.exec(['/usr/local/bin/probe', 'epoll', '100000', '5'], { timeoutMs: 30_000 });
    await new Promise((r) => setTimeout(r, 2000));
    const hostWatches = (await run(host, ['watches', '12000', '0'])).stdout.trim();
    const otherWatches = (await b.exec(['/usr/local/bin/probe', 'watches', '12000', '0'])).stdout.trim();
    const otherEpoll = (await b.exec(['/usr/local/bin/probe', 'epoll', '60000', '0'])).stdout.trim();
    const held = `${(await watching).stdout.trim()}, ${(await polling).stdout.trim()}`;
    seen = `${held} | host ${hostWatches} | other ${otherWatches}, ${otherEpoll}`;
    const ok = /^watches 16384 ENOSPC, epoll 100000 none$/.test(held) && hostWatches === 'watches 12000 none' && otherWatches === 'watches 12000 none' && otherEpoll === 'epoll 60000 none';
    return ok ? 'ISOLATED' : `SHARED ${seen}`;
  });
  t.log(seen);
});

test.serial('a sandbox holding every fd it may in flight over unix sockets leaves another sandbox its own: ISOLATED', async (t) => {
  const { sbs: [a, b] } = await probing(t, [{ cpu: 1 }, { cpu: 1 }]);
  let seen = '';
  await underAttack(t, 'SCM_RIGHTS fds in flight held by one sandbox', 'ISOLATED', async () => {
    // The kernel counts them per host user, against the sender's RLIMIT_NOFILE (1,024 in a sandbox).
    const holding = a.exec(['/usr/local/bin/probe', 'scmfds', '100000', '4'], { timeoutMs: 30_000 });
    await new Promise((r) => setTimeout(r, 1500));
    const fromOther = (await b.exec(['/usr/local/bin/probe', 'scmfds', '250', '0'])).stdout.trim();
    const held = (await holding).stdout.trim();
    seen = `${held} | other ${fromOther}`;
    return /^scmfds \d+ ETOOMANYREFS$/.test(held) && fromOther === 'scmfds 250 none' ? 'ISOLATED' : `SHARED ${seen}`;
  });
  t.log(seen);
});

test.serial('a sandbox holding every message-queue byte it may leaves host root and another sandbox theirs: ISOLATED', async (t) => {
  const { sbs: [a, b], host } = await probing(t, [{ cpu: 1 }, { cpu: 1 }]);
  let seen = '';
  await underAttack(t, 'message-queue bytes held by one sandbox', 'ISOLATED', async () => {
    const holding = a.exec(['/usr/local/bin/probe', 'mqueue', '10000000', '4'], { timeoutMs: 30_000 });
    await new Promise((r) => setTimeout(r, 1500));
    // Host root with the sandbox's own limit: had the sandbox's bytes been charged to root as well
    // (its user namespace's owner), root's first queues would not fit.
    const fromHost = (await run('prlimit', ['--msgqueue=65536', host, 'mqueue', '40000', '0'])).stdout.trim();
    const fromOther = (await b.exec(['/usr/local/bin/probe', 'mqueue', '40000', '0'])).stdout.trim();
    const held = (await holding).stdout.trim();
    seen = `${held} | host ${fromHost} | other ${fromOther}`;
    return /^mqueue \d+ EMFILE$/.test(held) && fromHost === 'mqueue 5 none' && fromOther === 'mqueue 5 none' ? 'ISOLATED' : `SHARED ${seen}`;
  });
  t.log(seen);
});

test.serial('a sandbox queueing every RT signal it may leaves host root its own: ISOLATED', async (t) => {
  const { sbs: [sb], host } = await probing(t, [{ cpu: 1 }]);
  let seen = '';
  await underAttack(t, 'RT signals queued by one sandbox', 'ISOLATED', async () => {
    const holding = sb.exec(['/usr/local/bin/probe', 'sigqueue', '1000000', '4'], { timeoutMs: 30_000 });
    await new Promise((r) => setTimeout(r, 1500));
    // With a limit of 2,100 of its own (root's other processes may hold a few): the sandbox's 1,024
    // charged to root too would leave it ~1,000.
    const fromHost = (await run('prlimit', ['--sigpending=2100', host, 'sigqueue', '2000', '0'])).stdout.trim();
    const held = (await holding).stdout.trim();
    seen = `${held} | host ${fromHost}`;
    return Number(held.split(' ')[1]) <= 1024 && fromHost === 'sigqueue 2000 none' ? 'ISOLATED' : `SHARED ${seen}`;
  });
  t.log(seen);
});
