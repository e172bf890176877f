import { chmod, mkdir, mkdtemp, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Header, Parser, type ReadEntry } from 'tar';
import { connect } from '@nats-io/transport-node';
import { randomBytes } from 'node:crypto';
import { decode, encode, subjects } from '../protocol/index.ts';
import type { FileChangeEvent, FileWatch, Sandbox } from '../sdk/index.ts';
import { clusterTest } from './helpers/cluster.ts';

const test = clusterTest();
const byString = (a: string, b: string) => a.localeCompare(b);

interface TarEntry {
  path: string;
  type?: 'File' | 'Directory' | 'SymbolicLink' | 'Link' | 'CharacterDevice' | 'FIFO';
  data?: string | Buffer;
  linkpath?: string;
  mode?: number;
}

/** A tar archive made entry by entry (node-tar's Header encodes each): for archives no tar command would make. */
function tarBytes(entries: TarEntry[], end = true): Buffer {
  const out: Buffer[] = [];
  for (const e of entries) {
    const data = Buffer.from(e.data ?? '');
    const type = e.type ?? 'File';
    const h = new Header({ path: e.path, type, mode: e.mode ?? 0o644, size: type === 'File' ? data.length : 0, mtime: new Date(0), uid: 0, gid: 0, ...(e.linkpath ? { linkpath: e.linkpath } : {}), ...(type === 'CharacterDevice' ? { devmaj: 1, devmin: 3 } : {}) });
    h.encode();
    out.push(h.block as Buffer);
    if (type === 'File' && data.length > 0) out.push(data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  if (end) out.push(Buffer.alloc(1024));
  return Buffer.concat(out);
}

/** What a tar archive holds: path → type, mode, and contents or link target. */
async function entriesOf(chunks: AsyncIterable<Uint8Array>): Promise<Map<string, { type: string; mode: number; body: string }>> {
  const found = new Map<string, { type: string; mode: number; body: string }>();
  const parser = new Parser({
    strict: true,
    onReadEntry: (e: ReadEntry) => {
      const parts: Buffer[] = [];
      e.on('data', (d: Buffer) => parts.push(d));
      e.on('end', () => found.set(e.path.replace(/\/$/, ''), { type: e.type, mode: (e.mode ?? 0) & 0o7777, body: e.type === 'SymbolicLink' ? (e.linkpath ?? '') : Buffer.concat(parts).toString() }));
    },
  });
  const done = new Promise<void>((resolve, reject) => {
    parser.on('end', () => resolve());
    parser.on('error', reject);
  });
  for await (const c of chunks) parser.write(Buffer.from(c));
  parser.end();
  await done;
  return found;
}

const codeOf = (e: unknown) => (e as { code?: string } | undefined)?.code;

async function localTree(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'pdk-upload-'));
  await mkdir(join(dir, 'src/deep/er'), { recursive: true });
  await mkdir(join(dir, 'empty-dir'));
  await writeFile(join(dir, 'src/deep/er/data.txt'), 'nested\n');
  await writeFile(join(dir, 'empty'), '');
  await writeFile(join(dir, 'run.sh'), '#!/bin/sh\necho ran "$@"\n');
  await chmod(join(dir, 'run.sh'), 0o755);
  await symlink('src/deep/er/data.txt', join(dir, 'link'));
  await symlink('/etc/hostname', join(dir, 'abs-link'));
  return dir;
}

