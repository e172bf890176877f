/**
 * Chunk indexes: the sha256 of every fixed-size chunk of a layer blob, concatenated. A node that
 * loads a layer lazily cannot check the blob's whole digest before the kernel reads from it, so it
 * checks each chunk as it arrives against this index, and the index against the digest the image
 * manifest names for it. A chunk that does not match never reaches the kernel.
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';

/** 64 KiB: large enough that a python import is a few dozen requests, small enough that a 4 KiB read does not fetch much more than it needs. */
export const DEFAULT_CHUNK = 64 * 1024;
export const HASH_BYTES = 32;

export function chunkCount(size: number, chunk: number): number {
  return Math.ceil(size / chunk);
}

export function sha256(b: Buffer | Uint8Array): string {
  return createHash('sha256').update(b).digest('hex');
}

/** Reads a blob once and returns its whole sha256 and its chunk index. */
export async function indexFile(path: string, chunk = DEFAULT_CHUNK): Promise<{ hex: string; size: number; index: Buffer }> {
  const whole = createHash('sha256');
  const parts: Buffer[] = [];
  let cur = createHash('sha256');
  let inChunk = 0;
  let size = 0;
  for await (const data of createReadStream(path, { highWaterMark: 1024 * 1024 })) {
    const buf = data as Buffer;
    whole.update(buf);
    size += buf.length;
    let off = 0;
    while (off < buf.length) {
      const take = Math.min(chunk - inChunk, buf.length - off);
      cur.update(buf.subarray(off, off + take));
      inChunk += take;
      off += take;
      if (inChunk === chunk) {
        parts.push(cur.digest());
        cur = createHash('sha256');
        inChunk = 0;
      }
    }
  }
  if (inChunk > 0) parts.push(cur.digest());
  return { hex: whole.digest('hex'), size, index: Buffer.concat(parts) };
}

/** The expected digest of chunk `i`, from an index already checked against its own digest. */
export function chunkDigest(index: Buffer, i: number): Buffer {
  return index.subarray(i * HASH_BYTES, (i + 1) * HASH_BYTES);
}

export function verifyChunk(index: Buffer, i: number, data: Buffer): boolean {
  return createHash('sha256').update(data).digest().equals(chunkDigest(index, i));
}
