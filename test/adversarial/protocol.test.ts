/** Hostile input on the wire and through the files API: clear error codes, nothing escapes, the node keeps serving. */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { decode, encode, subjects } from '../../protocol/index.ts';
import { RootFiles } from '../../runtime/files.ts';
import { connectionOf } from '../../sdk/client.ts';
import { PaddockError } from '../../sdk/index.ts';
import { advTest, only, probeBinary, sustained, underAttack } from './harness.ts';

const test = advTest();
const sh = promisify(execFile);

test.serial('malformed and oversized protocol messages get error codes and the node serves on', async (t) => {
  const { pdk, cluster } = t.context;
  const sb = await pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  const node = cluster.nodes[0]?.id as string;
  const nc = connectionOf(pdk);
  const maxPayload = nc.info?.max_payload ?? 1024 * 1024;
  const codes = new Set<string>();
  const ask = async (subject: string, data: Uint8Array) => {
    const m = await nc.request(subject, data, { timeout: 10_000 });
    const r = decode(m.data) as { ok: boolean; error?: { code: string } };
    codes.add(r.ok ? 'OK' : (r.error?.code ?? '?'));
  };
  const payloads: Array<[string, Uint8Array]> = [
    [subjects.sandbox(sb.id, 'exec'), randomBytes(512)],
    [subjects.sandbox(sb.id, 'exec'), new Uint8Array([0xc1])],
    [subjects.sandbox(sb.id, 'exec'), encode({ cmd: 'sh' })],
    [subjects.sandbox(sb.id, 'exec'), encode({ cmd: ['sh'], timeoutMs: -1 })],
    [subjects.sandbox(sb.id, 'exec'), encode({ cmd: [['nested']] })],
    [subjects.sandbox(sb.id, 'files.read'), encode({ path: 42 })],
    [subjects.sandbox(sb.id, 'files.write'), encode({ path: '/x', data: 'not bytes' })],
    [subjects.sandbox(sb.id, 'network.set'), encode({ policy: { allow: ['0.0.0.0/0:99999'] } })],
    [`${subjects.sandbox(sb.id, 'info')}.extra`, encode({})],
    [subjects.node(node, 'create'), encode({ spec: { memoryMiB: -5 } })],
    [subjects.node(node, 'create'), encode({ spec: { network: 'everything' } })],
    [subjects.node(node, 'create'), encode({ spec: { diskMiB: 1e12 } })],
    [subjects.placeCreate, randomBytes(64)],
    // Deeply nested maps: the decoder must not blow the stack.
    [subjects.sandbox(sb.id, 'exec'), new Uint8Array([...new Array(100_000).fill(0x91), 0xc0])],
  ];
  // Past the node's request limit but within NATS's: refused before it is decoded.
  await ask(subjects.sandbox(sb.id, 'files.write'), encode({ path: '/big', data: new Uint8Array(Math.min(maxPayload - 1024, 7 * 1024 * 1024)) }));
  t.true(codes.has('PAYLOAD_TOO_LARGE'));
  await underAttack(t, 'malformed and oversized messages', 'REJECTED', async () =>
    only(
      await sustained(1500, async () => {
        // A buggy client, not a flood: the node has no per-client request rate limit (NATS account
        // limits are the place for one), and a flood of any request competes for its one event loop.
        for (const [subject, data] of payloads) {
          await ask(subject, data);
          await new Promise((r) => setTimeout(r, 10));
        }
        return codes.has('OK') || codes.has('INTERNAL') ? `ACCEPTED ${[...codes].join(',')}` : 'REJECTED';
      }),
    ),
  );
  t.log([...codes]);
  t.true(codes.has('INVALID_REQUEST'));
  t.true(codes.has('INVALID_SPEC'));
  t.true(codes.has('UNKNOWN_VERB'));
  // Over NATS's own limit the client refuses to send: nothing reaches the node.
  t.throws(() => nc.publish(subjects.sandbox(sb.id, 'exec'), new Uint8Array(maxPayload + 1)));
  t.is((await sb.exec(['echo', 'still here'])).stdout, 'still here\n');
});

