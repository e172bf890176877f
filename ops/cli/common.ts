/**
 * What every `paddock` command shares: the global flags, how a command connects, how it prints,
 * and how an error becomes an exit status (2: the caller's fault, 1: the platform's).
 */
import { ErrorCodes, ProtocolError } from '../../protocol/index.ts';
import { Paddock, PaddockError } from '../../sdk/index.ts';

/** Bad arguments: exit 2, with the usage text when the command line itself made no sense. */
export class UsageError extends Error {
  constructor(
    message: string,
    readonly showUsage = false,
  ) {
    super(message);
  }
}

/** The flags every command takes, before or after its name. */
export interface GlobalFlags {
  nats?: string;
  timeout?: string;
}

export function positiveNumber(flag: string, v: string | undefined, integer = false): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (v.trim() === '' || !Number.isFinite(n) || n <= 0 || (integer && !Number.isInteger(n))) {
    throw new UsageError(`--${flag} ${v}: must be a positive ${integer ? 'integer' : 'number'}`);
  }
  return n;
}

export function pairs(flag: string, list: string[] | undefined): Record<string, string> | undefined {
  if (!list) return undefined;
  const out: Record<string, string> = {};
  for (const s of list) {
    const eq = s.indexOf('=');
    if (eq <= 0) throw new UsageError(`--${flag} ${s}: expected key=value`);
    out[s.slice(0, eq)] = s.slice(eq + 1);
  }
  return out;
}

/** Connects as the CLI: `--nats`, else $NATS_URL, else the URL `paddock up` wrote in $PADDOCK_HOME. */
export function connect(g: GlobalFlags, timeoutMs = positiveNumber('timeout', g.timeout, true)): Promise<Paddock> {
  return Paddock.connect({ servers: g.nats, timeoutMs, name: 'paddock-cli' });
}

export async function withClient<T>(g: GlobalFlags, fn: (pdk: Paddock) => Promise<T>, timeoutMs?: number): Promise<T> {
  const pdk = await connect(g, timeoutMs ?? positiveNumber('timeout', g.timeout, true));
  try {
    return await fn(pdk);
  } finally {
    // Drain, not just close: a cancel published on the way out (exec.cancel) must still leave.
    await pdk.close().catch(() => {});
  }
}

export function out(s: string): void {
  process.stdout.write(s.endsWith('\n') ? s : `${s}\n`);
}

export function note(s: string): void {
  process.stderr.write(`paddock: ${s}\n`);
}

export function json(x: unknown): void {
  out(JSON.stringify(x, null, 2));
}

export function table(head: string[], rows: string[][]): string {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]) =>
    r
      .map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  return [line(head), ...rows.map(line)].join('\n');
}

export function age(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m`;
  const h = Math.floor(m / 60);
  return h < 48 ? `${h}h` : `${Math.floor(h / 24)}d`;
}

export function human(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1024 ** 2) return `${(n / 1024).toFixed(1)} KiB`;
  if (n < 1024 ** 3) return `${(n / 1024 ** 2).toFixed(1)} MiB`;
  return `${(n / 1024 ** 3).toFixed(2)} GiB`;
}

export async function readStdin(): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

export function exitCodeOf(err: unknown): number {
  if (err instanceof UsageError) return 2;
  // The wire error says whose fault it was (the SDK keeps it); a node-side ProtocolError has its code's.
  if (err instanceof PaddockError) return err.fault === 'user' ? 2 : 1;
  if (err instanceof ProtocolError) return ErrorCodes[err.code].fault === 'user' ? 2 : 1;
  return 1;
}

/** 128 + SIGPIPE: a reader that went away early (`paddock files get … | head`) is no failure. */
export const SIGPIPE_EXIT = 141;
