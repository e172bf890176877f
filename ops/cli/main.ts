/**
 * The `paddock` command line. This file parses the words and hands them to one module per group of
 * commands (sandboxes.ts, service.ts, images.ts, fn.ts, chronus.ts), each imported only when its
 * command runs: `paddock ps` should not load what `paddock image build` needs. Remote failures
 * arrive as PaddockError; the fault of their code picks the exit status (2: the caller's, 1: the
 * platform's).
 */
import { parseArgs } from 'node:util';
import { Limits } from '../../protocol/index.ts';
import { PaddockError } from '../../sdk/index.ts';
import { GLOBAL, parse } from './args.ts';
import { exitCodeOf, note, out, SIGPIPE_EXIT, UsageError } from './common.ts';

function usage(env: Record<string, string>): string {
  return `Usage: paddock [--nats URL] [--timeout MS] <command> [options]

Run Paddock on this host:
  up                       start an embedded nats-server (or join $NATS_URL) and one node;
                           Ctrl-C (or 'paddock down') stops both and kills their sandboxes
  status [--json]          NATS, nodes (capacity, load, images), placement replicas, FnCall
                           pools and images, where the logs are
  down                     stop what 'paddock up' / 'npm start' started, from any shell
  logs [node|nats] [-f] [-n LINES] [--json]
                           a node's log (or nats-server's); -f follows it
  node                     run one node in the foreground, joining $NATS_URL
  placement                run a placement replica on its own in the foreground, joining
                           $NATS_URL; SIGTERM drains it (calls under way finish)
  node drain|undrain <id>  cordon a node (placement skips it; its sandboxes run on), or undo it
  node drain --migrate <id>
                           cordon it and move its sandboxes created 'migratable' to other nodes
                           (files, spec and labels; their processes start afresh)
  nats cluster [--servers N] [--dir DIR]
                           run a NATS cluster of N servers (default 3) in the foreground for
                           nodes to join; prints its NATS_URL ('paddock nats help')
  sim [--nodes N] [--per-process K] [--cpu C] [--memory-mib M] [--sandboxes-per-node S]
                           run N simulated nodes (default 160, 'sim' backend only, ~190 cores
                           and 1.5 TiB each) against $NATS_URL in the foreground, K per process
                           ('paddock sim --help')
  bridge status [--json]   the bridge: its machines, their state and age, pending demand, the
                           last decisions and their reasons

Drive sandboxes:
  create [--image busybox] [--backend container] [--cpu N] [--memory MiB] [--ttl SEC]
         [--label k=v]... [--env K=V]... [--group G] [--json]
                           create a sandbox; prints its id (its record with --json)
  exec <id> [--timeout MS] [--cwd DIR] [--env K=V]... [--stdin] -- <cmd> [args...]
                           run a command, streaming its output; exits with its exit code.
                           --timeout kills the command after MS ms (default ${Limits.exec.timeoutMs.default});
                           --stdin sends this command's piped stdin to it
  shell <id> [--cwd DIR] [--env K=V]... [-- <cmd> [args...]]
                           a terminal in the sandbox (default: its shell, bash if it has one);
                           exits with the shell's exit code. With stdin not a terminal: runs
                           <cmd> (default sh) without one, stdin piped to it, stdout and stderr
                           apart
  ps [--label k=v]... [--group G] [--all] [--json]
                           list live sandboxes (--all: ended ones too)
  rm <id>...               kill sandboxes
  info <id> [--json]       show one sandbox
  files get <id> <path> [dest|-]   copy a file out of a sandbox (default: to stdout)
  files put <id> <src|-> <path>    copy a local file (- = stdin) into a sandbox
  files ls <id> <dir> [--json]     list a directory of a sandbox
  chronus export <rolloutId> [file|-]
                           write a rollout's trajectory (its command log) as JSONL, one line
                           per step (default: to stdout)
  image <build|push|pull|ls|rm|gc|serve|stats> ...
                           layer images and stores ('paddock image help')
  fn run <file> [--language L] [--time-limit MS] [--memory MiB] [--json] < input
                           run a program once on any node (FnCall) and print its output and
                           verdict; fn build: the images its languages need ('paddock fn help')
  help                     this text

Global options:
  --nats URL               NATS to talk to (default: $NATS_URL, else the URL \`paddock up\`
                           wrote to $PADDOCK_HOME/nats.url)
  --timeout MS             how long to wait for answers (for exec: the command's time limit)
  -h, --help               this text

Exit status: 0 on success; exec, shell: the command's exit code; 2 when the request was at fault
(bad arguments, unknown sandbox, invalid spec); 1 otherwise.

Environment (up, node):
${Object.entries(env)
  .map(([k, v]) => `  ${k.padEnd(26)} ${v}`)
  .join('\n')}
`;
}