test('upload a directory: nested dirs, symlinks, an empty file and an executable arrive as they were; download gives the same tree back', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const dir = await localTree();
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  await sb.exec('mkdir -p /work/up');
  const r = await sb.files.upload(dir, '/work/up');
  t.true(r.entries >= 8, `${r.entries} entries`);
  const ls = await sb.exec('cd /work/up && ls -l run.sh empty link abs-link && cat src/deep/er/data.txt link && ./run.sh x && stat -c %u:%g src/deep/er/data.txt');
  t.is(ls.exitCode, 0, ls.stderr);
  t.regex(ls.stdout, /-rwxr-xr-x .* run\.sh/);
  t.regex(ls.stdout, /-rw-r--r-- .* 0 .* empty/);
  t.regex(ls.stdout, /link -> src\/deep\/er\/data\.txt/);
  t.regex(ls.stdout, /abs-link -> \/etc\/hostname/);
  t.regex(ls.stdout, /nested\nnested\nran x\n0:0\n$/);
  // The absolute link is the sandbox's own /etc/hostname, as any program inside sees it.
  t.is((await sb.exec('cat /work/up/abs-link')).stdout, 'sandbox\n');

  const back = await entriesOf(sb.files.download('/work/up'));
  t.deepEqual([...back.keys()].sort(byString), ['abs-link', 'empty', 'empty-dir', 'link', 'run.sh', 'src', 'src/deep', 'src/deep/er', 'src/deep/er/data.txt']);
  t.deepEqual(back.get('run.sh'), { type: 'File', mode: 0o755, body: '#!/bin/sh\necho ran "$@"\n' });
  t.deepEqual(back.get('empty'), { type: 'File', mode: 0o644, body: '' });
  t.deepEqual(back.get('link'), { type: 'SymbolicLink', mode: 0o777, body: 'src/deep/er/data.txt' });
  t.deepEqual(back.get('abs-link'), { type: 'SymbolicLink', mode: 0o777, body: '/etc/hostname' });
  t.is(back.get('src/deep/er/data.txt')?.body, 'nested\n');
  t.is(back.get('empty-dir')?.type, 'Directory');

  // The archive is one any tar reads: uploaded again elsewhere, it gives the same tree.
  await sb.exec('mkdir /work/again');
  const again = Buffer.concat(await sb.files.download('/work/up').toArray());
  await sb.files.upload(again, '/work/again');
  t.is((await sb.exec('cd /work/again && ./run.sh && readlink link')).stdout, 'ran\nsrc/deep/er/data.txt\n');
  const host = await mkdtemp(join(tmpdir(), 'pdk-down-'));
  t.teardown(() => rm(host, { recursive: true, force: true }));
  await writeFile(join(host, 'a.tar'), again);
  const { execFileSync } = await import('node:child_process');
  t.regex(execFileSync('tar', ['-tvf', join(host, 'a.tar')]).toString(), /link -> src\/deep\/er\/data\.txt/);
});

test('download walks without following symlinks and leaves /proc out; a single file downloads as itself', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  await sb.exec('mkdir -p /d/sub && echo x > /d/sub/f && ln -s / /d/root && ln -s /proc /d/proc');
  const tree = await entriesOf(sb.files.download('/d'));
  t.deepEqual([...tree.keys()].sort(byString), ['proc', 'root', 'sub', 'sub/f']);
  t.is(tree.get('root')?.type, 'SymbolicLink');
  const one = await entriesOf(sb.files.download('/d/sub/f'));
  t.deepEqual([...one.entries()], [['f', { type: 'File', mode: 0o644, body: 'x\n' }]]);
  // The whole root: the image's files, not its /proc (another filesystem).
  const all = await entriesOf(sb.files.download('/'));
  t.true(all.has('bin/busybox') || all.has('bin/sh'));
  t.false([...all.keys()].some((k) => k.startsWith('proc/')));
  await t.throwsAsync(sb.files.download('/nope').toArray(), { code: 'NOT_FOUND' } as never);
  // A file larger than a chunk comes back byte for byte.
  const big = randomBytes(3 * 1024 * 1024 + 7);
  await sb.files.write('/d/big.bin', big);
  const got = await new Promise<Buffer>((resolve, reject) => {
    const parser = new Parser({ strict: true, onReadEntry: (e: ReadEntry) => { const parts: Buffer[] = []; e.on('data', (d: Buffer) => parts.push(d)); e.on('end', () => resolve(Buffer.concat(parts))); } });
    parser.on('error', reject);
    sb.files.download('/d/big.bin').on('data', (d: Buffer) => parser.write(d)).on('end', () => parser.end()).on('error', reject);
  });
  t.true(got.equals(big));
});

