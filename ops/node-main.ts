/**
 * The node process: its entry point. One node (ops/node-process.ts) with the process's
 * environment as its configuration, its logger, its telemetry and metrics, stopped in order on
 * SIGINT or SIGTERM.
 *
 * Run it through `nodeCommand()` (launch.ts); started any other way it relaunches itself there
 * and forwards signals.
 */
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { logsDir } from '../protocol/discovery.ts';
import { setStoreProbe } from '../protocol/index.ts';
import { loadConfig } from '../runtime/config.ts';
import { dropAllocatorEnv, NS_MARK, nodeCommand } from './launch.ts';
import { createLogger } from './log.ts';
import { metricsSpanProcessor } from './metrics.ts';
import { storeFullProbe } from './nats.ts';
import { NodeProcess } from './node-process.ts';
import { profileOnSignal, setupTelemetry, shutdownTelemetry } from './telemetry.ts';

/** Killing 3,200 sandboxes takes ~30 s here: a running node gets ten times that to stop. */
const STOP_DEADLINE_MS = 300_000;
/** A node still starting has few sandboxes, if any. */
const STOP_DEADLINE_STARTING_MS = 15_000;

async function main(): Promise<void> {
  if (process.env[NS_MARK] !== '1') {
    const { cmd, args, env } = nodeCommand();
    const child = spawn(cmd, args, { stdio: 'inherit', env: { ...process.env, ...env } });
    for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => child.kill(sig));
    child.on('exit', (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
    return;
  }
  dropAllocatorEnv();
  const cfg = loadConfig();
  const log = createLogger('paddock-node', cfg.logLevel).child({ node: cfg.nodeId });
  setupTelemetry('paddock-node', { tracesFile: join(logsDir(cfg.home), `traces-node-${cfg.nodeId}.jsonl`), instanceId: cfg.nodeId, processors: [metricsSpanProcessor()] });
  profileOnSignal(`node-${cfg.nodeId}`, log);
  // The embedded nats-server's store, when it shares this host (up, a local cluster): a JetStream
  // call that fails because its disk is full then says so.
  if (process.env.PADDOCK_NATS_STORE) setStoreProbe(storeFullProbe(process.env.PADDOCK_NATS_STORE));
  const node = new NodeProcess(cfg, log);
  let stopping = false;
  // An object, not a `let`: the stop handler reads it after start has set it.
  const phase: { started: boolean } = { started: false };
  const stop = async (sig: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ sig }, 'node stopping');
    // A stop that hangs (a start stuck in a syscall, NATS gone for good) must still end the
    // process: what it leaves, the next start of this node cleans up (recovery).
    const deadline = phase.started ? STOP_DEADLINE_MS : STOP_DEADLINE_STARTING_MS;
    setTimeout(() => {
      log.error({ sig, deadlineMs: deadline }, 'node stop did not finish in time: exiting');
      process.exit(1);
    }, deadline).unref();
    await node.stop().catch((err: unknown) => log.error({ err }, 'stop failed'));
    await shutdownTelemetry();
    log.info('node stopped');
    process.exit(0);
  };
  process.on('SIGINT', () => void stop('SIGINT'));
  process.on('SIGTERM', () => void stop('SIGTERM'));
  try {
    await node.start();
  } catch (err) {
    log.fatal({ err }, 'node failed to start');
    await node.stop().catch(() => {});
    process.exit(1);
  }
  phase.started = true;
  log.info({ capacity: node.capacity, backends: cfg.backends, nats: cfg.natsUrl }, 'node ready');
}

await main();
