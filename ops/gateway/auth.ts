/**
 * API keys: `Authorization: Bearer <key>`, keys from PADDOCK_API_KEYS (comma-separated) and from
 * the file PADDOCK_API_KEYS_FILE (one per line, `#` comments). With no key configured the gateway
 * answers loopback peers only, whatever address it listens on.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { GatewayError } from './errors.ts';

export interface KeySet {
  /** sha256 of each key: compared in constant time, never logged. */
  digests: Buffer[];
}

const sha = (s: string) => createHash('sha256').update(s).digest();

export function loadKeys(env: NodeJS.ProcessEnv = process.env, extra: string[] = []): KeySet {
  const keys = [...extra];
  if (env.PADDOCK_API_KEYS) keys.push(...env.PADDOCK_API_KEYS.split(','));
  if (env.PADDOCK_API_KEYS_FILE) {
    for (const line of readFileSync(env.PADDOCK_API_KEYS_FILE, 'utf8').split('\n')) keys.push(line.replace(/#.*/, ''));
  }
  return { digests: keys.map((k) => k.trim()).filter((k) => k.length > 0).map(sha) };
}

export function isLoopback(addr: string | undefined): boolean {
  if (!addr) return false;
  return addr === '::1' || addr.startsWith('127.') || addr.startsWith('::ffff:127.');
}

/**
 * Who is calling, for per-key bounds: `key:<n>` for the nth key, `loopback` without keys.
 * Throws FORBIDDEN (401 without a key, 403 for a wrong one or a remote peer without keys).
 */
export function authenticate(keys: KeySet, authorization: string | undefined, remote: string | undefined): string {
  if (keys.digests.length === 0) {
    if (isLoopback(remote)) return 'loopback';
    throw new GatewayError('FORBIDDEN', 'no API key is configured, so only loopback clients are served (set PADDOCK_API_KEYS or PADDOCK_API_KEYS_FILE)', 403);
  }
  const m = /^Bearer\s+(\S+)\s*$/i.exec(authorization ?? '');
  if (!m?.[1]) throw new GatewayError('FORBIDDEN', 'an API key is required: Authorization: Bearer <key>', 401);
  const d = sha(m[1]);
  const i = keys.digests.findIndex((k) => timingSafeEqual(k, d));
  if (i < 0) throw new GatewayError('FORBIDDEN', 'the API key is not known', 403);
  return `key:${i}`;
}