test('upload refuses what would leave the root or is no plain file, with stable codes, and writes nothing outside', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  await sb.exec('mkdir -p /w/in && echo keep > /w/keep');
  const up = (entries: TarEntry[], end = true) => sb.files.upload(tarBytes(entries, end), '/w/in');

  const dotdot = await t.throwsAsync(up([{ path: 'ok.txt', data: 'fine' }, { path: '../x', data: 'escaped' }]));
  t.is(codeOf(dotdot), 'FORBIDDEN');
  t.is((dotdot as { detail?: { entries?: number } }).detail?.entries, 1, 'the entry before it was written');
  t.is((await sb.exec('cat /w/in/ok.txt; echo; ls /w')).stdout, 'fine\nin\nkeep\n');

  const through = await t.throwsAsync(up([{ path: 'etc', type: 'SymbolicLink', linkpath: '/etc' }, { path: 'etc/owned', data: 'pwned' }]));
  t.is(codeOf(through), 'FORBIDDEN');
  t.is((await sb.exec('ls /etc/owned')).exitCode, 1);
  await t.throwsAsync(stat('/etc/owned'));

  const abs = await t.throwsAsync(up([{ path: 'dir', type: 'SymbolicLink', linkpath: '../../..' }, { path: 'dir/escaped', data: 'x' }]));
  t.is(codeOf(abs), 'FORBIDDEN');
  t.is((await sb.exec('ls /escaped')).exitCode, 1);

  for (const [type, extra] of [
    ['Link', { linkpath: 'ok.txt' }],
    ['CharacterDevice', {}],
    ['FIFO', {}],
  ] as const) {
    const e = await t.throwsAsync(up([{ path: `x-${type}`, type, ...extra }]));
    t.is(codeOf(e), 'FORBIDDEN', type);
    t.is((e as { detail?: { type?: string } }).detail?.type, type);
    t.is((await sb.exec(`ls /w/in/x-${type}`)).exitCode, 1, `${type} was not made`);
  }

  // A malformed archive, and one cut off in the middle of a file: the cut file is not left behind.
  t.is(codeOf(await t.throwsAsync(sb.files.upload(Buffer.from('this is not a tar archive at all'), '/w/in'))), 'INVALID_REQUEST');
  const whole = tarBytes([{ path: 'first.txt', data: 'one' }, { path: 'cut.bin', data: Buffer.alloc(5000, 1) }], false);
  t.is(codeOf(await t.throwsAsync(sb.files.upload(whole.subarray(0, 512 + 512 + 512 + 2048), '/w/in'))), 'INVALID_REQUEST');
  t.is((await sb.exec('cat /w/in/first.txt; ls /w/in/cut.bin')).stdout, 'one');

  // The destination: missing, not a directory, another filesystem.
  t.is(codeOf(await t.throwsAsync(sb.files.upload(tarBytes([{ path: 'a', data: 'a' }]), '/nope'))), 'NOT_FOUND');
  t.is(codeOf(await t.throwsAsync(sb.files.upload(tarBytes([{ path: 'a', data: 'a' }]), '/w/keep'))), 'INVALID_REQUEST');
  t.is(codeOf(await t.throwsAsync(sb.files.upload(tarBytes([{ path: 'a', data: 'a' }]), '/proc'))), 'FORBIDDEN');
  // `..` in the destination stops at the sandbox's root, as for every files call.
  await sb.files.upload(tarBytes([{ path: 'top.txt', data: 'top' }]), '/../../..');
  t.is((await sb.exec('cat /top.txt')).stdout, 'top');
});

