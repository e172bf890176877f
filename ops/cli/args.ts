/** The `paddock` command line parsed: global flags, a command, its flags and its words. */
import { type ParseArgsConfig, parseArgs } from 'node:util';
import { UsageError } from './common.ts';

type Options = NonNullable<ParseArgsConfig['options']>;

export const GLOBAL = {
  nats: { type: 'string' },
  timeout: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} satisfies Options;

export const COMMANDS = {
  up: {},
  node: { migrate: { type: 'boolean' } },
  placement: {},
  status: { json: { type: 'boolean' } },
  down: {},
  logs: { follow: { type: 'boolean', short: 'f' }, lines: { type: 'string', short: 'n' }, json: { type: 'boolean' } },
  create: {
    image: { type: 'string' },
    backend: { type: 'string' },
    cpu: { type: 'string' },
    memory: { type: 'string' },
    ttl: { type: 'string' },
    label: { type: 'string', multiple: true },
    env: { type: 'string', multiple: true },
    group: { type: 'string' },
    json: { type: 'boolean' },
  },
  exec: {
    cwd: { type: 'string' },
    env: { type: 'string', multiple: true },
    stdin: { type: 'boolean' },
  },
  shell: {
    cwd: { type: 'string' },
    env: { type: 'string', multiple: true },
  },
  ps: {
    label: { type: 'string', multiple: true },
    group: { type: 'string' },
    all: { type: 'boolean' },
    json: { type: 'boolean' },
  },
  rm: {},
  info: { json: { type: 'boolean' } },
  files: { json: { type: 'boolean' } },
  chronus: {},
  bridge: { json: { type: 'boolean' } },
  help: {},
} satisfies Record<string, Options>;


export type Command = keyof typeof COMMANDS;

/** Every flag any command knows, so each command reads its values from one typed record. */
const ALL = { ...GLOBAL, ...COMMANDS.node, ...COMMANDS.create, ...COMMANDS.exec, ...COMMANDS.ps, ...COMMANDS.info, ...COMMANDS.logs } satisfies Options;
type Values = ReturnType<typeof parseArgs<{ options: typeof ALL; allowPositionals: true }>>['values'];

export interface Args {
  cmd: Command;
  values: Values;
  positionals: string[];
}

function isCommand(s: string): s is Command {
  return Object.hasOwn(COMMANDS, s);
}

/** Global flags may come before the command: the command is the first word no flag consumes. */
export function parse(argv: string[]): Args {
  let cmd: string | undefined;
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (cmd === undefined && a === '--') break;
    if (cmd === undefined && (a === '--nats' || a === '--timeout')) {
      rest.push(a);
      if (i + 1 < argv.length) rest.push(argv[++i] as string);
      continue;
    }
    if (cmd === undefined && !a.startsWith('-')) cmd = a;
    else rest.push(a);
  }
  if (cmd === undefined) {
    if (rest.includes('--help') || rest.includes('-h')) return { cmd: 'help', values: {}, positionals: [] };
    throw new UsageError('no command given', true);
  }
  if (!isCommand(cmd)) throw new UsageError(`unknown command '${cmd}'`, true);
  let parsed: { values: Values; positionals: string[] };
  try {
    parsed = parseArgs({ args: rest, options: { ...GLOBAL, ...COMMANDS[cmd] }, allowPositionals: true, strict: true }) as { values: Values; positionals: string[] };
  } catch (err) {
    // parseArgs explains how to pass a positional that starts with '-'; for exec that means '--'.
    const msg = (err as Error).message;
    const unknown = /^Unknown option '([^']+)'/.exec(msg)?.[1];
    const hint = cmd === 'exec' ? " (put the command after '--')" : '';
    throw new UsageError(`${cmd}: ${unknown ? `unknown option ${unknown}${hint}` : msg}`, true);
  }
  if (parsed.values.help) return { cmd: 'help', values: {}, positionals: [] };
  return { cmd, ...parsed };
}

export function positionals(a: Args, min: number, max: number, what: string): string[] {
  if (a.positionals.length < min || a.positionals.length > max) throw new UsageError(`usage: paddock ${what}`);
  return a.positionals;
}

/** A subcommand's own flags and words (`paddock fn …`, `paddock image …`); a bad flag is `usage(message)`. */
export function parseFlags<O extends Options>(args: string[], options: O, usage: (message: string) => Error): ReturnType<typeof parseArgs<{ args: string[]; allowPositionals: true; options: O }>> {
  try {
    return parseArgs({ args, allowPositionals: true, options });
  } catch (err) {
    throw usage((err as Error).message);
  }
}
