import { randomBytes } from 'node:crypto';

const ALPHABET = 'abcdefghijklmnopqrstuvwxyz234567';

/** `<prefix>-` + 16 base32 characters (80 random bits), safe as a subject token. */
function newId(prefix: string): string {
  const bytes = randomBytes(16);
  let s = `${prefix}-`;
  for (let i = 0; i < 16; i++) s += ALPHABET[(bytes[i] as number) & 31];
  return s;
}

/** A sandbox id: `sb-` + 16 base32 characters. */
export const newSandboxId = (): string => newId('sb');

/** A rollout id: `ro-` + 16 base32 characters. */
export const newRolloutId = (): string => newId('ro');
