/**
 * A simulated sandbox's files, in memory: a flat map of absolute path → entry, directories
 * included, so a sandbox that never touches its files costs one empty Map. Sizes count against
 * the sandbox's disk (`diskMiB`), as the container backend's writable layer does.
 */
import { posix } from 'node:path';
import { type FileEntry, Limits, ProtocolError } from '../../protocol/index.ts';
import type { SandboxFiles } from '../backend.ts';

interface Entry {
  dir: boolean;
  data: Uint8Array;
  mode: number;
  mtimeMs: number;
}

export class MemoryFiles implements SandboxFiles {
  private readonly entries = new Map<string, Entry>();
  used = 0;

  constructor(private readonly diskBytes: number) {}

  /** A copy whose later writes do not show in this one (fork, snapshot). */
  clone(): MemoryFiles {
    const c = new MemoryFiles(this.diskBytes);
    for (const [k, v] of this.entries) c.entries.set(k, { ...v });
    c.used = this.used;
    return c;
  }

  private norm(path: string): string {
    const p = posix.normalize(path);
    return p.length > 1 && p.endsWith('/') ? p.slice(0, -1) : p;
  }

  private get(path: string): Entry | undefined {
    if (path === '/') return ROOT;
    return this.entries.get(path);
  }

  async read(path: string, offset = 0, length: number = Limits.files.chunkMax): Promise<{ data: Uint8Array; size: number; eof: boolean }> {
    const p = this.norm(path);
    const e = this.get(p);
    if (!e) throw new ProtocolError('NOT_FOUND', `${path}: no such file or directory`);
    if (e.dir) throw new ProtocolError('INVALID_REQUEST', `${path}: is a directory`);
    const data = e.data.subarray(Math.min(offset, e.data.length), Math.min(offset + length, e.data.length));
    return { data, size: e.data.length, eof: offset + data.length >= e.data.length };
  }

  /** The whole file, for exec's `cat`. */
  text(path: string): Uint8Array | undefined {
    const e = this.get(this.norm(path));
    return e && !e.dir ? e.data : undefined;
  }

  async write(path: string, data: Uint8Array, opts: { offset?: number; mode?: number } = {}): Promise<{ size: number }> {
    if (data.length > Limits.files.chunkMax) throw new ProtocolError('PAYLOAD_TOO_LARGE', `write chunk larger than ${Limits.files.chunkMax} bytes`);
    const p = this.norm(path);
    if (p === '/') throw new ProtocolError('INVALID_REQUEST', `${path}: is a directory`);
    const prev = this.entries.get(p);
    if (prev?.dir) throw new ProtocolError('INVALID_REQUEST', `${path}: is a directory`);
    const offset = opts.offset ?? 0;
    const old = prev?.data ?? new Uint8Array(0);
    const size = offset === 0 && opts.offset === undefined ? data.length : Math.max(old.length, offset + data.length);
    const grow = size - old.length;
    if (this.used + grow > this.diskBytes) throw new ProtocolError('DISK_LIMIT', `${path}: the sandbox's disk of ${this.diskBytes} bytes is full`);
    let next: Uint8Array;
    if (opts.offset === undefined) next = Uint8Array.from(data);
    else {
      next = new Uint8Array(size);
      next.set(old);
      next.set(data, offset);
    }
    this.mkdirs(posix.dirname(p));
    this.entries.set(p, { dir: false, data: next, mode: opts.mode ?? prev?.mode ?? 0o644, mtimeMs: Date.now() });
    this.used += grow;
    return { size };
  }

  private mkdirs(dir: string): void {
    for (let d = dir; d !== '/' && !this.entries.has(d); d = posix.dirname(d)) {
      this.entries.set(d, { dir: true, data: EMPTY, mode: 0o755, mtimeMs: Date.now() });
    }
  }

  async list(path: string): Promise<FileEntry[]> {
    const p = this.norm(path);
    const e = this.get(p);
    if (!e) throw new ProtocolError('NOT_FOUND', `${path}: no such file or directory`);
    if (!e.dir) throw new ProtocolError('INVALID_REQUEST', `${path}: not a directory`);
    const out: FileEntry[] = [];
    for (const [k, v] of this.entries) {
      if (posix.dirname(k) !== p || k === p) continue;
      out.push({ name: posix.basename(k), type: v.dir ? 'dir' : 'file', size: v.data.length, mode: v.mode, mtimeMs: v.mtimeMs });
    }
    return out.sort((a, b) => a.name.localeCompare(b.name));
  }

  async remove(path: string, recursive: boolean): Promise<void> {
    const p = this.norm(path);
    if (p === '/') throw new ProtocolError('FORBIDDEN', 'the root cannot be removed');
    const e = this.entries.get(p);
    if (!e) throw new ProtocolError('NOT_FOUND', `${path}: no such file or directory`);
    const below = [...this.entries.keys()].filter((k) => k.startsWith(`${p}/`));
    if (e.dir && below.length > 0 && !recursive) throw new ProtocolError('INVALID_REQUEST', `${path}: directory not empty`);
    for (const k of [p, ...below]) {
      this.used -= this.entries.get(k)?.data.length ?? 0;
      this.entries.delete(k);
    }
  }
}

const EMPTY = new Uint8Array(0);
const ROOT: Entry = { dir: true, data: EMPTY, mode: 0o755, mtimeMs: 0 };