test('upload past the sandbox disk size ends in DISK_LIMIT and removes the file it was writing', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ diskMiB: 16 });
  t.teardown(() => sb.kill());
  await sb.exec('mkdir /big');
  const size = 32 * 1024 * 1024;
  async function* archive(): AsyncGenerator<Uint8Array> {
    yield tarBytes([{ path: 'small.txt', data: 'small' }], false);
    const h = new Header({ path: 'huge.bin', type: 'File', mode: 0o644, size, mtime: new Date(0), uid: 0, gid: 0 });
    h.encode();
    yield h.block as Buffer;
    for (let i = 0; i < size / (1024 * 1024); i++) yield Buffer.alloc(1024 * 1024, 7);
    yield Buffer.alloc(1024);
  }
  const e = await t.throwsAsync(sb.files.upload(archive(), '/big'));
  t.is(codeOf(e), 'DISK_LIMIT');
  t.is((await sb.exec('cat /big/small.txt; ls /big')).stdout, 'smallsmall.txt\n');
  // The sandbox can write again: the space the cut file took was given back.
  t.is((await sb.exec('echo ok > /big/after && cat /big/after')).stdout, 'ok\n');

  // Many small files (written in batches) past the limit: those that stay are whole, none is left empty.
  await sb.exec('rm -f /big/after; mkdir /big/many');
  const many: TarEntry[] = [];
  for (let i = 0; i < 400; i++) many.push({ path: `f${i}`, data: Buffer.alloc(60 * 1024, i % 256) });
  t.is(codeOf(await t.throwsAsync(sb.files.upload(tarBytes(many), '/big/many'))), 'DISK_LIMIT');
  const sizes = (await sb.exec('ls -l /big/many | grep -c " 61440 "; ls /big/many | wc -l')).stdout.trim().split(/\s+/);
  t.true(Number(sizes[1]) > 0 && Number(sizes[1]) < 400, `${sizes[1]} files`);
  t.is(sizes[0], sizes[1], 'every file left is whole');
});

test('10,000 small files upload as one archive', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({ memoryMiB: 512, diskMiB: 256 });
  t.teardown(() => sb.kill());
  const entries: TarEntry[] = [];
  for (let i = 0; i < 10_000; i++) entries.push({ path: `d${i % 100}/f${i}.txt`, data: `file ${i}\n` });
  await sb.exec('mkdir /many');
  const r = await sb.files.upload(tarBytes(entries), '/many');
  t.is(r.entries, 10_000);
  t.is((await sb.exec('find /many -type f | wc -l; cat /many/d42/f9942.txt')).stdout.replace(/^ +/, ''), '10000\nfile 9942\n');
});

/** Events of `w` until `done` says enough (or 20 s pass). */
async function eventsUntil(w: FileWatch, done: (evs: FileChangeEvent[]) => boolean): Promise<FileChangeEvent[]> {
  const evs: FileChangeEvent[] = [];
  const it = w[Symbol.asyncIterator]();
  const deadline = Date.now() + 20_000;
  while (!done(evs)) {
    const left = deadline - Date.now();
    if (left <= 0) break;
    const r = await Promise.race([it.next(), new Promise<null>((res) => setTimeout(() => res(null), left))]);
    if (r === null || r.done) break;
    evs.push(r.value);
  }
  return evs;
}

const has = (evs: FileChangeEvent[], type: string, path: string) => evs.some((e) => e.type === type && e.path === path);

async function watching(sb: Sandbox, path: string, recursive: boolean): Promise<FileWatch> {
  return sb.files.watch(path, { recursive });
}

test('watch: created, modified and removed arrive; non-recursive sees its own directory only, recursive all below', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  await sb.exec('mkdir -p /w/sub /r/a');
  const flat = await watching(sb, '/w', false);
  t.teardown(() => flat.close());
  await sb.exec('echo 1 > /w/f; echo 2 >> /w/f; echo x > /w/sub/hidden; rm /w/f; touch /w/marker');
  const evs = await eventsUntil(flat, (e) => has(e, 'created', '/w/marker'));
  t.true(has(evs, 'created', '/w/f'), JSON.stringify(evs));
  t.true(has(evs, 'modified', '/w/f'));
  t.true(has(evs, 'removed', '/w/f'));
  t.false(evs.some((e) => e.path.startsWith('/w/sub/')), 'not recursive');

  const deep = await watching(sb, '/r', true);
  t.teardown(() => deep.close());
  await sb.exec('echo x > /r/a/one; mkdir -p /r/new/er; echo y > /r/new/er/two');
  const revs = await eventsUntil(deep, (e) => has(e, 'created', '/r/a/one') && has(e, 'created', '/r/new/er/two'));
  t.true(has(revs, 'created', '/r/a/one'), JSON.stringify(revs));
  t.true(has(revs, 'created', '/r/new'));
  t.true(has(revs, 'created', '/r/new/er/two'), JSON.stringify(revs));
  // A directory made after the watch began is watched too.
  await sb.exec('echo z > /r/new/er/three');
  t.true(has(await eventsUntil(deep, (e) => has(e, 'created', '/r/new/er/three')), 'created', '/r/new/er/three'));
});

