/** Hostile input on the wire and through the files API: clear error codes, nothing escapes, the node keeps serving. */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { RootFiles } from '../../runtime/files.ts';
import { decode, encode, subjects } from '../../protocol/index.ts';
import { Paddock } from '../../sdk/index.ts';
import { advTest, only, sustained, underAttack } from './harness.ts';

const test = advTest();
const sh = promisify(execFile);

test.serial('malformed and oversized protocol messages get error codes and the node serves on', async (t) => {
  const { pdk, cluster } = t.context;
  const sb = await pdk.sandboxes.create({ cpu: 1 });
  t.teardown(() => sb.kill());
  const node = cluster.nodes[0]?.id as string;
  const nc = Paddock.connectionOf(pdk);
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
