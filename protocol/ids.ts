import { randomBytes } from 'node:crypto';

const ALPHABET = 'abcdefghijklmnopqrstuvwxyz234567';

/** A sandbox id: `sb-` + 16 base32 characters (80 random bits), safe as a subject token. */
export function newSandboxId(): string {
  const bytes = randomBytes(16);
  let s = 'sb-';
  for (let i = 0; i < 16; i++) s += ALPHABET[(bytes[i] as number) & 31];
  return s;
}