test.serial('path tricks through the files API stay inside the sandbox', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  await sb.exec([
    'sh',
    '-c',
    'ln -s / /tmp/root; ln -s /proc/1/root /tmp/pid1; ln -s ../../../../../../ /tmp/up; mkfifo /tmp/fifo; ln -s /tmp/fifo /tmp/fifolink; ln -s /tmp/loop1 /tmp/loop2; ln -s /tmp/loop2 /tmp/loop1; ln -s /dev/null /tmp/devnull',
  ]);
  const code = (p: Promise<unknown>) => p.then(
    () => 'OK',
    (e: { code?: string }) => e.code ?? 'ERR',
  );
  const cases = async () => {
    const seen: Record<string, string> = {
      dotdot: await sb.files.readText('/../../../../etc/hostname'),
      symlinkRoot: await sb.files.readText('/tmp/root/etc/hostname'),
      symlinkUp: await sb.files.readText('/tmp/up/etc/hostname'),
      pid1: await code(sb.files.readText('/tmp/pid1/etc/shadow')),
      fifo: await code(sb.files.read('/tmp/fifo')),
      fifoLink: await code(sb.files.write('/tmp/fifolink', 'x')),
      loop: await code(sb.files.read('/tmp/loop1')),
      // The container's /dev is a mount of its own: seen from the host, the link leads nowhere.
      devNull: await code(sb.files.read('/tmp/devnull')),
      relative: await code(sb.files.read('etc/hostname')),
      nul: await code(sb.files.read('/etc/host\0name')),
      // The SDK writes from offset 0; the wire allows any offset.
      hugeOffset: await code(sb.call('files.write', { path: '/tmp/sparse', data: new Uint8Array(1), offset: 2 ** 50 })),
    };
    return seen;
  };
  let last: Record<string, string> = {};
  await underAttack(t, 'path tricks through the files API', 'CONTAINED', async () =>
    only(
      await sustained(1500, async () => {
        last = await cases();
        const expected = { dotdot: 'sandbox\n', symlinkRoot: 'sandbox\n', symlinkUp: 'sandbox\n', pid1: 'FORBIDDEN', fifo: 'FORBIDDEN', fifoLink: 'FORBIDDEN', loop: 'FORBIDDEN', devNull: 'FORBIDDEN', relative: 'INVALID_REQUEST', nul: 'INVALID_REQUEST', hugeOffset: 'INVALID_REQUEST' };
        return JSON.stringify(last) === JSON.stringify(expected) ? 'CONTAINED' : `ESCAPED ${JSON.stringify(last)}`;
      }),
    ),
  );
  t.log(last);
});

test.serial('device files and sockets in a sandbox root are never opened', async (t) => {
  const root = await mkdtemp(join(tmpdir(), 'paddock-devroot-'));
  t.teardown(() => rm(root, { recursive: true, force: true }));
  await sh('mknod', [join(root, 'zero'), 'c', '1', '5']);
  await sh('mknod', [join(root, 'disk'), 'b', '7', '0']);
  const files = new RootFiles(root, { uid: 1_000_000_000, gid: 1_000_000_000 });
  for (const p of ['/zero', '/disk']) {
    t.is((await t.throwsAsync(files.read(p)))?.message.includes('not a regular file'), true, p);
    t.is(((await t.throwsAsync(files.write(p, new Uint8Array(1)))) as { code?: string }).code, 'FORBIDDEN', p);
  }
  const entries = await files.list('/');
  t.deepEqual(
    entries.map((e) => [e.name, e.type]),
    [
      ['disk', 'other'],
      ['zero', 'other'],
    ],
  );
  // What the API creates belongs to the sandbox's root, parents included.
  await files.write('/new/dir/file', new Uint8Array([1]));
  const st = await stat(join(root, 'new', 'dir', 'file'));
  const dir = await stat(join(root, 'new'));
  t.deepEqual([st.uid, st.gid, dir.uid], [1_000_000_000, 1_000_000_000, 1_000_000_000]);
});

const codeOf = (e: unknown) => (e instanceof PaddockError ? e.code : `threw ${String(e)}`);

test.serial('files.remove of a 30,000-deep tree finishes with bounded fds: REMOVED', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1, memoryMiB: 512 });
  t.teardown(() => sb.kill());
  await sb.files.write('/usr/local/bin/probe', await probeBinary(), { mode: 0o755 });
  await underAttack(t, 'files.remove of a 30,000-deep tree', 'REMOVED', async () => {
    const made = await sb.exec(['/usr/local/bin/probe', 'deep', '/tmp/deep', '30000'], { timeoutMs: 120_000 });
    if (made.stdout !== 'deep 30000\n') return `not made: ${made.stdout}${made.stderr}`;
    const removed = await sb.files.remove('/tmp/deep', { recursive: true, timeoutMs: 120_000 }).then(() => 'done', codeOf);
    const gone = (await sb.exec(['sh', '-c', 'test -e /tmp/deep && echo left || echo gone'])).stdout.trim();
    return removed === 'done' && gone === 'gone' ? 'REMOVED' : `${removed}, tree ${gone}`;
  });
});

