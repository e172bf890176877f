/**
 * `paddock nats cluster`: a NATS cluster on this host for Paddock to join, in the foreground. Each
 * server has its own data directory and fixed loopback ports, so one that dies is started again
 * where its clients and peers look for it; nodes, the SDK and the CLI take the printed NATS_URL.
 */
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { DEFAULT_HOME } from '../../protocol/discovery.ts';
import { startNatsCluster } from '../nats.ts';
import { parseFlags } from './args.ts';
import { note, out, positiveNumber, UsageError } from './common.ts';

export const NATS_USAGE = `Usage: paddock nats cluster [--servers N] [--dir DIR]

  cluster                  run N nats-servers with JetStream (default 3), routed to each other
                           on loopback ports, each with its own data directory under DIR
                           (default $PADDOCK_HOME/nats-cluster); prints the NATS_URL to give
                           nodes, 'npm start', the SDK and the CLI, and writes it to DIR/nats.url.
                           A server that dies is started again on its ports; Ctrl-C stops all.
                           On three or more servers Paddock keeps its buckets and command log
                           in three replicas (PADDOCK_REPLICAS).
`;

/** A server that dies this often within a minute is not restarted again: the cluster stops. */
const RESTART_LIMIT = 5;

export async function natsCli(rest: string[]): Promise<number> {
  const usage = (m: string) => new UsageError(`nats: ${m}\n\n${NATS_USAGE}`);
  const { values, positionals } = parseFlags(rest, { servers: { type: 'string' }, dir: { type: 'string' }, help: { type: 'boolean', short: 'h' } }, usage);
  if (values.help || positionals[0] === 'help') {
    out(NATS_USAGE);
    return 0;
  }
  if (positionals[0] !== 'cluster' || positionals.length > 1) throw usage(positionals.length === 0 ? 'which command?' : `unknown command '${positionals.join(' ')}'`);
  const servers = positiveNumber('servers', values.servers, true) ?? 3;
  if (servers < 1 || servers > 9) throw usage(`--servers ${servers}: from 1 to 9`);
  const dir = values.dir ?? join(process.env.PADDOCK_HOME || DEFAULT_HOME, 'nats-cluster');
  await mkdir(dir, { recursive: true });
  note(`starting ${servers} nats-server${servers === 1 ? '' : 's'} (data and logs in ${dir})`);
  const cluster = await startNatsCluster({ dataDir: dir, servers, logDir: dir });
  const urlFile = join(dir, 'nats.url');
  await writeFile(urlFile, `${cluster.url}\n`);
  out(`NATS_URL=${cluster.url}`);
  note(`JetStream is ready; join it with: NATS_URL=${cluster.url} npm start`);

  let stopping = false;
  const deaths: number[] = [];
  let resolveDone: (code: number) => void = () => {};
  const done = new Promise<number>((r) => (resolveDone = r));
  const stop = async (code: number) => {
    if (stopping) return;
    stopping = true;
    note('stopping the NATS cluster');
    await cluster.stop();
    await rm(urlFile, { force: true });
    resolveDone(code);
  };
  const watch = (i: number) =>
    cluster.servers[i]?.proc.once('exit', (c, s) => {
      if (stopping) return;
      const now = Date.now();
      deaths.push(now);
      while (deaths.length > 0 && (deaths[0] as number) < now - 60_000) deaths.shift();
      if (deaths.length > RESTART_LIMIT) {
        note(`nats-server ${i} exited (${s ?? c}) the ${deaths.length}th time within a minute: stopping`);
        void stop(1);
        return;
      }
      note(`nats-server ${i} exited (${s ?? c}): starting it again on its ports (see ${join(dir, `nats-s${i}.log`)})`);
      void cluster.restart(i).then(
        () => {
          note(`nats-server ${i} is back`);
          watch(i);
        },
        (err: unknown) => {
          note(`nats-server ${i} could not be started again: ${(err as Error).message}`);
          void stop(1);
        },
      );
    });
  for (let i = 0; i < servers; i++) watch(i);
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => void stop(0));
  return done;
}
