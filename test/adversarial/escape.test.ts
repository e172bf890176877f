/** Attempts to reach past the sandbox: kernel interfaces, host files, Paddock itself, later sandboxes. */
import { readFile } from 'node:fs/promises';
import { advTest, only, probeBinary, sustained, underAttack } from './harness.ts';

const test = advTest();

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
    const root = await sb.exec(['sh', '-c', 'cat /proc/1/root/etc/hostname; ls /proc/1/root/']);
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
