import { randomFillSync } from 'node:crypto';

const ALPHABET = 'abcdefghijklmnopqrstuvwxyz234567';

// Random bytes drawn 4 KiB at a time: a randomBytes call per id was 6% of a placement replica's
// CPU while it refused a burst of creates.
const pool = Buffer.alloc(4096);
let used = pool.length;

/** `<prefix>-` + 16 base32 characters (80 random bits), safe as a subject token. */
function newId(prefix: string): string {
  if (used + 16 > pool.length) {
    randomFillSync(pool);
    used = 0;
  }
  let s = `${prefix}-`;
  for (let i = 0; i < 16; i++) s += ALPHABET[(pool[used + i] as number) & 31];
  used += 16;
  return s;
}

/** A sandbox id: `sb-` + 16 base32 characters. */
export const newSandboxId = (): string => newId('sb');

/** A rollout id: `ro-` + 16 base32 characters. */
export const newRolloutId = (): string => newId('ro');

/** A snapshot id: `sn-` + 16 base32 characters. */
export const newSnapshotId = (): string => newId('sn');
