/**
 * Log files that do not grow without bound: `<name>` is always the current file (so `tail -F` and
 * `paddock logs -f` follow one path), `<name>.1` … `<name>.N` the older ones, oldest dropped.
 */
import { mkdirSync } from 'node:fs';
import { basename, dirname } from 'node:path';
import { createStream, type RotatingFileStream } from 'rotating-file-stream';

/** 10 MiB a file, 5 old files: a node at info level writes ~1 MiB per 5,000 sandboxes. */
export const LOG_ROTATE = { size: '10M', keep: 5 } as const;

export function rotatingLog(file: string): RotatingFileStream {
  const dir = dirname(file);
  const name = basename(file);
  mkdirSync(dir, { recursive: true });
  const s = createStream((i: number | Date | null) => (i ? `${name}.${String(i)}` : name), { path: dir, size: LOG_ROTATE.size, rotate: LOG_ROTATE.keep });
  // A log that cannot be written must not take its writer down (a full disk, a removed home).
  s.on('error', () => {});
  return s;
}
