/**
 * Snapshots of a container sandbox's files: its writable layer turned into one more EROFS layer in
 * the image store, on top of the layers it runs on. New sandboxes start from the image that makes
 * (any node that reads the same store); processes and memory are not kept (the microVM backend
 * keeps those).
 *
 * The upper dir is reachable only through the fd the spawner holds (spawner.c keep_sock). It is
 * copied to a staging dir while the sandbox is frozen (a consistent tree, and the freeze lasts a
 * copy, not a build), owners shifted back from the sandbox's host ids to the ids inside, and the
 * stage is built into a blob. The copy keeps what overlayfs needs from a layer: whiteouts (0/0
 * character devices) for files the sandbox removed and the `trusted.overlay.opaque` xattr of a
 * directory it replaced; overlayfs honours both in a lower layer.
 */
import { lchown, lstat, open, readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { ProtocolError } from '../../protocol/index.ts';
import type { IdRange } from '../ids.ts';
import { run } from '../proc.ts';

const NULL_UUID = '00000000-0000-0000-0000-000000000000';
/** erofs_super_block at 1024: build_time (u64) at +24, build_time_nsec (u32) at +32. */
const BUILD_TIME_AT = 1024 + 24;

/**
 * Copies `upper` to `stage` (created by cp), every owner moved from the sandbox's host range back
 * to the ids inside it.
 */
export async function stageUpper(upper: string, stage: string, ids: IdRange): Promise<void> {
  // cp -a keeps owners, modes, times, hard links, device nodes (whiteouts) and xattrs, and never
  // follows a symlink: the tree is the sandbox's to shape.
  await run('cp', ['-a', '--no-dereference', '--preserve=all', '--one-file-system', `${upper}/.`, stage], { timeoutMs: 600_000 });
  await shiftOwners(stage, ids);
}

async function shiftOwners(dir: string, ids: IdRange): Promise<void> {
  const back = (id: number) => (id >= ids.hostId && id < ids.hostId + ids.size ? id - ids.hostId : id);
  const walk = async (path: string): Promise<void> => {
    const st = await lstat(path);
    const uid = back(st.uid);
    const gid = back(st.gid);
    if (uid !== st.uid || gid !== st.gid) await lchown(path, uid, gid);
    if (!st.isDirectory()) return;
    for (const name of await readdir(path)) await walk(join(path, name));
  };
  await walk(dir);
}

/**
 * Builds `stage` into an EROFS blob at `out`. Owners and mtimes stay as they are (a snapshot is
 * the sandbox's tree: make and Python's bytecode cache compare mtimes), so, unlike an image build,
 * no `-T0 --all-root`. The blob is still a function of the tree: the null UUID, and the build time
 * that mkfs.erofs writes into the superblock zeroed (with its checksum off, which only covers the
 * superblock; inodes keep their own mtimes with --preserve-mtime).
 */
export async function buildSnapshotBlob(stage: string, out: string): Promise<void> {
  await run('mkfs.erofs', ['--quiet', '--preserve-mtime', '-Enosbcrc', `-U${NULL_UUID}`, out, stage], { timeoutMs: 600_000 });
  const f = await open(out, 'r+');
  try {
    await f.write(Buffer.alloc(12), 0, 12, BUILD_TIME_AT);
  } finally {
    await f.close();
  }
}

/** Removes a staging dir (which may hold whiteouts and files owned by anyone). */
export async function removeStage(stage: string): Promise<void> {
  await rm(stage, { recursive: true, force: true });
}

/** The image a container snapshot's sandboxes start from. */
export function snapshotImageName(snapshot: string): string {
  const name = `snapshot-${snapshot.toLowerCase()}`;
  if (!/^[a-z0-9][a-z0-9._-]{0,127}$/.test(name)) throw new ProtocolError('INVALID_REQUEST', `bad snapshot name ${snapshot}`);
  return name;
}
