/**
 * Egress policies: validation of what a caller sends, and the parsed form the node enforces.
 * Pure, so the SDK, the node and tests share it.
 */
import { type ErrorCode, ProtocolError } from './errors.ts';
import { Limits } from './limits.ts';
import type { NetworkPolicy } from './schema.ts';

export const NetworkLimits = Limits.network;

/** One allowed destination: an IPv4 network and a port range (0-65535 = any port). */
export interface AllowRule {
  /** Network address as a 32-bit unsigned integer, and prefix length. */
  net: number;
  prefix: number;
  portLo: number;
  portHi: number;
}

export interface ParsedPolicy {
  allow: AllowRule[];
  /** Lower-case names; `*.x` matches any name below x (not x itself). */
  domains: string[];
  ports: number[];
}

export const DEFAULT_DOMAIN_PORTS = [80, 443];

const LABEL = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/;

export function parseIPv4(s: string): number | null {
  const parts = s.split('.');
  if (parts.length !== 4) return null;
  let n = 0;
  for (const p of parts) {
    if (!/^\d{1,3}$/.test(p)) return null;
    const v = Number(p);
    if (v > 255) return null;
    n = n * 256 + v;
  }
  return n >>> 0;
}

export function formatIPv4(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

export function maskOf(prefix: number): number {
  return prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
}

function bad(code: ErrorCode, field: string, message: string): never {
  throw new ProtocolError(code, `${field}: ${message}`, { detail: { field } });
}

function port(code: ErrorCode, field: string, s: string): number {
  if (!/^\d{1,5}$/.test(s) || Number(s) < 1 || Number(s) > 65535) bad(code, field, `bad port ${JSON.stringify(s)}`);
  return Number(s);
}

export function parseAllow(entry: unknown, code: ErrorCode = 'INVALID_SPEC', field = 'network.allow'): AllowRule {
  if (typeof entry !== 'string' || entry.length > 64) bad(code, field, 'entries must be strings like "198.18.0.0/24:443"');
  const m = /^([0-9.]+)(?:\/(\d{1,2}))?(?::(\d+)(?:-(\d+))?)?$/.exec(entry);
  if (!m) bad(code, field, `bad entry ${JSON.stringify(entry)} (want CIDR, CIDR:port or CIDR:lo-hi)`);
  const ip = parseIPv4(m[1] as string);
  if (ip === null) bad(code, field, `bad address in ${JSON.stringify(entry)}`);
  const prefix = m[2] === undefined ? 32 : Number(m[2]);
  if (prefix > 32) bad(code, field, `bad prefix in ${JSON.stringify(entry)}`);
  let portLo = 0;
  let portHi = 65535;
  if (m[3] !== undefined) {
    portLo = port(code, field, m[3]);
    portHi = m[4] === undefined ? portLo : port(code, field, m[4]);
    if (portHi < portLo) bad(code, field, `empty port range in ${JSON.stringify(entry)}`);
  }
  return { net: (ip & maskOf(prefix)) >>> 0, prefix, portLo, portHi };
}

export function parseDomain(entry: unknown, code: ErrorCode = 'INVALID_SPEC', field = 'network.domains'): string {
  if (typeof entry !== 'string' || entry.length === 0 || entry.length > NetworkLimits.domainMax) bad(code, field, 'entries must be domain names');
  const name = entry.toLowerCase().replace(/\.$/, '');
  const labels = name.startsWith('*.') ? name.slice(2).split('.') : name.split('.');
  if (labels.length < 1 || !labels.every((l) => LABEL.test(l))) bad(code, field, `bad domain ${JSON.stringify(entry)}`);
  return name;
}

/** Checks a policy as sent by a caller; returns it normalised. `code` is INVALID_SPEC at create, INVALID_REQUEST for network.set. */
export function validateNetworkPolicy(input: unknown, code: ErrorCode = 'INVALID_SPEC', field = 'network'): NetworkPolicy {
  if (typeof input !== 'object' || input === null || Array.isArray(input) || input instanceof Uint8Array) bad(code, field, 'must be a map with allow, domains and ports');
  const rec = input as Record<string, unknown>;
  for (const k of Object.keys(rec)) if (!['allow', 'domains', 'ports'].includes(k)) bad(code, `${field}.${k}`, 'unknown field');
  const list = (k: string, max: number): unknown[] => {
    const v = rec[k];
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v)) bad(code, `${field}.${k}`, 'must be an array');
    if (v.length > max) bad(code, `${field}.${k}`, `at most ${max} entries`);
    return v;
  };
  const out: NetworkPolicy = {};
  const allow = list('allow', NetworkLimits.allowMax);
  for (const a of allow) parseAllow(a, code, `${field}.allow`);
  if (allow.length > 0) out.allow = allow as string[];
  const domains = list('domains', NetworkLimits.domainsMax).map((d) => parseDomain(d, code, `${field}.domains`));
  if (domains.length > 0) out.domains = domains;
  const ports = list('ports', NetworkLimits.portsMax).map((p) => (typeof p === 'number' && Number.isInteger(p) ? port(code, `${field}.ports`, String(p)) : bad(code, `${field}.ports`, 'ports must be integers')));
  if (ports.length > 0) out.ports = ports;
  return out;
}

export function parsePolicy(p: NetworkPolicy | undefined): ParsedPolicy {
  return {
    allow: (p?.allow ?? []).map((a) => parseAllow(a)),
    domains: (p?.domains ?? []).map((d) => parseDomain(d)),
    ports: p?.ports && p.ports.length > 0 ? p.ports : DEFAULT_DOMAIN_PORTS,
  };
}

/** Whether a policy lets anything out at all (an empty one is the same as no network). */
export function isOpen(p: ParsedPolicy): boolean {
  return p.allow.length > 0 || p.domains.length > 0;
}

export function domainAllowed(p: ParsedPolicy, qname: string): boolean {
  const name = qname.toLowerCase().replace(/\.$/, '');
  return p.domains.some((d) => (d.startsWith('*.') ? name.endsWith(d.slice(1)) && name.length > d.length - 1 : name === d));
}