async function usageText(): Promise<string> {
  const { ENV_DOC } = await import('../../runtime/config.ts');
  const { CHRONUS_ENV_DOC } = await import('../../chronus/config.ts');
  const { BRIDGE_ENV_DOC } = await import('../../bridge/config.ts');
  return usage({ ...ENV_DOC, ...CHRONUS_ENV_DOC, ...BRIDGE_ENV_DOC });
}

async function main(argv: string[]): Promise<number> {
  const i = argv.findIndex((w, k) => !w.startsWith('-') && argv[k - 1] !== '--nats' && argv[k - 1] !== '--timeout');
  if (argv[i] === 'nats') return (await import('./nats.ts')).natsCli(argv.slice(i + 1));
  if (argv[i] === 'sim') {
    const g = parseArgs({ args: argv.slice(0, i), options: GLOBAL, strict: true }).values;
    return (await import('./sim.ts')).simCli(g, argv.slice(i + 1));
  }
  if (argv[i] === 'image' || argv[i] === 'fn') {
    const g = parseArgs({ args: argv.slice(0, i), options: GLOBAL, strict: true }).values;
    const rest = argv.slice(i + 1);
    return argv[i] === 'image' ? (await import('./images.ts')).imageCli(g, rest) : (await import('./fn.ts')).fnCli(g, rest);
  }
  const a = parse(argv);
  switch (a.cmd) {
    case 'help':
      out(await usageText());
      return 0;
    case 'up':
      return (await import('./service.ts')).upCmd(a);
    case 'node':
      if (a.positionals.length > 0) return (await import('./bridge.ts')).nodeVerb(a);
      if (a.values.migrate) throw new UsageError('--migrate goes with `paddock node drain --migrate <node-id>`');
      return (await import('./service.ts')).nodeCmd(a);
    case 'bridge':
      return (await import('./bridge.ts')).bridgeCli(a);
    case 'placement':
      return (await import('./service.ts')).placementCmd(a);
    case 'status':
      return (await import('./service.ts')).status(a);
    case 'down':
      return (await import('./service.ts')).down(a);
    case 'logs':
      return (await import('./service.ts')).logs(a);
    case 'create':
      return (await import('./sandboxes.ts')).create(a);
    case 'exec':
      return (await import('./sandboxes.ts')).exec(a);
    case 'shell':
      return (await import('./shell.ts')).shell(a);
    case 'ps':
      return (await import('./sandboxes.ts')).ps(a);
    case 'rm':
      return (await import('./sandboxes.ts')).rmCmd(a);
    case 'info':
      return (await import('./sandboxes.ts')).info(a);
    case 'files':
      return (await import('./sandboxes.ts')).files(a);
    case 'chronus':
      return (await import('./chronus.ts')).chronusCli(a);
  }
}

// A reader that goes away early (`paddock files get … | head`) is no failure: the write that hit
// the closed pipe ends the command quietly, as 128 + SIGPIPE, instead of an unhandled 'error'.
for (const stream of [process.stdout, process.stderr]) stream.on('error', () => {});

/** Says what went wrong on stderr and picks the exit status. */
async function report(err: unknown): Promise<number> {
  if (err instanceof Error && (err as NodeJS.ErrnoException).code === 'EPIPE') return SIGPIPE_EXIT;
  if (err instanceof UsageError) {
    note(err.message);
    process.stderr.write(err.showUsage ? `\n${await usageText()}` : "Run 'paddock help' for usage.\n");
  } else if (err instanceof PaddockError) {
    note(`${err.code}: ${err.message}`);
  } else {
    note(err instanceof Error ? err.message : String(err));
  }
  return exitCodeOf(err);
}

let code: number;
try {
  code = await main(process.argv.slice(2));
} catch (err) {
  code = await report(err);
}
// Exit now rather than when the event loop empties: `up` and `logs -f` leave handlers and timers
// behind, and a finished command has nothing left to wait for once its output is flushed. Flushed
// first: writes to a pipe are asynchronous here (a reader slower than `exec … -- yes` left up to
// 12 KiB of the tail queued, and process.exit dropped it). A write's callback runs once what was
// queued before it is written, or with the error of a reader that went away.
await Promise.all([process.stdout, process.stderr].map((s) => (s.writableLength > 0 ? new Promise((r) => s.write('', r)) : undefined)));
process.exit(code);
