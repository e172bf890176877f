/**
 * `paddock sim`: a simulated fleet in the foreground (ops/sim-fleet.ts), joining a given NATS.
 * Up to --per-process nodes run in this process; more are split over child processes that run
 * `paddock sim` for their share, so one event loop does not carry the whole fleet. Ctrl-C stops
 * every node, each killing its sandboxes.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createLogger } from '../log.ts';
import { SIM_NODE_DEFAULTS, SimFleet } from '../sim-fleet.ts';
import { profileOnSignal, setupTelemetry, shutdownTelemetry } from '../telemetry.ts';
import type { GlobalFlags } from './common.ts';
import { parseFlags } from './args.ts';
import { note, out, positiveNumber, UsageError } from './common.ts';

export const SIM_USAGE = `Usage: paddock sim [--nodes N] [--per-process K] [--cpu C] [--memory-mib M]
                   [--sandboxes-per-node S] [--placement P] [--first I] [--nats URL]

  Runs N simulated node supervisors (default 160) against $NATS_URL (or --nats; a comma-separated
  list of a cluster's servers is fine) until Ctrl-C, then stops each, killing its sandboxes.
  Each node offers only the 'sim' backend: C virtual cores (default ${SIM_NODE_DEFAULTS.cpu}) and M MiB
  (default ${SIM_NODE_DEFAULTS.memoryMiB}, 1.5 TiB), times PADDOCK_CPU_OVERCOMMIT and PADDOCK_MEMORY_OVERCOMMIT,
  at most S sandboxes (default ${SIM_NODE_DEFAULTS.sandboxes}). Node ids are sim-<I>, sim-<I+1>, … (I default 0).
  K nodes (default 40) share one process; P of them (default 1) per process run a placement
  replica. PADDOCK_HOME, PADDOCK_IMAGES_DIR, PADDOCK_STORE_URL, PADDOCK_HEARTBEAT_MS,
  PADDOCK_LOG_LEVEL and PADDOCK_SIM_LATENCY_MS apply to every node.
`;

const DEFAULT_PER_PROCESS = 40;
/** Stopping kills every sandbox of every node of the process: tens of thousands take a while. */
const STOP_DEADLINE_MS = 300_000;

export async function simCli(g: GlobalFlags, rest: string[]): Promise<number> {
  const usage = (m: string) => new UsageError(`sim: ${m}\n\n${SIM_USAGE}`);
  const { values, positionals } = parseFlags(
    rest,
    {
      nodes: { type: 'string' },
      'per-process': { type: 'string' },
      cpu: { type: 'string' },
      'memory-mib': { type: 'string' },
      'sandboxes-per-node': { type: 'string' },
      placement: { type: 'string' },
      first: { type: 'string' },
      nats: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    usage,
  );
  if (values.help || positionals[0] === 'help') {
    out(SIM_USAGE);
    return 0;
  }
  if (positionals.length > 0) throw usage(`unexpected '${positionals.join(' ')}'`);
  const natsUrl = values.nats ?? g.nats ?? process.env.NATS_URL;
  if (!natsUrl) throw usage('a simulated fleet joins an existing NATS: set NATS_URL or pass --nats (paddock nats cluster starts one)');
  const nodes = positiveNumber('nodes', values.nodes, true) ?? 160;
  const perProcess = positiveNumber('per-process', values['per-process'], true) ?? DEFAULT_PER_PROCESS;
  const first = values.first === undefined || values.first === '0' ? 0 : (positiveNumber('first', values.first, true) as number);
  const placement = values.placement === '0' ? 0 : (positiveNumber('placement', values.placement, true) ?? 1);
  const shape = {
    cpu: positiveNumber('cpu', values.cpu) ?? SIM_NODE_DEFAULTS.cpu,
    memoryMiB: positiveNumber('memory-mib', values['memory-mib'], true) ?? SIM_NODE_DEFAULTS.memoryMiB,
    sandboxesPerNode: positiveNumber('sandboxes-per-node', values['sandboxes-per-node'], true) ?? SIM_NODE_DEFAULTS.sandboxes,
  };
  if (nodes > perProcess) return runChildren({ natsUrl, nodes, perProcess, first, placement, ...shape });

  const log = createLogger('paddock-sim').child({ fleet: `sim-${first}` });
  setupTelemetry('paddock-sim', { instanceId: `sim-${first}-${process.pid}` });
  profileOnSignal(`sim-${first}`, log);
  const fleet = new SimFleet({ natsUrl, nodes, first, placement, log, ...shape });
  let resolveDone: (code: number) => void = () => {};
  const done = new Promise<number>((r) => (resolveDone = r));
  let stopping = false;
  const stop = async (sig: string) => {
    if (stopping) return;
    stopping = true;
    note(`sim: ${sig}: stopping ${fleet.nodes.length} nodes (${fleet.sandboxes} sandboxes)`);
    setTimeout(() => {
      note(`sim: the nodes did not stop within ${STOP_DEADLINE_MS} ms: exiting`);
      process.exit(1);
    }, STOP_DEADLINE_MS).unref();
    await fleet.stop();
    await shutdownTelemetry();
    note('sim: stopped');
    resolveDone(0);
  };
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => void stop(sig));
  try {
    await fleet.start();
  } catch (err) {
    note(`sim: the fleet did not start: ${(err as Error).message}`);
    await fleet.stop();
    return 1;
  }
  const ids = fleet.ids;
  note(`sim: ${ids.length} node${ids.length === 1 ? '' : 's'} ready (${ids[0]}${ids.length > 1 ? ` … ${ids[ids.length - 1]}` : ''}), ${placement} placement replica(s), pid ${process.pid}`);
  return done;
}

/** The fleet split over child processes of `perProcess` nodes each; signals go to all of them. */
async function runChildren(o: { natsUrl: string; nodes: number; perProcess: number; first: number; placement: number; cpu: number; memoryMiB: number; sandboxesPerNode: number }): Promise<number> {
  const script = process.argv[1] as string;
  const children: ChildProcess[] = [];
  for (let at = 0; at < o.nodes; at += o.perProcess) {
    const k = Math.min(o.perProcess, o.nodes - at);
    const args = ['sim', '--nats', o.natsUrl, '--nodes', String(k), '--per-process', String(k), '--first', String(o.first + at), '--placement', String(o.placement), '--cpu', String(o.cpu), '--memory-mib', String(o.memoryMiB), '--sandboxes-per-node', String(o.sandboxesPerNode)];
    // pdeathsig: a child whose parent died (SIGKILL included) stops its nodes instead of running on.
    children.push(spawn('setpriv', ['--pdeathsig', 'TERM', '--', process.execPath, ...process.execArgv, script, ...args], { stdio: 'inherit' }));
  }
  note(`sim: ${o.nodes} nodes in ${children.length} processes of up to ${o.perProcess}`);
  let stopping = false;
  const stopAll = (sig: NodeJS.Signals) => {
    stopping = true;
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill(sig);
  };
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => stopAll(sig));
  const codes = await Promise.all(
    children.map(
      (c) =>
        new Promise<number>((r) =>
          c.on('exit', (code, signal) => {
            // A part of the fleet that ended on its own (it failed to start): the rest stop too.
            if (!stopping) stopAll('SIGTERM');
            r(code ?? (signal ? 1 : 0));
          }),
        ),
    ),
  );
  return codes.find((c) => c !== 0) ?? 0;
}