test('watch stays inside the sandbox, and ends when the sandbox is killed', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  await sb.exec('mkdir -p /v && ln -s /etc /v/etc');
  t.is(codeOf(await t.throwsAsync(sb.files.watch('/proc'))), 'FORBIDDEN');
  t.is(codeOf(await t.throwsAsync(sb.files.watch('/nope'))), 'NOT_FOUND');
  t.is(codeOf(await t.throwsAsync(sb.files.watch('/etc/hostname'))), 'INVALID_REQUEST');
  // Through a symlink the watch is of the sandbox's own /etc; a recursive one does not descend into links.
  const w = await sb.files.watch('/v', { recursive: true });
  await sb.exec('echo 1 > /etc/through-link; touch /v/marker');
  const evs = await eventsUntil(w, (e) => has(e, 'created', '/v/marker'));
  t.false(evs.some((e) => e.path.includes('through-link')), JSON.stringify(evs));
  const e2 = await sb.files.watch('/v/etc');
  await sb.exec('touch /etc/seen');
  t.true(has(await eventsUntil(e2, (e) => has(e, 'created', '/etc/seen')), 'created', '/etc/seen'));
  e2.close();

  const ended = (async () => {
    const rest: FileChangeEvent[] = [];
    for await (const ev of w) rest.push(ev);
    return rest;
  })();
  await sb.kill();
  const timer = new Promise<'hung'>((r) => setTimeout(() => r('hung'), 20_000));
  t.not(await Promise.race([ended, timer]), 'hung', 'the watch ended with the sandbox');
});

test('a watch whose caller stops renewing its lease ends on the node', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  await sb.exec('mkdir /lease');
  // A caller that starts a watch and goes silent (a process that died, say): no renewals.
  const nc = await connect({ servers: t.context.cluster.url });
  t.teardown(() => nc.close());
  const inbox = `_INBOX.lease${Math.random().toString(36).slice(2)}`;
  const seen: Array<{ t: string; reason?: string }> = [];
  const ended = new Promise<void>((resolve) => {
    nc.subscribe(inbox, {
      callback: (_e, m) => {
        const ev = decode(m.data) as { t: string; reason?: string };
        seen.push(ev);
        if (ev.t === 'end') resolve();
      },
    });
  });
  nc.publish(subjects.sandbox(sb.id, 'files.watch'), encode({ watchId: 'silent', path: '/lease', recursive: true }), { reply: inbox });
  await Promise.race([ended, new Promise((r) => setTimeout(r, 25_000))]);
  t.deepEqual(seen.map((e) => e.t), ['ready', 'end']);
  t.is(seen[1]?.reason, 'expired');
  // The node no longer knows it.
  const renew = decode((await nc.request(subjects.sandbox(sb.id, 'files.watch.renew'), encode({ watchId: 'silent' }))).data) as { result: { watching: boolean } };
  t.false(renew.result.watching);
});

test('a local directory with a hardlinked file uploads (the link goes as a copy)', async (t) => {
  const sb = await t.context.pdk.sandboxes.create({});
  t.teardown(() => sb.kill());
  const dir = await mkdtemp(join(tmpdir(), 'pdk-hl-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  await writeFile(join(dir, 'a'), 'same\n');
  const { link } = await import('node:fs/promises');
  await link(join(dir, 'a'), join(dir, 'b'));
  await sb.files.upload(dir, '/tmp');
  t.is((await sb.exec('cat /tmp/a /tmp/b')).stdout, 'same\nsame\n');
  t.is(await readFile(join(dir, 'b'), 'utf8'), 'same\n');
});
