/** `paddock up` as a person runs it, in a home of its own, for the fault cases. */
import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SHARED_IMAGES } from './paths.ts';
import { eventually } from './wait.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export interface UpRecord {
  pid: number;
  nats: string;
  natsPid?: number;
  nodePid?: number;
  node: string;
  http?: string;
  startedAt: number;
}

/**
 * Starts `paddock up` and waits for it; stopped (SIGTERM) by the teardown. `prepare` runs on the
 * home before up starts (a mount under it), `cleanup` after up has exited and before the home goes.
 */
export async function paddockUp(t: { teardown(fn: () => Promise<void>): void }, o: { prepare?: (home: string) => Promise<void>; cleanup?: (home: string) => Promise<void> } = {}) {
  const home = await mkdtemp(join(tmpdir(), 'paddock-faults-up-'));
  const env: NodeJS.ProcessEnv = { ...process.env, PADDOCK_HOME: home, PADDOCK_NODE_ID: `f${process.pid}up`, PADDOCK_FN_BUILD: '0', PADDOCK_IMAGES_DIR: SHARED_IMAGES, PADDOCK_HEARTBEAT_MS: '500' };
  delete env.NATS_URL;
  await o.prepare?.(home);
  const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'ops/cli/main.ts'), 'up'], { cwd: ROOT, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  let text = '';
  child.stdout?.on('data', (d: Buffer) => (text += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (text += d.toString()));
  const exited = new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
  t.teardown(async () => {
    if (child.exitCode === null && child.signalCode === null && child.pid) process.kill(child.pid, 'SIGTERM');
    await exited;
    await o.cleanup?.(home);
    await rm(home, { recursive: true, force: true });
  });
  const ready = await eventually(async () => text.includes('Paddock is up') || child.exitCode !== null, 300_000);
  if (!ready || !text.includes('Paddock is up')) throw new Error(`paddock up did not come up:\n${text}`);
  const record = () => JSON.parse(readFileSync(join(home, 'paddock.pid'), 'utf8')) as UpRecord;
  return { child, home, exited, record, out: () => text };
}