test.serial('a directory swapped for a symlink during files calls gives NOT_FOUND or FORBIDDEN, never INTERNAL: CLEAR', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  await sb.files.write('/usr/local/bin/probe', await probeBinary(), { mode: 0o755 });
  const codes = new Map<string, number>();
  await underAttack(t, 'dir<->symlink swap race during files calls', 'CLEAR', async () => {
    const swapping = sb.exec(['/usr/local/bin/probe', 'swap', '/tmp/race', '6'], { timeoutMs: 30_000 });
    await new Promise((r) => setTimeout(r, 300));
    const end = Date.now() + 4000;
    const note = (verb: string, p: Promise<unknown>) =>
      p.then(
        () => codes.set(`${verb} OK`, (codes.get(`${verb} OK`) ?? 0) + 1),
        (e: unknown) => codes.set(`${verb} ${codeOf(e)}`, (codes.get(`${verb} ${codeOf(e)}`) ?? 0) + 1),
      );
    while (Date.now() < end) {
      await Promise.all([
        note('read', sb.files.read('/tmp/race/a/f')),
        note('list', sb.files.list('/tmp/race/a')),
        note('write', sb.files.write('/tmp/race/a/g', 'x')),
        note('remove', sb.files.remove('/tmp/race/a/g')),
      ]);
    }
    await swapping;
    const bad = [...codes.keys()].filter((k) => !/ (OK|NOT_FOUND|FORBIDDEN)$/.test(k));
    return bad.length === 0 ? 'CLEAR' : `UNCLEAR ${bad.join(', ')}`;
  });
  t.log(Object.fromEntries(codes));
});

test.serial('file names that are not UTF-8 are listed as bytes and removed with their directory: LISTED', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  await sb.exec(['sh', '-c', `mkdir -p /tmp/names && cd /tmp/names && touch "$(printf 'f\\377\\376')" plain && mkdir "$(printf 'd\\377')" && touch "$(printf 'd\\377/inner')"`]);
  await underAttack(t, 'non-UTF-8 file names', 'LISTED', async () => {
    const entries = await sb.files.list('/tmp/names');
    const hex = (xs: string[]) => xs.sort((a, b) => a.localeCompare(b));
    const raw = hex(entries.map((e) => Buffer.from(e.nameBytes ?? Buffer.from(e.name)).toString('hex')));
    const expected = hex([Buffer.from('plain'), Buffer.from([0x64, 0xff]), Buffer.from([0x66, 0xff, 0xfe])].map((b) => b.toString('hex')));
    const removed = await sb.files.remove('/tmp/names', { recursive: true }).then(() => 'removed', codeOf);
    const gone = (await sb.exec(['sh', '-c', 'test -e /tmp/names && echo left || echo gone'])).stdout.trim();
    return JSON.stringify(raw) === JSON.stringify(expected) && removed === 'removed' && gone === 'gone' ? 'LISTED' : `listed ${raw.join(',')}; ${removed}; ${gone}`;
  });
});

test.serial('a path through a 40-link chain of long symlinks is refused at once: FORBIDDEN', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  // Each link: 800 times `a/../` (4,000 bytes), then the previous link.
  // biome-ignore lint/suspicious/noTemplateCurlyInString: shell, not a template
  await sb.exec(['sh', '-c', 'mkdir -p /tmp/chain/a && cd /tmp/chain && echo x > l0 && p=""; i=0; while [ $i -lt 800 ]; do p="${p}a/../"; i=$((i+1)); done; i=1; while [ $i -le 39 ]; do ln -s "${p}l$((i-1))" l$i; i=$((i+1)); done']);
  await underAttack(t, 'a 40-link chain of 4 KiB symlinks', 'FORBIDDEN', async () =>
    only(await sustained(1000, () => sb.files.readText('/tmp/chain/l39', { timeoutMs: 60_000 }).then(() => 'read', codeOf))),
  );
});

test.serial('SDK checks before sending: a 50 MiB env is PAYLOAD_TOO_LARGE, timeoutMs 1e15 INVALID_REQUEST, sandboxes.get("*") a PaddockError: CLEAR', async (t) => {
  const { pdk } = t.context;
  const sb = await pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  let seen: string[] = [];
  await underAttack(t, 'SDK: 50 MiB env, timeoutMs 1e15, get("*")', 'CLEAR', async () => {
    seen = [
      await sb.exec(['true'], { env: { BIG: 'x'.repeat(50 * 1024 * 1024) } }).then(() => 'OK', codeOf),
      await sb.exec(['true'], { timeoutMs: 1e15 }).then(() => 'OK', codeOf),
      await pdk.sandboxes.get('*').then(() => 'OK', codeOf),
      await pdk.sandboxes.get('a.b').then(() => 'OK', codeOf),
    ];
    return JSON.stringify(seen) === JSON.stringify(['PAYLOAD_TOO_LARGE', 'INVALID_REQUEST', 'INVALID_REQUEST', 'INVALID_REQUEST']) ? 'CLEAR' : `UNCLEAR ${seen.join(' ')}`;
  });
  t.is((await sb.exec(['echo', 'ok'])).stdout, 'ok\n');
});
