/** Running host commands (crun, mount, mkfs.erofs) with their errors turned into BACKEND_FAILED. */
import { spawn } from 'node:child_process';
import { ProtocolError } from '../protocol/index.ts';

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs a command to completion; rejects with BACKEND_FAILED (stderr in the message) unless it exits 0. */
export async function run(cmd: string, args: string[], opts: { allowFail?: boolean; input?: string; timeoutMs?: number; env?: NodeJS.ProcessEnv; cwd?: string } = {}): Promise<RunResult> {
  const r = await new Promise<RunResult>((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: [opts.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'], timeout: opts.timeoutMs ?? 60_000, killSignal: 'SIGKILL', ...(opts.env ? { env: opts.env } : {}), ...(opts.cwd ? { cwd: opts.cwd } : {}) });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout?.on('data', (d: Buffer) => out.push(d));
    child.stderr?.on('data', (d: Buffer) => err.push(d));
    child.on('error', (e) => reject(new ProtocolError('BACKEND_FAILED', `${cmd}: ${e.message}`, { cause: e })));
    child.on('close', (code, signal) => {
      resolve({ code: code ?? (signal ? 128 : 1), stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() });
    });
    if (opts.input !== undefined) child.stdin?.end(opts.input);
  });
  if (r.code !== 0 && !opts.allowFail) {
    const what = r.stderr.trim() || r.stdout.trim() || `exit ${r.code}`;
    throw new ProtocolError('BACKEND_FAILED', `${cmd} ${args.slice(0, 3).join(' ')}: ${what}`);
  }
  return r;
}
