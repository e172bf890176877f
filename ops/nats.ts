/**
 * The embedded nats-server: started with JetStream on a free loopback port when no NATS_URL is
 * given (npm start, tests, benchmarks). Debian's nats-server; the port comes from --ports_file_dir.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { rotatingLog } from './logfile.ts';

export interface EmbeddedNats {
  url: string;
  port: number;
  proc: ChildProcess;
  stop(): Promise<void>;
}

/** Exec results carry up to 1 MiB of stdout and of stderr in one reply: allow 8 MiB messages. */
export const MAX_PAYLOAD = 8 * 1024 * 1024;

/** `logFile`: nats-server's own log (rotated); without it only the last 4 KB are kept, for errors. */
export async function startNats(opts: { dataDir: string; port?: number; logFile?: string }): Promise<EmbeddedNats> {
  await mkdir(opts.dataDir, { recursive: true });
  const portsDir = join(opts.dataDir, 'ports');
  await mkdir(portsDir, { recursive: true });
  const conf = join(opts.dataDir, 'nats.conf');
  await writeFile(conf, `max_payload: ${MAX_PAYLOAD}\nmax_pending: ${4 * MAX_PAYLOAD}\n`);
  // Dies with whoever started it, even by SIGKILL (a killed test worker or `paddock up`): an
  // embedded nats-server has no one else to serve.
  // detached: a terminal's Ctrl-C goes to its whole process group; nats-server must outlive it
  // until the node has recorded its sandboxes' end, so only its starter stops it.
  const proc = spawn('setpriv', ['--pdeathsig', 'TERM', '--', 'nats-server', '-c', conf, '-a', '127.0.0.1', '-p', String(opts.port ?? -1), '-js', '-sd', join(opts.dataDir, 'jetstream'), '--ports_file_dir', portsDir], {
    stdio: ['ignore', 'ignore', 'pipe'],
    detached: true,
  });
  const log = opts.logFile ? rotatingLog(opts.logFile) : undefined;
  let stderr = '';
  proc.stderr?.on('data', (d: Buffer) => {
    log?.write(d);
    stderr = (stderr + d.toString()).slice(-4000);
  });
  proc.once('exit', () => log?.end());
  const exited = new Promise<number>((r) => proc.on('exit', (c) => r(c ?? 1)));
  // Seconds, not milliseconds, on a loaded machine: JetStream reads its store before it listens.
  const deadline = Date.now() + 30_000;
  try {
    for (;;) {
      if (proc.exitCode !== null) throw new Error(`nats-server exited: ${stderr.trim()}`);
      const file = (await readdir(portsDir).catch(() => [] as string[])).find((f) => f.includes(`_${proc.pid}.ports`));
      if (file) {
        // Read while nats-server may still be writing it: a half-written file is tried again. (It
        // once threw out of here and left the server running, holding a test worker open.)
        let ports: { nats?: string[] } = {};
        try {
          ports = JSON.parse(await readFile(join(portsDir, file), 'utf8'));
        } catch {}
        const url = ports.nats?.[0];
        if (url) {
          const port = Number(new URL(url).port);
          return {
            url: `nats://127.0.0.1:${port}`,
            port,
            proc,
            // Resolves once the process is gone (its port free for a restart on the same one).
            stop: async () => {
              if (proc.exitCode === null && proc.signalCode === null) {
                proc.kill('SIGTERM');
                await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
                if (proc.exitCode === null && proc.signalCode === null) {
                  proc.kill('SIGKILL');
                  await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
                }
              }
            },
          };
        }
      }
      if (Date.now() > deadline) {
        proc.kill('SIGKILL');
        throw new Error(`nats-server did not start: ${stderr.trim()}`);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
  } catch (e) {
    // Whatever went wrong while waiting, the server must not outlive the start that failed.
    if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
    throw e;
  }
}
